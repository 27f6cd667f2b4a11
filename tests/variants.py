"""The registry of optimizer variants that every contract test runs over (later variants join)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import functional_bfo as fb

CANONICAL_CONVERGE = dict(population_size=20, chemotaxis_steps=20, reproduction_steps=4,
                          elimination_prob=0.1, step_size=0.05)


@dataclass(frozen=True)
class Variant:
    name: str
    factory: Callable
    kwargs: dict  # small and fast, for the contract tests
    converge: dict  # settings for the convergence tests (bounds are added per problem)
    flags: dict = field(default_factory=dict)  # e.g. uses_gradients=True

    def make(self, **overrides):
        return self.factory(**{**self.kwargs, **overrides})


VARIANTS = [
    Variant("bfo", fb.bfo, dict(population_size=12, chemotaxis_steps=3, reproduction_steps=2,
                                elimination_prob=0.5, step_size=0.2), CANONICAL_CONVERGE),
    Variant("bfo_levy_swarming_bounded", fb.bfo,
            dict(population_size=9, chemotaxis_steps=2, reproduction_steps=2, tumble="levy",
                 swarming=True, bounds=(-3.0, 3.0), boundary="reflect", step_size=0.2),
            CANONICAL_CONVERGE),
    Variant("adaptive_bfo", fb.adaptive_bfo,
            dict(population_size=10, chemotaxis_steps=3, elimination_prob=0.3,
                 elimination_prob_max=0.9, stagnation_steps=2, step_size=0.2),
            dict(population_size=20)),
    Variant("adaptive_bfo_varying_population", fb.adaptive_bfo,
            dict(population_size=12, min_population_size=4, chemotaxis_steps=2,
                 stagnation_steps=2, step_size=0.2),
            dict(population_size=24, min_population_size=8)),
    Variant("adaptive_bfo_learned_metric", fb.adaptive_bfo,
            dict(population_size=10, chemotaxis_steps=3, step_size=0.2, metric_rate=2.0,
                 bounds=(-3.0, 3.0), relative_steps=True),
            dict(population_size=20, metric_rate=2.0),
            # torch rounds a small matmul batched (vmap) and alone differently in the last bit
            flags=dict(vmap_rounds_matmul=True)),
    Variant("hybrid_bfo", fb.hybrid_bfo,
            dict(population_size=8, chemotaxis_steps=3, elimination_prob=0.3, step_size=0.2,
                 gradient_weight=0.7, momentum=0.5, grad_mask=True),
            dict(population_size=20, gradient_weight=0.5, grad_mask=True),
            flags=dict(uses_gradients=True)),
]


def params(dtype=torch.float32):
    """The params every variant suite starts from: a pytree of three leaves, one 0-d."""
    return {"w": torch.zeros(3, dtype=dtype), "b": (torch.zeros(2, 2, dtype=dtype),
                                                    torch.zeros((), dtype=dtype))}


def loss_fn(p):
    return ((p["w"] - 0.5).square().sum() + (p["b"][0] + 0.25).square().sum()
            + (p["b"][1] - 1.0).square())


def run_updates(opt, state, n, fn=loss_fn):
    for _ in range(n):
        state = opt.update(state, fn)
    return state
