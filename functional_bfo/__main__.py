"""Demo: ``python -m functional_bfo`` (10-D Rastrigin by black_box and bfo, then a small MLP)."""

from __future__ import annotations

import math
import time

import torch
from torch import nn

import functional_bfo as fb


def rastrigin_demo(dim: int = 10, budget: int = 60_000) -> None:
    """Shifted Rastrigin: many local minima, global minimum 0 at ``shift``."""
    shift = torch.linspace(-2.0, 2.5, dim)

    def rastrigin(params: dict) -> torch.Tensor:
        z = params["x"] - shift
        return 10 * dim + (z.square() - 10 * torch.cos(2 * math.pi * z)).sum()

    start = {"x": torch.zeros(dim)}
    print(f"== Shifted Rastrigin, D={dim}, box [-5.12, 5.12], minimum 0 ==\n-- fb.black_box: the "
          f"setup for a black-box function (loss {rastrigin(start):.2f} at the start)")
    found = fb.black_box(rastrigin, start, (-5.12, 5.12), max_evals=budget, key=fb.random.key(0),
                         progress=True)
    print(f"black_box: loss {found.loss.item():.4g} in {found.num_evals} evaluations "
          f"({found.restarts} restarts); largest coordinate error "
          f"{(found.params['x'] - shift).abs().max().item():.2e}")

    print("-- canonical BFO (Passino 2002): the reference algorithm; its fixed steps find a "
          "basin fast and refine slowly")
    opt = fb.bfo(population_size=40, step_size=0.1, chemotaxis_steps=20, reproduction_steps=4,
                 elimination_prob=0.25, bounds=(-5.12, 5.12))
    state = fb.run(opt, opt.init(start, key=fb.random.key(0)), rastrigin, max_evals=budget,
                   progress=True, log_every=100)
    print(f"canonical BFO: loss {state.best_loss.item():.4g} in {state.num_evals.item()} "
          "evaluations; largest coordinate error "
          f"{(state.best_params['x'] - shift).abs().max().item():.3f}\n")


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

    def test_accuracy(p: dict) -> float:
        logits = torch.func.functional_call(model, p, (x_test,))
        return (logits.argmax(1) == y_test).float().mean().item()

    print(f"== MLP 2-16-2 on two moons ({sum(p.numel() for p in params.values())} parameters, "
          "512 training points) ==")
    opt = fb.bfo(population_size=32, step_size=0.05, chemotaxis_steps=10,
                 reproduction_steps=4, elimination_prob=0.1, init_scale=0.3)
    state = fb.run(opt, opt.init(params, key=fb.random.key(1)), loss_fn, x_train, y_train,
                   max_evals=80_000, progress=True, log_every=100)
    print(f"test accuracy {test_accuracy(params):.1%} -> {test_accuracy(state.best_params):.1%}; "
          f"cross-entropy {state.best_loss.item():.4f}\n")


def main() -> None:
    """Run both demos and report the wall time."""
    started = time.perf_counter()
    rastrigin_demo()
    mlp_demo()
    print(f"done in {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
