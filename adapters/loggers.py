"""Step hooks that log a swarm to TensorBoard, Weights & Biases or a CSV file.

Each function returns a hook for torch's ``Optimizer.register_step_post_hook``, so logging
needs no subclass and runs after every ``step``, closure or fast path:

.. code-block:: python

    opt.register_step_post_hook(loggers.tensorboard(SummaryWriter("runs/bfo")))
    opt.register_step_post_hook(loggers.wandb())          # the active wandb run
    opt.register_step_post_hook(loggers.csv("bfo.csv"))

After every ``step()`` call that stepped (not one where every group was paused), each
logs ``best_fitness``, ``num_evals`` and each param group's ``diversity`` and
``step_length_mean`` (its mean step size in use; NaN before the group's first step), under
``prefix``; TensorBoard also gets a histogram of the population every ``histogram_every``
of them.
"""

from __future__ import annotations

import csv as _csv
import math
import os
from collections.abc import Callable
from typing import Any

from ._base import SwarmOptimizer

__all__ = ["csv", "tensorboard", "telemetry", "wandb"]

Hook = Callable[[Any, tuple, dict], None]


def telemetry(opt: SwarmOptimizer, prefix: str = "BFO") -> dict[str, float]:
    """What the hooks log after a step, as ``{prefix/name: float}`` (empty before one)."""
    if opt.best_fitness is None:
        return {}
    out = {f"{prefix}/best_fitness": float(opt.best_fitness),
           f"{prefix}/num_evals": float(opt.num_evals)}
    stepped = opt.stepped_groups
    for g in range(len(opt.param_groups)):
        m = opt.metrics(g) if g in stepped else {}
        suffix = f"_group{g}" if g else ""
        for name in ("diversity", "step_length_mean"):
            out[f"{prefix}/{name}{suffix}"] = m.get(name, math.nan)
    return out


def tensorboard(writer: Any, *, prefix: str = "BFO", histogram_every: int = 100) -> Hook:
    """Scalars to a ``torch.utils.tensorboard.SummaryWriter``, and the population's histogram.

    Examples:
        >>> from functional_bfo.adapters import loggers
        >>> hook = loggers.tensorboard(writer=None)  # writer: a SummaryWriter
    """
    _check_every(histogram_every)
    steps = [0]

    def hook(opt: SwarmOptimizer, args: tuple, kwargs: dict) -> None:
        values = telemetry(opt, prefix)
        if not values:
            return
        for name, value in values.items():
            writer.add_scalar(name, value, steps[0])
        if steps[0] % histogram_every == 0:
            writer.add_histogram(f"{prefix}/population", opt.population.flatten(), steps[0])
        steps[0] += 1

    return hook


def wandb(run: Any = None, *, prefix: str = "BFO") -> Hook:
    """``run.log`` (the active ``wandb`` run if None) of the telemetry after every step."""

    def hook(opt: SwarmOptimizer, args: tuple, kwargs: dict) -> None:
        target = run
        if target is None:
            import wandb as wb

            target = wb.run
            if target is None:
                raise RuntimeError("loggers.wandb() logs to the active run: call wandb.init() "
                                   "first, or pass run=.")
        values = telemetry(opt, prefix)
        if values:
            target.log(values)

    return hook


def csv(path: str | os.PathLike, *, prefix: str = "BFO") -> Hook:
    """A row per step appended to ``path`` (a header first when it starts the file)."""
    steps = [0]

    def hook(opt: SwarmOptimizer, args: tuple, kwargs: dict) -> None:
        values = telemetry(opt, prefix)
        if not values:
            return
        row = {"step": steps[0], **values}
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        with open(path, "a", newline="") as f:
            writer = _csv.DictWriter(f, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow(row)
        steps[0] += 1

    return hook


def _check_every(every: int) -> None:
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"Invalid histogram_every: {every!r}; expected a positive int.")
