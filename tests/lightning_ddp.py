"""Lightning's ddp / ddp_spawn with BFO on 2 CPU processes: ``lightning_ddp.py STRATEGY OUT``.

Each rank saves its parameters after fitting to ``OUT.rank{r}.pt``; ``tests/test_lightning.py``
runs this script under a hard timeout and checks that the ranks agree.
"""

from __future__ import annotations

import sys
import warnings

import lightning as L
import torch
import torch.distributed as dist

import functional_bfo as fb
from functional_bfo.adapters import BFO
from functional_bfo.adapters.lightning import BFOCallback

BATCH = 8


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                                       torch.nn.Linear(4, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        # Each rank sees its own batches: average the candidates' losses across ranks.
        return BFO(self.parameters(), population_size=4, swim_length=1, module=self,
                   evaluator=fb.distributed.data_parallel(weight=BATCH))


class SaveParams(L.Callback):
    def __init__(self, out):
        self.out = out

    def on_train_end(self, trainer, pl_module):
        torch.save([p.detach().clone() for p in pl_module.parameters()],
                   f"{self.out}.rank{trainer.global_rank}.pt")


class EndProcessGroup(L.Callback):
    """Lightning destroys only NCCL groups; gloo threads can abort an exit that skips it."""

    def teardown(self, trainer, pl_module, stage):
        if dist.is_initialized():
            dist.destroy_process_group()


def main(strategy: str, out: str) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    y = x.sum(dim=1, keepdim=True) + torch.randn(64, 1, generator=g)  # ranks' batches differ
    data = torch.utils.data.TensorDataset(x, y)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=2,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False,
                        callbacks=[BFOCallback(), SaveParams(out), EndProcessGroup()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=BATCH))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])
