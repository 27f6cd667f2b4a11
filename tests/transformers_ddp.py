"""BFOTrainer on 2 gloo processes: ``torchrun --nproc-per-node=2 transformers_ddp.py OUT``.

Each rank trains on its own batches and saves its parameters to ``OUT.rank{r}.pt``;
``tests/test_transformers.py`` checks that the ranks agree.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torch.distributed as dist
from test_transformers import Data, Tiny, arguments

from functional_bfo.adapters.transformers import BFOTrainer

if __name__ == "__main__":
    torch.set_num_threads(1)
    out = sys.argv[1]
    model = Tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = BFOTrainer(model=model, args=arguments(out + "_run", max_steps=3,
                                                         ddp_backend="gloo"),
                             train_dataset=Data())
        trainer.train()
    torch.save([p.detach().clone() for p in model.parameters()],
               f"{out}.rank{os.environ['RANK']}.pt")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    # Skip the interpreter's teardown: gloo's threads can abort there ("terminate called
    # without an active exception") after the work is done and saved.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
