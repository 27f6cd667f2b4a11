"""The black-box setup: box-relative AdaptiveBFO swarms with restarts, driven to a budget.

For a function of a box and nothing else (no gradients, no scale, no good start), two kinds
of swarm share the budget:

- converging swarms: a small AdaptiveBFO swarm with steps measured in box widths (every
  other one with a tumble metric learned from its own successful tumbles, ``_metric.py``),
  restarted from a new uniform place whenever its best stops improving by more than
  ``restart_rtol`` of itself; they find precise minima, one basin at a time;
- an exploring swarm, started once ``explore_after`` converging swarms in a row have ended
  without beating the best: the same swarm, but every ``JITTER_PERIOD`` updates each
  bacterium is kicked and keeps the kick (population basin hopping, the mechanism behind
  pymetaheuristic's BFO on Rastrigin): half by ``N(0, jitter)`` box widths per coordinate,
  half by one coordinate redrawn in the box. It rides a global structure (Ackley's funnel
  at D = 30) that restarts only sample, and switches a separable function's coordinates
  between their basins one at a time (Styblinski-Tang, Schwefel).

The last ``polish`` share of the budget refines the best point found, so that the explorer's
kicks and a converging swarm ended before it fitted its basin do not cost the precision. It
starts by trying the best point with its coordinates near a face of the box moved onto the
face, so that an optimum on the boundary is found exactly.

Each choice was measured against the peers in ``benchmarks/quality.py`` (benchmarks/NOTES.md).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from . import random
from ._adaptive import AdaptiveBFOState, adaptive_bfo, adaptive_static, adaptive_step
from ._base import Key, LossFn, Params
from ._bounds import LeafBounds, box_relative, project, resolve, sample_domain
from ._checks import check_float, check_int, check_params
from ._chemotaxis import costs_by
from ._metric import (
    MAX_METRIC_SIZE,
    TumbleMetric,
    flat_rows,
    isotropic,
    learn,
    shape_directions,
    widths,
)
from ._run import _reporter
from ._stopping import Stopping
from ._tree import numel, rows, take, unflatten_like
from .evaluate import check_evaluator

JITTER_PERIOD = 10  # updates between the exploring swarm's kicks
# A swarm that holds the best waits this many times restart_after before a restart: its
# progress is measured against its own descent, which ends ill-conditioned swarms early
# (offsets on, D = 10, BBOB f10 ellipsoid: 828 at 1, 337 at 3; Rastrigin-10 19.9 at both).
HOLDING_PATIENCE = 3
CONVERGING_SHARE = 0.1  # of the updates after the hand-over, kept by the converging swarms
EXPLORER_STREAM = 2**31 - 1  # fold_in data of the exploring swarm's key (restarts use 0, 1, ...)
POLISHER_STREAM = 2**31 - 2  # and of the polishing swarm's
# Distances to a face (in box widths) within which the last evaluations move the best point's
# coordinates onto the face: one candidate each, from a third of the box down to 1e-8.5.
SNAP_WIDTHS = tuple(10 ** (-k / 2) for k in range(1, 18))
FACE_SCAN_SIZE = 2000  # most coordinates moved onto their faces one at a time (2n rows of n)
FACE_SHARE = 0.1  # of the polish evaluations, the most the face moves may spend


class BlackBoxResult(NamedTuple):
    """What :func:`black_box` found."""

    params: Params  # the best point evaluated, like the initial params
    loss: Tensor  # () its loss
    num_evals: int  # loss evaluations spent (never more than max_evals)
    restarts: int  # converging swarms started after the first
    explorer_updates: int  # updates given to the exploring swarm (0: it never started)
    history: list[tuple[int, float]]  # (evaluations so far, best loss) after every update
    # and after the face moves


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
    metric_rate: float = 2.0,
    explore_after: int | None = 2,
    jitter: float = 0.01,
    polish: float = 0.1,
    progress: bool = False,
    **adaptive_kwargs: Any,
) -> BlackBoxResult:
    """Minimize ``loss_fn`` over the box ``bounds`` in at most ``max_evals`` evaluations.

    Converging swarms run :func:`functional_bfo.adaptive_bfo` with ``relative_steps=True``
    (steps in units of each coordinate's box width), ``population_size`` bacteria and
    ``swim_length`` swim steps; the first has ``params`` as bacterium 0 and the rest uniform
    in the box. The tumbles of the first swarm, and of every other one after it, follow a
    metric learned from that swarm's successful tumbles, which turns a narrow rotated
    valley into a round one; the swarms between tumble isotropically, because a learned
    metric makes a swarm less likely to find a funnel like Ackley's. When a swarm's best
    has not gained, for ``restart_after`` updates, more than ``restart_rtol`` of the way
    still to the best of the swarms before it (a swarm converged into a worse local minimum
    keeps improving by ever smaller amounts, which must not count as progress), or, while
    it holds the best, for ``3 * restart_after`` updates more than ``restart_rtol`` of its
    own descent so far, a new swarm starts from a
    uniform random point of the box, with the key ``fold_in(key, 2 * restart)`` (its start
    point from ``fold_in(key, 2 * restart - 1)``).

    Once ``explore_after`` swarms in a row have ended without beating the best so far (the
    restarts only keep sampling local minima), an exploring swarm starts at ``params``
    (key ``fold_in(key, 2**31 - 1)``) and takes all but ``1/10`` of the remaining updates:
    every 10 updates each of its bacteria moves and keeps that move, so it hops basins along
    the function's global structure: half of them by ``jitter`` box widths times a standard
    normal per coordinate, the other half by one coordinate redrawn uniformly in the box
    (a separable function's basins are switched one coordinate at a time).

    The last ``polish`` of the budget refines the best point. It first tries the best
    point on the box's faces, in three evaluator calls within a tenth of the polish
    budget: every coordinate within ``w`` box widths of a face moved onto that face, for
    ``w`` from 10^-0.5 down to 10^-8.5 in half decades; then each coordinate alone on each
    of its two faces (up to 2000 coordinates); then every single move that helped,
    together (an optimum on the boundary is then found exactly). Then the swarm that
    found the best goes on if it still runs and holds it, else a swarm started there (key
    ``fold_in(key, 2**31 - 2)``, all bacteria at the best point, steps of ``jitter`` box
    widths) takes the rest. The best point over all swarms is returned.

    Args:
        loss_fn: ``loss_fn(params, *args) -> 0-d tensor``, as for every optimizer here.
        params: the first swarm's bacterium 0; its structure, shapes and dtypes.
        bounds: the box, as for :func:`functional_bfo.bfo`; coordinates with an open side
            take absolute steps and restart around ``params``.
        *args: data passed to every ``loss_fn`` call.
        max_evals: the evaluation budget, at least one update
            (``population_size * (swim_length + 1)`` evaluations).
        key: the random key; the same key gives the same result.
        population_size: bacteria per swarm.
        swim_length: ``N_s`` of each swarm.
        step_size_min: floor of the adapted step sizes, in box widths.
        restart_after: updates without progress that end a converging swarm; None never
            restarts (and so never explores).
        restart_rtol: the share of the way to the best of the swarms before (or of its
            own descent, while it holds the best) that a swarm must gain to count as
            progressing; 0 counts every improvement. Every decision
            compares losses with each other (and losses are compared in float64), so
            ``f``, ``f + c`` and ``a * f`` (``a > 0``) give the same run.
        metric_rate: how fast the tumble metric learns (``rate * successes / (n^2 + 12)``
            per update for ``n`` parameters); 0 tumbles isotropically. The metric costs
            ``n^2`` memory and ``n^3`` time per update, so it needs ``n <= 2000``.
        explore_after: converging swarms in a row that end without beating the best before
            the exploring swarm takes over; None never explores.
        jitter: the exploring swarm's kick, in box widths.
        polish: the share of the budget kept for the end: the face moves, then the swarm
            that holds the best point if it still runs, else a last swarm whose bacteria
            all start at the best point with steps of ``jitter`` box widths; 0 keeps none
            (and tries no face moves).
        progress: show a ``tqdm`` bar of the evaluations and the best loss (lines where
            tqdm is not installed), and a summary at the end.
        **adaptive_kwargs: further :func:`functional_bfo.adaptive_bfo` settings
            (``maximize``, ``evaluator``, ``adaptation_rate``, ...).

    Returns:
        A :class:`BlackBoxResult`.

    Raises:
        ValueError: no bounds, a bad budget, restart, metric or exploration setting, or a
            bad AdaptiveBFO setting.
        TypeError: params that are not a pytree of floating tensors, or ``relative_steps``
            (the setup's own) among ``adaptive_kwargs``.
        BaseException: whatever ``loss_fn`` (or Ctrl-C) raised, with its type kept; its
            attribute ``partial_result`` is a :class:`BlackBoxResult` of the best point
            found before, and a note says so.

    Warns:
        RuntimeWarning: every loss evaluated was NaN or infinite (the returned loss is then
            infinite).

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
    check_params(params)
    if "relative_steps" in adaptive_kwargs:
        raise TypeError("black_box got relative_steps=, which it sets itself: its steps are "
                        "relative to the box it is given. For other steps use "
                        "fb.adaptive_bfo with fb.run.")
    budget = check_int("max_evals", max_evals, 1)
    stall_limit = None if restart_after is None else check_int("restart_after", restart_after, 1)
    rtol = check_float("restart_rtol", restart_rtol, 0.0)
    rate = check_float("metric_rate", metric_rate, 0.0)
    hand_over = None if explore_after is None else check_int("explore_after", explore_after, 1)
    kick = check_float("jitter", jitter, 0.0, low_open=True)
    polish_share = check_float("polish", polish, 0.0, 1.0)
    given = params  # searched in float64, so that losses are compared in float64 too
    if any(x.dtype != torch.float64 for x in optree.tree_leaves(params)):
        params, loss_fn, bounds = _in_float64(params, loss_fn, bounds)
    settings = dict(bounds=bounds, relative_steps=True, swim_length=swim_length,
                    step_size_min=step_size_min, **adaptive_kwargs)
    opt = adaptive_bfo(population_size, **settings)  # validates the swarm's settings
    per_update = population_size * (swim_length + 1)
    if budget < per_update:
        raise ValueError(f"Invalid max_evals: {max_evals}; one update costs population_size "
                         f"* (swim_length + 1) = {per_update} evaluations, so give at least "
                         "that or a smaller swarm.")
    size = numel(params)
    if rate > 0 and size > MAX_METRIC_SIZE:
        raise ValueError(f"metric_rate={metric_rate} learns a {size} x {size} tumble metric; "
                         f"it is limited to {MAX_METRIC_SIZE} parameters (n^2 memory, n^3 time "
                         "per update). Pass metric_rate=0 for isotropic tumbles.")
    sign = -1.0 if adaptive_kwargs.get("maximize", False) else 1.0
    dtype = torch.promote_types(optree.tree_leaves(params)[0].dtype, torch.float32)
    box = resolve(bounds, params, dtype)
    static = adaptive_static(opt)
    evaluate = costs_by(check_evaluator(adaptive_kwargs.get("evaluator")), loss_fn, args,
                        dtype, sign)
    width = widths(box, params) if rate > 0 else None

    def step(state: AdaptiveBFOState, metric: TumbleMetric | None):
        """One AdaptiveBFO update with tumbles shaped by ``metric``, which learns from it."""
        if metric is None or width is None:
            return AdaptiveBFOState(**adaptive_step(state, static, evaluate).fields), None
        out = adaptive_step(state, static, evaluate, lambda direction, source, known:
                            shape_directions(metric, direction, width, params))
        new = AdaptiveBFOState(**out.fields)
        moves = flat_rows(new.population) - flat_rows(take(state.population, out.source))
        return new, learn(metric, moves[out.known & (moves != 0).any(dim=1)], width, rate)

    converging = _Converging(opt, step, params, box, key, stall_limit, rtol, rate > 0, sign)
    explorer = None
    evals, handed, after, converging_after = 0, False, 0, 0
    history: list[tuple[int, float]] = []
    main_budget = budget - per_update * int(polish_share * budget / per_update)
    rules = Stopping(maximize=sign < 0, budget=budget)  # fb.run's rules; one update fits
    face_moves = polisher = None  # the best point tried on the box's faces, then polished

    def result() -> BlackBoxResult:
        best_params, best_cost = _best(converging, explorer, face_moves, polisher)
        best_params = optree.tree_map(lambda x, g: x.to(g.dtype), best_params, given)
        loss = torch.tensor(sign * best_cost, dtype=torch.float64,
                            device=converging.state.losses.device)
        return BlackBoxResult(best_params, loss, evals, converging.restarts,
                              0 if explorer is None else explorer.updates, history)

    report, started = _reporter(progress, budget), time.perf_counter()

    def record(loss: float) -> str | None:
        """The best after ``evals`` evaluations: into the history, the rules, the progress."""
        history.append((evals, loss))
        if report is not None and len(history) % 10 == 0:
            report(_progress(history, started))
        return rules.record(evals, loss, per_update)

    try:
        while rules.reason is None:
            polishing = evals + per_update > main_budget
            if polishing and face_moves is None:
                room = min(budget - evals, int(FACE_SHARE * (budget - main_budget)))
                face_moves = _FaceMoves(*_best(converging, explorer), box, evaluate, room)
                if face_moves.evals:
                    evals += face_moves.evals
                    if record(sign * _best(converging, explorer, face_moves)[1]) is not None:
                        break
            if polishing and not converging.holds(_best(converging, explorer, face_moves)[1]):
                break  # the polisher takes the rest of the budget
            handed = handed or (hand_over is not None and converging.failed >= hand_over)
            if handed and explorer is None:
                explorer = _Explorer(opt, step, params, box, key, kick, sign)
            if (explorer is not None and not polishing
                    and converging_after >= CONVERGING_SHARE * (after + 1)):
                evals += explorer.update()
            else:
                evals += converging.update()
                converging_after += handed
            after += handed
            record(sign * _best(converging, explorer, face_moves)[1])
        best_params, best_cost = _best(converging, explorer, face_moves)
        if rules.reason is None and math.isfinite(best_cost):
            polisher = _Polisher(opt, step, best_params, best_cost, key, kick, sign)
            while rules.reason is None:
                evals += polisher.update()
                record(sign * min(best_cost, polisher.best_cost))
    except BaseException as e:  # the user's exception (or Ctrl-C), with what was found
        with contextlib.suppress(AttributeError):  # an exception type without a __dict__
            e.partial_result = result()  # type: ignore[attr-defined]
        e.add_note(f"functional_bfo.black_box: interrupted after {evals} evaluations; the best "
                   "point found before is this exception's .partial_result.")
        raise
    found = result()
    if report is not None:
        report(_progress(history, started, rules.reason or "max_evals"))
    if not math.isfinite(float(found.loss)):
        warnings.warn(f"functional_bfo.black_box: every loss evaluated ({evals}) is NaN or "
                      "infinite, so the search had nothing to follow; check loss_fn and the "
                      "bounds.", RuntimeWarning, stacklevel=2)
    return found


def _progress(history: list[tuple[int, float]], started: float, stopped: str | None = None):
    """What ``fb.run``'s progress reports show, from the history (no mean loss here)."""
    info = {"step": len(history), "updates": len(history), "num_evals": history[-1][0],
            "best_loss": history[-1][1], "mean_loss": math.nan,
            "seconds": time.perf_counter() - started}
    return info if stopped is None else {**info, "stopped": stopped}


def _best(*swarms) -> tuple[Params, float]:
    """The best point and cost any of ``swarms`` has seen (None skipped; ties: the first)."""
    return min(((s.best_params, s.best_cost) for s in swarms if s is not None),
               key=lambda found: found[1])


class _Swarm:
    """What both kinds of swarm share: a state the driver advances, and the best it has seen."""

    state: AdaptiveBFOState
    step: Callable[..., tuple[AdaptiveBFOState, Any]]
    sign: float
    best_params: Params
    best_cost: float

    def _advance(self, metric: TumbleMetric | None):
        """One update of ``self.state``: (evaluations spent, the metric after it, best cost)."""
        before = int(self.state.num_evals)
        self.state, metric = self.step(self.state, metric)
        cost = self.sign * float(self.state.best_loss)
        if cost < self.best_cost:
            self.best_params, self.best_cost = self.state.best_params, cost
        return int(self.state.num_evals) - before, metric, cost


class _Converging(_Swarm):
    """Converging swarms, one at a time: each restarted from a new place when it stalls."""

    def __init__(self, opt, step, params, box, key, stall_limit, rtol, learns, sign):
        self.opt, self.step, self.params, self.box, self.key = opt, step, params, box, key
        self.stall_limit, self.rtol, self.learns, self.sign = stall_limit, rtol, learns, sign
        self.best_params, self.best_cost = params, math.inf  # over every converging swarm
        self.restarts = 0
        self.failed = 0  # swarms in a row that ended without beating the best before them
        self._start(params)

    def _start(self, start: Params) -> None:
        self.state = self.opt.init(start, key=random.fold_in(self.key, 2 * self.restarts))
        size = numel(start)
        device = optree.tree_leaves(self.state.population)[0].device
        # A portfolio: even swarms learn a metric, odd ones tumble isotropically (a learned
        # metric makes a swarm less likely to find Ackley's funnel; benchmarks/NOTES.md).
        learns = self.learns and self.restarts % 2 == 0
        self.metric = isotropic(size, device) if learns else None
        self.entry_best = self.best_cost  # the best this swarm has to beat
        self.progress, self.stalled = math.inf, 0  # best at its last progress; updates since
        self.first = math.inf  # its first finite best

    def holds(self, best_cost: float) -> bool:
        """Whether the current swarm found a point as good as ``best_cost``."""
        return self.sign * float(self.state.best_loss) <= best_cost

    def update(self) -> int:
        """One update of the current swarm (restarting it if it stalled); evaluations spent."""
        spent, self.metric, cost = self._advance(self.metric)
        # Progress is a gain of more than rtol of the way still to the best of the swarms
        # before, or, while this swarm holds the best, of its own descent so far: losses
        # compared with losses only, so f, f + c and a * f restart alike.
        behind = self.progress > self.entry_best
        if not math.isfinite(self.progress):  # its first finite loss is progress
            if cost < self.progress:
                self.first, self.progress, self.stalled = cost, cost, -1
        elif self.progress - cost > self.rtol * (
                self.progress - self.entry_best if behind else self.first - self.progress):
            self.progress, self.stalled = cost, -1
        self.stalled += 1
        if self.stall_limit is not None and self.stalled >= self.stall_limit * (
                1 if behind else HOLDING_PATIENCE):
            self.failed = self.failed + 1 if cost >= self.entry_best else 0
            self.restarts += 1
            key = random.fold_in(self.key, 2 * self.restarts - 1)
            self._start(_uniform_point(self.params, self.box, key))
        return spent


class _Explorer(_Swarm):
    """The exploring swarm: every JITTER_PERIOD updates its bacteria take a kept random kick."""

    def __init__(self, opt, step, params, box, key, jitter, sign):
        self.step, self.params, self.box, self.jitter = step, params, box, jitter
        self.sign = sign
        self.key = random.fold_in(key, EXPLORER_STREAM)
        self.state = opt.init(params, key=self.key)
        self.best_params, self.best_cost = params, math.inf
        self.updates = 0

    def update(self) -> int:
        """One update, then the kick when it is due; evaluations spent."""
        spent, _, _ = self._advance(None)
        self.updates += 1
        if self.updates % JITTER_PERIOD == 0:  # a kick moves bacteria, never the best seen
            self.state = self._kicked(self.state)
        return spent

    def _kicked(self, state: AdaptiveBFOState) -> AdaptiveBFOState:
        """Every bacterium moved and kept there: by a Gaussian kick, or one coordinate redrawn.

        Even rows move by ``N(0, jitter)`` box widths per coordinate, odd rows get one random
        coordinate redrawn uniformly in the box.
        The Gaussian kick hops to a neighbouring basin of a rotated landscape (Rastrigin,
        Ackley); the redraw moves one coordinate of a separable function into another of its
        basins without disturbing the rest (Styblinski-Tang, Schwefel). A coordinate with an
        open side gets the Gaussian kick instead. Forgetting the losses makes the next tumble
        of each bacterium be accepted whatever it costs (so the kick is not undone), and
        steps below three kicks grow back to it.
        """
        dtype, size = state.losses.dtype, state.losses.shape[0]
        kick_key = random.fold_in(self.key, self.updates)
        z = random.tree_normal_like(kick_key, state.population, dtype)
        n = numel(self.params)
        which = (random.uniform(random.fold_in(kick_key, 1), (size,), dtype) * n).long()
        device = which.device
        odd = torch.arange(size, device=device) % 2 == 1
        redraw = (torch.arange(n, device=device) == which.clamp(max=n - 1).unsqueeze(1)) \
            & odd.unsqueeze(1)
        leaves, spec = optree.tree_flatten(state.population)
        gaussian = spec.flatten_up_to(box_relative(z, self.box))
        no_spread = torch.zeros((), dtype=dtype, device=device)
        moved = []
        normals: list[Any] = spec.flatten_up_to(z)
        redraws: list[Any] = spec.flatten_up_to(unflatten_like(redraw, self.params))
        for x, zi, k, r, b in zip(leaves, normals, gaussian, redraws, self.box):
            kicked = project(x + (self.jitter * k).to(x.dtype), b, "clip")
            redrawn = sample_domain(kicked, zi.to(x.dtype), b, no_spread.to(x.dtype))
            moved.append(torch.where(r, redrawn, torch.where(rows(odd, x), x, kicked)))
        return state._replace(population=spec.unflatten(moved),
                              losses=torch.full_like(state.losses, math.nan),
                              step_sizes=state.step_sizes.clamp_min(3 * self.jitter))


class _FaceMoves:
    """The best point moved onto faces of the box, tried when the polish phase starts.

    Tumbles that are reflected (or clipped) at a face only hover near an optimum on the
    boundary (an active constraint), and a coordinate on the far side of the box stays
    there while the others hold it back. Three evaluator calls, within ``room``
    evaluations (``FACE_SHARE`` of the polish budget; rows past it are left out): every
    coordinate within ``SNAP_WIDTHS[j]`` box widths of its nearest face moved onto it (a
    row per width that moves a new set); then, from the best so far, each coordinate alone
    moved onto each of its two faces (for at most ``FACE_SCAN_SIZE`` coordinates: 2n rows
    of n); then every single move that helped, together. It keeps the best of them
    (``best_cost`` inf if none beat the start) and the evaluations spent.
    """

    def __init__(self, best_params, best_cost, box, evaluate, room):
        self.best_params, self.best_cost, self.evals = best_params, math.inf, 0
        self.params, self.evaluate, self.room = best_params, evaluate, room
        if not math.isfinite(best_cost):
            return
        low, high = _flat_box(best_params, box)
        x = flat_rows(optree.tree_map(lambda v: v.unsqueeze(0), best_params))[0]
        finite = torch.isfinite(high - low)
        face = torch.where(x - low <= high - x, low, high)
        gap = torch.where(finite, (x - face).abs() / (high - low), torch.inf)
        masks = []
        for width in SNAP_WIDTHS:
            mask = (gap <= width) & (gap > 0)
            if bool(mask.any()) and not any(torch.equal(mask, m) for m in masks):
                masks.append(mask)
        if masks:
            self._try(torch.where(torch.stack(masks), face, x))
        base = x if self.best_cost >= best_cost else self._flat_best
        base_cost = min(best_cost, self.best_cost)
        n = x.shape[0]
        if n > FACE_SCAN_SIZE or not bool(finite.any()):
            return
        faces = torch.stack([low, high])  # (2, n)
        singles = base.expand(2, n, n).clone()  # [f, j] = base with coordinate j on face f
        singles.diagonal(dim1=1, dim2=2).copy_(torch.where(finite, faces, base))
        moves = finite & (faces != base)  # (2, n): rows that change something
        costs = torch.full((2, n), torch.inf, dtype=x.dtype, device=x.device)
        costs[moves] = self._try(singles[moves])
        better, side = costs.min(dim=0)
        helped = better < base_cost
        if int(helped.sum()) >= 2:
            self._try(torch.where(helped, faces.gather(0, side.unsqueeze(0))[0], base)[None])

    def _try(self, candidates: Tensor) -> Tensor:
        """Costs of the flat ``candidates`` rows (inf past the room left); keeps the best."""
        count = min(candidates.shape[0], self.room - self.evals)
        costs = torch.full((candidates.shape[0],), torch.inf, dtype=candidates.dtype,
                           device=candidates.device)
        if count <= 0:
            return costs
        tried = candidates[:count]
        costs[:count] = self.evaluate(_as_params(tried, self.params))[0].to(costs.dtype)
        self.evals += count
        cost, row = costs.min(dim=0)
        if float(cost) < self.best_cost:
            self.best_cost, self._flat_best = float(cost), tried[int(row)]
            self.best_params = optree.tree_map(lambda v: v[0],
                                               _as_params(tried[int(row)][None], self.params))
        return costs


class _Polisher(_Swarm):
    """A last swarm whose bacteria all start at the best point, with steps of ``jitter``."""

    def __init__(self, opt, step, best_params, best_cost, key, jitter, sign):
        self.step, self.sign = step, sign
        state = opt.init(best_params, key=random.fold_in(key, POLISHER_STREAM))
        size = state.losses.shape[0]
        self.state = state._replace(
            population=optree.tree_map(lambda x: x.unsqueeze(0).expand(size, *x.shape).clone(),
                                       best_params),
            losses=torch.full_like(state.losses, sign * best_cost),
            step_sizes=torch.full_like(state.step_sizes, jitter))
        self.best_params, self.best_cost = best_params, best_cost

    def update(self) -> int:
        return self._advance(None)[0]


def _in_float64(params: Params, loss_fn: LossFn, bounds: Any) -> tuple[Params, Any, Any]:
    """``params`` in float64, and ``loss_fn`` and ``bounds`` that go with them.

    ``loss_fn`` gets its params back in their own dtypes; ``bounds`` is rounded inward to
    those, so that a candidate cast back to its leaf's dtype stays in the box.
    """
    leaves, spec = optree.tree_flatten(params)
    box = resolve(bounds, params, torch.float64)
    wide = spec.unflatten([x.detach().to(torch.float64) for x in leaves])
    pairs = spec.unflatten([(-math.inf, math.inf) if b is None else (b.low, b.high)
                            for b in box])

    def in_given_dtypes(p: Params, *args: Any) -> Tensor:
        return loss_fn(optree.tree_map(lambda x, g: x.to(g.dtype), p, params), *args)

    return wide, in_given_dtypes, pairs


def _flat_box(params: Params, box: list[LeafBounds | None]) -> tuple[Tensor, Tensor]:
    """Each flattened coordinate's low and high (float64, -inf/inf where open), shape (n,)."""
    lows, highs = [], []
    for x, b in zip(optree.tree_leaves(params), box):
        if b is None:
            b_high = torch.full(x.shape, torch.inf, dtype=torch.float64, device=x.device)
            b_low = -b_high
        else:
            b_low, b_high = (torch.broadcast_to(v.to(torch.float64), x.shape)
                             for v in (b.low, b.high))
        lows.append(b_low.reshape(-1))
        highs.append(b_high.reshape(-1))
    return torch.cat(lows), torch.cat(highs)


def _as_params(flat: Tensor, template: Params) -> Params:
    """Rows of flat coordinates (float64) as a population shaped and typed like ``template``."""
    return optree.tree_map(lambda v, t: v.to(t.dtype), unflatten_like(flat, template),
                           template)


def _uniform_point(params: Params, box: list[LeafBounds | None], key: Key) -> Params:
    """A point uniform in the resolved ``box`` (``params`` itself where a side is open)."""
    leaves, spec = optree.tree_flatten(params)
    dtype = torch.promote_types(leaves[0].dtype, torch.float32)
    z = optree.tree_leaves(random.tree_normal_like(key, params, dtype))
    scale = torch.zeros((), dtype=dtype)
    return spec.unflatten([sample_domain(x.to(dtype), zi, b, scale.to(x.device)).to(x.dtype)
                           for x, zi, b in zip(leaves, z, box)])
