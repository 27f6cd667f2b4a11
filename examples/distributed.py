"""HybridBFO on the digits data set, its population sharded across processes.

    torchrun --standalone --nproc-per-node=2 examples/distributed.py   # 2 processes
    python examples/distributed.py                                     # 1: the same run
    (--steps N: updates, default 60)

Every rank holds the same swarm (the same key), scores its share of the 16 bacteria with
``fb.distributed.sharded`` and receives the others' losses and gradients, so any number of
processes prints the same numbers as one. gloo on CPU, NCCL when each rank has a GPU.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn

import functional_bfo as fb


def main(steps: int = 60) -> float:
    launched = "RANK" in os.environ  # by torchrun
    device = torch.device("cpu")
    if launched:
        cuda = torch.cuda.is_available()
        dist.init_process_group("nccl" if cuda else "gloo",
                                timeout=datetime.timedelta(minutes=2))  # not torch's 30
        if cuda:
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
    rank, world = (dist.get_rank(), dist.get_world_size()) if launched else (0, 1)

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32, device=device) / 16.0
    y = torch.tensor(digits.target, device=device)
    torch.manual_seed(0)  # the same start on every rank
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10)).to(device)
    params, loss_fn = fb.module_loss(model, nn.functional.cross_entropy)

    opt = fb.hybrid_bfo(population_size=16, gradient_weight=0.7, grad_mask=True,
                        step_size=0.5, step_size_max=5.0, init_scale=0.1,
                        evaluator=fb.distributed.sharded(grads=True) if launched else None)
    state = opt.init(params, key=fb.random.key(0).to(device))
    for step in range(steps):
        state = opt.update(state, loss_fn, x, y)
        if rank == 0 and (step % 10 == 0 or step == steps - 1):
            print(f"step {step:3d}  evaluations {int(state.num_evals):5d}  "
                  f"best loss {float(state.best_loss):.4f}  ({world} process"
                  f"{'es' if world > 1 else ''})")
    logits = torch.func.functional_call(model, state.best_params, (x,))
    accuracy = float((logits.argmax(dim=1) == y).float().mean())
    if rank == 0:
        print(f"training accuracy {accuracy:.1%}")
    if launched:
        dist.barrier()  # no rank tears its connections down while another still uses them
        dist.destroy_process_group()
    return float(state.best_loss)


if __name__ == "__main__":
    import argparse

    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--steps", type=int, default=60)
    main(cli.parse_args().steps)
