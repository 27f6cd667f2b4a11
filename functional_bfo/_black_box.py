"""The black-box setup: box-relative AdaptiveBFO with restarts, driven to an evaluation budget.

For a function of a box and nothing else (no gradients, no scale, no good start): a small
AdaptiveBFO swarm with steps measured in box widths, restarted from new uniform places
whenever its best has not improved by more than ``restart_rtol`` of itself for
``restart_after`` updates. Each choice was measured
against the peers in ``benchmarks/quality.py`` (see benchmarks/NOTES.md).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from . import random
from ._adaptive import adaptive_bfo
from ._base import Key, LossFn, Params
from ._bounds import resolve, sample_domain
from ._checks import check_float, check_int


class BlackBoxResult(NamedTuple):
    """What :func:`black_box` found."""

    params: Params  # the best point evaluated, like the initial params
    loss: Tensor  # () its loss
    num_evals: int  # loss evaluations spent (never more than max_evals)
    restarts: int  # swarms started after the first
    history: list[tuple[int, float]]  # (evaluations so far, best loss) after every update


def black_box(
    loss_fn: LossFn,
    params: Params,
    bounds: Any,
    *args: Any,
    max_evals: int,
    key: Key,
    population_size: int = 8,
    swim_length: int = 1,
    step_size_min: float = 1e-12,
    restart_after: int | None = 30,
    restart_rtol: float = 1e-2,
    **adaptive_kwargs: Any,
) -> BlackBoxResult:
    """Minimize ``loss_fn`` over the box ``bounds`` in at most ``max_evals`` evaluations.

    Runs :func:`functional_bfo.adaptive_bfo` with ``relative_steps=True`` (steps in units of
    each coordinate's box width), ``population_size`` bacteria and ``swim_length`` swim
    steps; the first swarm has ``params`` as bacterium 0 and the rest uniform in the box.
    When a swarm's best has not fallen by more than ``restart_rtol * |best|`` for
    ``restart_after`` updates (a swarm converged into a local minimum keeps improving by
    ever smaller amounts, which must not count as progress), a new swarm starts
    from a uniform random point of the box (and its own uniform population), with the key
    ``fold_in(key, 2 * restart)`` (its start point from ``fold_in(key, 2 * restart - 1)``);
    the best over all swarms is returned.

    Args:
        loss_fn: ``loss_fn(params, *args) -> 0-d tensor``, as for every optimizer here.
        params: the first swarm's bacterium 0; its structure, shapes and dtypes.
        bounds: the box, as for :func:`functional_bfo.bfo`; coordinates with an open side
            take absolute steps and restart around ``params``.
        *args: data passed to every ``loss_fn`` call.
        max_evals: the evaluation budget (each update costs
            ``population_size * (swim_length + 1)``).
        key: the random key; the same key gives the same result.
        population_size: bacteria per swarm.
        swim_length: ``N_s`` of each swarm.
        step_size_min: floor of the adapted step sizes, in box widths.
        restart_after: updates without progress that end a swarm; None never restarts.
        restart_rtol: the relative improvement an update needs to count as progress; 0
            counts every improvement.
        **adaptive_kwargs: further :func:`functional_bfo.adaptive_bfo` settings
            (``maximize``, ``evaluator``, ``adaptation_rate``, ...).

    Returns:
        A :class:`BlackBoxResult`.

    Raises:
        ValueError: no bounds, a bad budget or restart setting, or a bad AdaptiveBFO setting.

    Examples:
        >>> import torch, functional_bfo as fb
        >>> f = lambda p: (p["x"] - 0.3).square().sum()
        >>> out = fb.black_box(f, {"x": torch.zeros(3, dtype=torch.float64)}, (-1.0, 1.0),
        ...                    max_evals=6000, key=fb.random.key(0))
        >>> bool(out.loss < 1e-8), out.num_evals <= 6000
        (True, True)
    """
    if bounds is None:
        raise ValueError("black_box needs bounds=(low, high) (or a pytree of them): its steps "
                         "and restarts are relative to the box. Without a box use "
                         "fb.adaptive_bfo with fb.run.")
    budget = check_int("max_evals", max_evals, 1)
    stall_limit = None if restart_after is None else check_int("restart_after", restart_after, 1)
    rtol = check_float("restart_rtol", restart_rtol, 0.0)
    opt = adaptive_bfo(population_size, bounds=bounds, relative_steps=True,
                       swim_length=swim_length, step_size_min=step_size_min, **adaptive_kwargs)
    sign = -1.0 if adaptive_kwargs.get("maximize", False) else 1.0
    best_params, best_cost = params, math.inf
    evals, restarts, per_update = 0, 0, None
    history: list[tuple[int, float]] = []
    start = params
    while True:
        state = opt.init(start, key=random.fold_in(key, 2 * restarts))
        progress, stalled = math.inf, 0  # this swarm's best at its last progress; updates since
        while per_update is None or evals + per_update <= budget:
            new = opt.update(state, loss_fn, *args)
            per_update = int(new.num_evals - state.num_evals)
            evals, state = evals + per_update, new
            cost = sign * float(state.best_loss)
            if cost < best_cost:
                best_params, best_cost = state.best_params, cost
            history.append((evals, sign * best_cost))
            if cost < (progress - rtol * abs(progress) if math.isfinite(progress) else progress):
                progress, stalled = cost, 0
            else:
                stalled += 1
            if stall_limit is not None and stalled >= stall_limit:
                break
        else:  # the budget cannot pay for another update
            break
        restarts += 1
        start = _uniform_point(params, bounds, random.fold_in(key, 2 * restarts - 1))
    loss = torch.tensor(sign * best_cost, dtype=state.losses.dtype, device=state.losses.device)
    return BlackBoxResult(best_params, loss, evals, restarts, history)


def _uniform_point(params: Params, bounds: Any, key: Key) -> Params:
    """A point uniform in the box (``params`` itself on coordinates with an open side)."""
    leaves, spec = optree.tree_flatten(params)
    dtype = torch.promote_types(leaves[0].dtype, torch.float32)
    box = resolve(bounds, params, dtype)
    z = optree.tree_leaves(random.tree_normal_like(key, params, dtype))
    scale = torch.zeros((), dtype=dtype)
    return spec.unflatten([sample_domain(x.to(dtype), zi, b, scale.to(x.device)).to(x.dtype)
                           for x, zi, b in zip(leaves, z, box)])
