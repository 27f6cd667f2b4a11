"""HybridBFO when some parameters take gradients and others cannot.

An MLP's weights take gradients; a decision threshold applied after rounding does not
(``requires_grad=False``: the rounding has no useful gradient). The closure calls
``backward`` as usual; HybridBFO steers the weights along their gradients and searches the
threshold by pure BFO, in one population.

    python examples/adapter_hybrid.py
"""

import argparse

import torch
from torch import nn

from functional_bfo.adapters import HybridBFO


def main(steps: int = 40) -> float:
    torch.manual_seed(0)
    x = torch.randn(512, 4)
    y = ((x ** 2).sum(dim=1) > 4.0).float()  # inside vs outside a sphere
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    threshold = nn.Parameter(torch.zeros(()), requires_grad=False)  # gradient-free
    params = list(model.parameters()) + [threshold]
    optimizer = HybridBFO(params, population_size=16, gradient_weight=0.9, lr=0.2,
                          seed=0)  # the default ceiling of 1.0 overshoots on MLP weights
    criterion = nn.BCEWithLogitsLoss()

    def closure():
        optimizer.zero_grad()
        logits = model(x).squeeze(1)
        loss = criterion(logits, y)
        loss.backward()  # reaches the weights; the threshold has no gradient
        decided = (torch.round(torch.sigmoid(logits) * 10) / 10 > threshold.sigmoid()).float()
        return loss.item() + 0.5 * (decided != y).float().mean().item()

    for step in range(steps):
        loss = optimizer.step(closure)
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {loss:.4f}  threshold {threshold.sigmoid().item():.3f}")
    return loss


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    main(parser.parse_args().steps)
