"""Demo: ``python -m functional_bfo`` (10-D Rastrigin by black_box and bfo, then a small MLP)."""

from __future__ import annotations

import math
import time

import torch
from torch import nn

import functional_bfo as fb


def rastrigin_demo() -> None:
    """Shifted Rastrigin in 10-D: many local minima, global minimum 0 at ``shift``."""
    dim = 10
    shift = torch.linspace(-2.0, 2.5, dim)

    def rastrigin(params: dict) -> torch.Tensor:
        z = params["x"] - shift
        return 10 * dim + (z.square() - 10 * torch.cos(2 * math.pi * z)).sum()

    print(f"== Shifted Rastrigin, D={dim}, box [-5.12, 5.12], minimum 0 ==")
    start = {"x": torch.zeros(dim)}
    budget = 60_000
    print(f"-- fb.black_box: the setup for a black-box function (loss {rastrigin(start):.2f} "
          "at the start)")
    found = fb.black_box(rastrigin, start, (-5.12, 5.12), max_evals=budget, key=fb.random.key(0),
                         progress=True)
    error = (found.params["x"] - shift).abs().max().item()
    print(f"black_box: loss {found.loss.item():.4g} in {found.num_evals} evaluations "
          f"({found.restarts} restarts); largest coordinate error {error:.2e}")

    print("-- canonical BFO (Passino 2002): the reference algorithm; its fixed steps find a "
          "basin fast and refine slowly")
    opt = fb.bfo(population_size=40, step_size=0.1, chemotaxis_steps=20, reproduction_steps=4,
                 elimination_prob=0.25, bounds=(-5.12, 5.12))
    state = opt.init(start, key=fb.random.key(0))
    state = fb.run(opt, state, rastrigin, max_evals=budget, progress=True, log_every=100)
    error = (state.best_params["x"] - shift).abs().max().item()
    print(f"canonical BFO: loss {state.best_loss.item():.4g} in {state.num_evals.item()} "
          f"evaluations; largest coordinate error {error:.3f}\n")


def two_moons(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The classic two interleaving half circles, with noise, made here (no download)."""
    angle = torch.rand(n, generator=generator) * math.pi
    label = torch.randint(0, 2, (n,), generator=generator)
    x = torch.stack([torch.cos(angle), torch.sin(angle)], dim=1)
    x = torch.where(label[:, None] == 1, torch.stack([1 - x[:, 0], 0.5 - x[:, 1]], 1), x)
    return x + 0.1 * torch.randn(n, 2, generator=generator), label


def mlp_demo() -> None:
    """A 2-16-2 MLP classifier trained by BFO alone, its loss built with module_loss."""
    generator = torch.Generator().manual_seed(0)
    x_train, y_train = two_moons(512, generator)
    x_test, y_test = two_moons(512, generator)
    with torch.random.fork_rng():  # the same initial weights every run, global RNG untouched
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2))
    params, loss_fn = fb.module_loss(model, nn.functional.cross_entropy)
    size = sum(p.numel() for p in params.values())

    def accuracy(p: dict, x: torch.Tensor, y: torch.Tensor) -> float:
        logits = torch.func.functional_call(model, p, (x,))
        return (logits.argmax(1) == y).float().mean().item()

    print(f"== MLP 2-16-2 on two moons ({size} parameters, 512 training points) ==")
    opt = fb.bfo(population_size=32, step_size=0.05, chemotaxis_steps=10,
                 reproduction_steps=4, elimination_prob=0.1, init_scale=0.3)
    state = opt.init(params, key=fb.random.key(1))
    before = accuracy(params, x_test, y_test)
    state = fb.run(opt, state, loss_fn, x_train, y_train, max_evals=80_000, progress=True,
                   log_every=100)
    after = accuracy(state.best_params, x_test, y_test)
    print(f"test accuracy {before:.1%} -> {after:.1%}; "
          f"cross-entropy {state.best_loss.item():.4f}\n")


def main() -> None:
    """Run both demos and report the wall time."""
    started = time.perf_counter()
    rastrigin_demo()
    mlp_demo()
    print(f"done in {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
