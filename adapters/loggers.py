"""Step hooks that log a swarm to TensorBoard, Weights & Biases or a CSV file.

Each function returns a hook for torch's ``Optimizer.register_step_post_hook``, so logging
needs no subclass and runs after every ``step``, closure or fast path:

.. code-block:: python

    opt.register_step_post_hook(loggers.tensorboard(SummaryWriter("runs/bfo")))
    opt.register_step_post_hook(loggers.wandb())          # the active wandb run
    opt.register_step_post_hook(loggers.csv("bfo.csv"))

After every ``step()`` call that stepped (not one that evaluated nothing: every group
paused at ``lr=0``, or ``should_stop`` already set), each logs ``best_fitness``,
``num_evals`` and each param group's ``diversity`` and ``step_length_mean`` (its mean step
size in use; NaN before the group's first step), under ``prefix``, at the run's step
(``num_steps - 1``: a resumed run continues its own); TensorBoard also gets a histogram of
every bacterium's parameters, all groups (of any population sizes), every
``histogram_every`` of them.
"""

from __future__ import annotations

import csv as _csv
import math
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .optimizers import SwarmOptimizer

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

    def hook(opt: SwarmOptimizer, args: tuple, kwargs: dict) -> None:
        values = _step_values(opt, prefix)
        if not values:
            return
        step = opt.num_steps - 1  # the run's, so a resumed run's rows continue its own
        population = _population(opt) if step % histogram_every == 0 else None
        for name, value in values.items():
            writer.add_scalar(name, value, step)
        if population is not None:
            writer.add_histogram(f"{prefix}/population", population, step)

    return hook


def wandb(run: Any = None, *, prefix: str = "BFO") -> Hook:
    """``run.log`` (the run active at each step if None) of the telemetry after every step.

    With ``run=None`` the run may start after the hook is made (Lightning's ``WandbLogger``
    starts it after ``configure_optimizers``); a step with no active run is not logged,
    with a warning, since the hook runs after the step was applied and must not fail it.

    Raises:
        ImportError: ``run`` is None and wandb is not installed.
    """
    if run is None:
        _wandb()

    def hook(opt: SwarmOptimizer, args: tuple, kwargs: dict) -> None:
        values = _step_values(opt, prefix)
        if not values:
            return
        target = run if run is not None else _wandb().run
        if target is None:
            warnings.warn("loggers.wandb(): no wandb run is active, so this step is not "
                          "logged; call wandb.init(), or pass run=.", RuntimeWarning,
                          stacklevel=2)
            return
        target.log(values)

    return hook


def csv(path: str | os.PathLike, *, prefix: str = "BFO") -> Hook:
    """A row per step appended to ``path`` under its header (written first if it is new).

    The file's columns stay: a value without one (a group added later, a file of another
    run) is left out, with one warning naming it.
    """
    warned = [False]

    def hook(opt: SwarmOptimizer, args: tuple, kwargs: dict) -> None:
        values = _step_values(opt, prefix)
        if not values:
            return
        row = {"step": opt.num_steps - 1, **values}  # the run's step (see tensorboard)
        with open(path, "a+", newline="") as f:
            f.seek(0)
            header = next(_csv.reader(f), None)
            writer = _csv.DictWriter(f, fieldnames=header or list(row), extrasaction="ignore")
            if header is None:
                writer.writeheader()
            elif (left_out := [k for k in row if k not in header]) and not warned[0]:
                warned[0] = True
                warnings.warn(f"loggers.csv: {path} has no column for {left_out}, so they are "
                              "not logged; log to a new file to keep them.", RuntimeWarning,
                              stacklevel=2)
            writer.writerow(row)

    return hook


def _check_every(every: int) -> None:
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"Invalid histogram_every: {every!r}; expected a positive int.")


def _step_values(opt: SwarmOptimizer, prefix: str) -> dict[str, float]:
    """:func:`telemetry` after a ``step()`` that evaluated something, else nothing to log."""
    return telemetry(opt, prefix) if opt.last_step_evals else {}


def _population(opt: SwarmOptimizer) -> torch.Tensor:
    """Every bacterium's parameters, all groups, flat.

    Unlike ``opt.population`` (a row per bacterium), it takes groups of different
    population sizes.
    """
    swarms = [opt.state[opt.param_groups[g]["params"][0]]["swarm"] for g in opt.stepped_groups]
    return torch.cat([s.population.flatten() for s in swarms])  # float64 if any group is


def _wandb() -> Any:
    """The ``wandb`` module, or an error that says how to install it."""
    try:
        import wandb as wb
    except ImportError as e:
        raise ImportError("loggers.wandb() needs wandb: pip install 'functional-bfo[loggers]', "
                          "or pass run=.") from e
    return wb
