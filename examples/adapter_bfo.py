"""BFO in an ordinary training loop, on a loss no gradient can follow.

A linear classifier is trained on the 0/1 error rate (a step function: its gradient is zero
almost everywhere), with torch.optim's usual closure. BFO needs only loss values.

    python examples/adapter_bfo.py
"""

import argparse

import torch
from torch import nn

from functional_bfo.adapters import BFO


def main(steps: int = 60) -> float:
    torch.manual_seed(0)
    x = torch.randn(512, 2)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0.3).long()  # a linearly separable rule
    model = nn.Linear(2, 2)
    optimizer = BFO(model.parameters(), population_size=24, lr=0.2, seed=0)

    def closure():
        with torch.no_grad():
            return (model(x).argmax(dim=1) != y).float().mean().item()  # 0/1 error

    for step in range(steps):
        error = optimizer.step(closure)
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step:3d}  error rate {error:.3f}  evaluations {optimizer.num_evals}")
    return error


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    main(parser.parse_args().steps)
