"""The black box: AdaptiveBFO swarms stepping in box widths, restarted, as ask/tell.

Phases (docs/variants.md): converge (small swarms, restarted once they stop progressing; one
in a valley goes on as the walker; every other restart is a wide walker, its rounds twice as
large each time), explore (one kicked swarm after ``explore_after`` failed swarms), then faces
and polish. Decisions compare losses with each other only, in float64.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from .. import _metric as metric
from .. import random
from .._adaptive import ADAPTIVE, AdaptiveBFOState, AdaptiveSettings, swarm_settings
from .._ask_tell import (
    Ask,
    at_step,
    check_ask,
    check_tag,
    rank_costs,
    round_tag,
    settings_digest,
    swim_optimizer,
    taking_key,
    told_costs,
)
from .._base import Key, LossFn, Optimizer, Params
from .._bounds import LeafBounds, flat_box, project, sample_domain
from .._checks import check_float, check_int, check_losses, check_params
from .._layout import Layout, layout, ravel, unravel
from .._progress import reporter
from .._run import run
from . import moves, walker

# Tuned constants; docs/variants.md ("Every default") has the numbers that chose each.
HOLDING_PATIENCE = 3  # a swarm holding the best waits this many times as long to restart
WALKER_PATIENCE_D = 10  # a walker holding the best waits D / this many times (1 to the above)
VALLEY_CONDITION = 2.0  # a metric of this condition (checked once a cycle) marks a valley
JITTER_PERIOD = 10  # the explorer is kicked every JITTER_PERIOD updates
FACE_SHARE, FACE_SCAN_SIZE = 0.1, 2000  # face moves' caps: share of the polish, coordinates
POLISH_DECADES = 4  # the polish's steps spread over this many decades below jitter
BEHIND_BUDGET = 2  # a swarm behind stops at this many times the best's swarm's evaluations
WIDE_STEP = 0.3  # a wide walker's first step, box widths a coordinate (IPOP-CMA-ES's sigma0)
# fold_in data; restarts use 0, 1, ..
EXPLORER_STREAM, POLISHER_STREAM, WALKER_STREAM, WIDE_STREAM = (2**31 - k for k in (1, 2, 3, 4))
PHASES = ("converge", "explore", "faces", "polish", "done")


class BlackBoxState(NamedTuple):
    """The state of :func:`black_box_search`: its swarms, the best point, the counters.

    Tensors in shapes that ``init`` fixes (:func:`functional_bfo.save` takes it in every
    phase); its points are float64 rows of the params' ``D`` coordinates. The converging swarm
    keeps a learner's metric whatever its kind, and the walker is kept whether it walks or not.
    """

    stage: Tensor  # () int64: the next round's phase, an index into PHASES
    swarm: AdaptiveBFOState  # the converging swarm (in the polish: the polishing one)
    swarm_learns: Tensor  # () bool: whether it learns its tumble metric
    explorer: AdaptiveBFOState  # the exploring swarm (it runs after explore_after failures)
    faces: moves.FaceScan  # the polish's face moves
    walker: walker.Walker  # a wide walker, or the converging swarm's once it found a valley
    best_row: Tensor  # (D,) float64: the best point evaluated
    best_loss: Tensor  # () float64 (inf, or -inf when maximizing, before a finite loss)
    num_evals: Tensor  # () int64, like every counter below
    step: Tensor  # rounds told (its updates)
    restarts: Tensor  # converging swarms started after the first
    failed: Tensor  # converging swarms in a row that ended without beating the ones before
    entry_best: Tensor  # () float64: the best cost of the converging swarms before this one
    converged_best: Tensor  # () float64: the best cost of every converging swarm so far
    found_after: Tensor  # the evaluations its swarm had spent when it found it
    first: Tensor  # () float64: this swarm's first finite best cost
    progress: Tensor  # () float64: its best cost at its last progress
    stalled: Tensor  # its evaluations since
    gain: Tensor  # () float64: the gain of its last progress (0 before any)
    valley: Tensor  # () bool: its metric found a valley, so it goes on as the walker
    explorer_updates: Tensor
    start: Tensor  # (D,) float64: the given params, the explorer's start, open sides' place
    given: Params  # the given params as given: their structure, shapes and dtypes
    given_box: LeafBounds  # the box (float64) rounded inward to those dtypes, for the loss
    key: Key

    RANGES = {"stage": (0, len(PHASES) - 1, False)}  # type: ignore[misc]  # a class constant

    @property
    def phase(self) -> str:
        """The next round's phase, one of ``PHASES``."""
        return PHASES[int(self.stage)]

    @property
    def best_params(self) -> Params:
        """The best point evaluated, like the given params in float64."""
        return as_params(self.best_row, self.given)


class BlackBoxResult(NamedTuple):
    """What :func:`black_box` found."""

    params: Params  # the best point evaluated, like the initial params
    loss: Tensor  # () its loss, float64
    num_evals: int  # loss evaluations spent (never more than max_evals)
    restarts: int  # converging swarms started after the first
    explorer_updates: int  # updates given to the exploring swarm (0: it never started)
    history: list[tuple[int, float]]  # (evaluations so far, best loss) after every round


def black_box_search(bounds: Any, *, max_evals: int, population_size: int = 8,
                     swim_length: int = 1, chemotaxis_steps: int = 10, step_size_min: float = 1e-12,
                     restart_after: int | None = 30, restart_rtol: float = 1e-2,
                     metric_rate: float = 2.0, explore_after: int | None = 2,
                     jitter: float = 0.01, polish: float = 0.1,
                     **adaptive_kwargs: Any) -> Optimizer:
    """:func:`black_box` as an ask/tell pair, for losses computed anywhere.

    ``asked = opt.ask(state)``, then ``state = opt.tell(state, asked, losses)`` (a loss per
    row of the float64 ``asked.params``) until ``state.phase == "done"``: restarts,
    exploration and the polish happen inside ``tell``, and ``state.best_params`` and
    ``state.best_loss`` hold the best point. ``opt.update(state, loss_fn, *args)`` is one
    round, its ``loss_fn`` called as :func:`black_box`'s is. The settings are :func:`black_box`'s.

    Examples:
        >>> import numpy as np, torch, functional_bfo as fb
        >>> opt = fb.black_box_search((-1.0, 1.0), max_evals=6000)
        >>> state = opt.init({"x": torch.zeros(3)}, key=fb.random.key(0))
        >>> while state.phase != "done":
        ...     asked = opt.ask(state)
        ...     x = asked.params["x"].numpy()               # evaluated outside torch
        ...     state = opt.tell(state, asked, np.square(x - 0.3).sum(axis=1) + 1000)
        >>> bool(state.best_loss - 1000 < 1e-8), int(state.num_evals) <= 6000
        (True, True)
    """
    if bounds is None:
        raise ValueError("black_box needs bounds=(low, high) (or a pytree of them): its steps "
                         "and restarts are relative to the box. Without a box use "
                         "fb.adaptive_bfo with fb.run.")
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
    settings = dict(bounds=bounds, relative_steps=True, swim_length=swim_length,
                    chemotaxis_steps=chemotaxis_steps, step_size_min=step_size_min,
                    **{"swim_batch": swim_length + 1, **adaptive_kwargs})
    swarms = swarm_settings(population_size, **settings)
    plain = swim_optimizer(ADAPTIVE, swarms)  # isotropic tumbles
    learner = swim_optimizer(ADAPTIVE, swarms._replace(metric_rate=rate)) if rate else plain
    per_round = population_size * (swim_length + 1)
    if budget < per_round:
        raise ValueError(f"Invalid max_evals: {max_evals}; one update costs population_size "
                         f"* (swim_length + 1) = {per_round} evaluations, so give at least "
                         "that or a smaller swarm.")
    main_budget = budget - per_round * int(polish_share * budget / per_round)
    shared = {k: v for k, v in settings.items() if k not in ("evaluator", "swim_batch")}
    fixed = settings_digest(("black_box_search", budget, stall_limit, rtol, hand_over, kick,
                             rate, polish_share, population_size, shared))
    search = _Search(swarms._replace(metric_rate=rate), plain, learner, budget, main_budget,
                     per_round, stall_limit, rtol, hand_over, kick, fixed)
    return Optimizer(taking_key(search.init, "black_box_search"), search.update,
                     bool(plain.maximize), search.ask, search.tell)


class _Search(NamedTuple):
    """:func:`black_box_search`'s settings, and the steps its rounds are made of."""

    swarms: AdaptiveSettings  # the swarms' (metric_rate: the learners' and the walker's)
    plain: Optimizer  # isotropic tumbles
    learner: Optimizer  # a learned metric
    budget: int
    main_budget: int  # the polish starts once a round would pass it
    per_round: int  # a whole swarm's evaluations in a round
    stall_limit: int | None
    rtol: float
    hand_over: int | None
    kick: float
    fixed: int  # the settings' digest, in every round's tag

    def cost(self, loss: Tensor) -> float:
        return self.swarms.sign * float(loss)

    def sides(self, s: BlackBoxState) -> tuple[Tensor, Tensor]:
        """Each coordinate's low and high face, (D,) rows of the swarms' box (float64)."""
        box, size = s.explorer.box, s.start.shape[-1]
        return box.low.expand(size), box.high.expand(size)

    def optimizer(self, s: BlackBoxState, swarm: AdaptiveBFOState) -> Optimizer:
        """The optimizer of the round of ``swarm``, without cycle events where none ends."""
        learns = s.phase != "explore" and bool(s.swarm_learns)
        return at_step(self.learner if learns else self.plain, int(swarm.step))

    def init(self, params: Params, *, key: Key) -> BlackBoxState:
        check_params(params)
        given = optree.tree_map(lambda x: x.detach().clone(), params)
        row = ravel(layout(given), given).to(torch.float64)  # float32 or 64: exact
        no, zero, inf = torch.tensor(False), torch.tensor(0), torch.tensor(math.inf).double()
        s = BlackBoxState(  # type: ignore[call-arg]  # RANGES is a class constant
            stage=zero, swarm=None, swarm_learns=no,  # type: ignore[arg-type]  # set below
            explorer=self.plain.init(as_params(row, given), key=random.fold_in(
                key, EXPLORER_STREAM)),
            faces=None, walker=None, best_row=row,  # type: ignore[arg-type]
            best_loss=torch.tensor(self.swarms.sign * math.inf, dtype=torch.float64,
                                   device=row.device),
            num_evals=zero, step=zero, restarts=zero, failed=zero, entry_best=inf,
            converged_best=inf, found_after=zero, first=inf, progress=inf, stalled=zero,
            gain=zero.double(), valley=no, explorer_updates=zero, start=row, given=given,
            key=key.to(row.device), given_box=flat_box(  # never None: a box
                self.swarms.bounds, layout(params), row.device,
                torch.float64))  # type: ignore[arg-type]
        closed = moves.face_scan(row, math.inf, *self.sides(s), 0)._replace(
            stage=torch.tensor(moves.CLOSED))
        s = self.restarted(s._replace(faces=closed), row, 0)
        return self.after(s._replace(walker=self.narrowed(s.swarm)))  # idle until a valley

    def ask(self, state: BlackBoxState) -> Ask:
        swarm, tag = self.round_swarm(state), round_tag(state, self.fixed)
        if swarm is not None:
            return self.optimizer(state, swarm).ask(swarm)._replace(tag=tag)  # type: ignore[misc]
        rows = self.round_rows(state)
        return Ask(as_params(rows.clone(), state.given), torch.ones(
            len(rows), dtype=torch.bool, device=rows.device), tag)

    def tell(self, state: BlackBoxState, asked: Ask, losses: Any, *,
             check: bool = True) -> BlackBoxState:
        swarm = self.round_swarm(state)
        check_ask(asked, "black_box_search")
        if check:
            check_tag(round_tag(state, self.fixed), asked.tag, "black_box_search")
        if swarm is not None:  # its tell checks the swarm and the rows
            tell = self.optimizer(state, swarm).tell
            return self.after(self.told(state, swarm, tell(  # type: ignore[misc]
                swarm, asked, losses, check=False)))
        rows = moves.face_count(state.faces, *self.sides(state)) if state.phase == "faces" else (
            self.walker_size(state))
        if tuple(asked.mask.shape) != (rows,):  # a stale answer was named as one above
            raise ValueError(f"asked has {len(asked.mask)} rows, but the state's round "
                             f"{int(state.step)} ({state.phase}) has {rows}: tell the Ask "
                             "that ask(state) returned for this state.")
        return self.after(self.rows_told(state, told_costs(
            state.swarm, asked, losses, self.swarms.sign, "black_box_search", check=False)))

    def update(self, state: BlackBoxState, loss_fn: LossFn, *args: Any) -> BlackBoxState:
        """One round: ``tell(state, ask(state), losses)``, a swarm's by its own ``update``."""
        swarm, like = self.round_swarm(state), layout(state.given)
        loss = loss_fn if like.dtypes == (torch.float64,) * len(like.dtypes) else (
            lambda p, *a: loss_fn(as_given(ravel(layout(p), p), like, state.given_box), *a))
        if swarm is not None:
            return self.after(self.told(state, swarm, self.optimizer(state, swarm).update(
                swarm, loss, *args)))
        drawn = None if state.phase == "faces" else self.walker_round(state)
        rows = self.round_rows(state) if drawn is None else drawn[1]
        evaluator = self.swarms.evaluator
        report = getattr(evaluator, "with_disagreement", None)  # fb.distributed's
        with torch.no_grad():
            given = as_params(rows.clone(), state.given)  # the loss may edit it, not the state
            losses, differing = (evaluator(loss, given, *args), None) if (
                report is None) else report(loss, given, *args)
            losses = check_losses(losses, len(rows))
        if differing is not None:  # kept by the explorer, which no restart replaces
            ranks = state.explorer.disagreeing_ranks | differing
            state = state._replace(explorer=state.explorer._replace(disagreeing_ranks=ranks))
        costs = rank_costs(losses.to(state.swarm.losses), self.swarms.sign)
        return self.after(self.rows_told(state, costs, drawn))

    def walking(self, s: BlackBoxState) -> bool:
        """Whether the converging search is a walker: wide, or a swarm's in a valley."""
        return bool(s.valley) and (self.wide(int(s.restarts))
                                   or self.per_round >= walker.MIN_ROUND)

    def wide(self, restarts: int) -> bool:
        """Whether restart ``restarts`` is a wide walker (walkers need a learned metric)."""
        return wide_restart(restarts) and bool(self.swarms.metric_rate)

    def walker_size(self, s: BlackBoxState) -> int:
        """A walker's round: a wide one's ``per_round * 2**restarts`` points, else a swarm's."""
        restarts = int(s.restarts)
        if not self.wide(restarts):
            return self.per_round
        return min(max(self.per_round << restarts, walker.MIN_ROUND), self.budget)

    def walker_round(self, s: BlackBoxState) -> tuple[Tensor, Tensor]:
        """The walker's round: its normal draws and its points."""
        return walker.draw(s.walker, self.walker_size(s), s.explorer.box, self.swarms.boundary)

    def round_rows(self, s: BlackBoxState) -> Tensor:
        """The points of a round of face moves or of the walker, rows (float64)."""
        if s.phase == "faces":
            return moves.face_rows(s.faces, *self.sides(s))
        return self.walker_round(s)[1]

    def round_swarm(self, state: BlackBoxState) -> AdaptiveBFOState | None:
        """The swarm whose round is next (None: the face moves' or the walker's), checked."""
        if not isinstance(state, BlackBoxState):
            raise TypeError(f"black_box_search takes the BlackBoxState its init made, got "
                            f"{type(state).__name__}.")
        if state.phase == "done":
            raise ValueError(f"black_box_search has spent its budget ({int(state.num_evals)} "
                             f"of {self.budget} evaluations; no round fits): the best point "
                             "is state.best_params, its loss state.best_loss.")
        if state.phase == "faces" or state.phase == "converge" and self.walking(state):
            return None
        if state.phase == "explore":
            return state.explorer
        w = state.swarm  # as its optimizer takes it
        return w if bool(state.swarm_learns) else w._replace(metric=state.explorer.metric)

    def told(self, state: BlackBoxState, swarm: AdaptiveBFOState,
             new: AdaptiveBFOState) -> BlackBoxState:
        """After ``swarm``'s round (``new``): the best point, the counters, the phase's rule."""
        spent = int(new.num_evals - swarm.num_evals)
        s = self.counted(state, ravel(layout(new.best_params), new.best_params), new.best_loss,
                         spent)
        if state.phase == "converge":
            return self.converged(s, new, spent)
        if state.phase == "polish":
            return s._replace(swarm=self.kept(s, new))
        updates = int(s.explorer_updates) + 1
        if updates % JITTER_PERIOD == 0:  # a kick moves bacteria, never the best seen
            new = moves.kicked(new, new.box, self.kick, random.fold_in(
                random.fold_in(s.key, EXPLORER_STREAM), updates))
        return _with(s, explorer=new, explorer_updates=updates)

    def rows_told(self, s: BlackBoxState, costs: Tensor,
                  drawn: tuple[Tensor, Tensor] | None = None) -> BlackBoxState:
        """After a round of face moves, or of the walker (``drawn``: its draws and points)."""
        loss, spent = self.swarms.sign * costs.min(), len(costs)
        if s.phase == "faces":
            faces, row = moves.face_scan_told(s.faces, costs, *self.sides(s))
            return self.counted(s, row.clone(), loss, spent, faces=faces)
        (draws, rows), hp = drawn or self.walker_round(s), s.swarm.hyperparams
        new = walker.told(s.walker, draws, costs.to(torch.float64), self.swarms.sign,
                          self.swarms.metric_rate, (float(hp.step_size_min),
                                                    float(hp.step_size_max)),
                          s.explorer.box, self.swarms.boundary)
        best = rows[int(costs.argmin())].clone()
        return self.converged(self.counted(s, best, loss, spent), new, spent)

    def counted(self, s: BlackBoxState, row: Tensor, loss: Tensor, spent: int,
                **fields: Any) -> BlackBoxState:
        """``s`` after a round that spent ``spent`` evaluations, its best ``row`` at ``loss``."""
        loss = loss.to(torch.float64).reshape(())
        if self.cost(loss) < self.cost(s.best_loss):
            s = s._replace(best_row=row, best_loss=loss)
        return _with(s, num_evals=int(s.num_evals) + spent, step=int(s.step) + 1, **fields)

    def kept(self, s: BlackBoxState, new: AdaptiveBFOState) -> AdaptiveBFOState:
        """A round's converging or polishing swarm as ``s`` keeps it (``BlackBoxState``)."""
        return new if bool(s.swarm_learns) else new._replace(metric=s.swarm.metric)

    def restarted(self, s: BlackBoxState, start: Tensor, restarts: int) -> BlackBoxState:
        """``s`` with a new search at ``start``: a learning swarm, or a wide walker (swarm idle)."""
        swarm = self.learner.init(as_params(start, s.given),
                                  key=random.fold_in(s.key, 2 * restarts))
        s = _with(s, swarm=swarm, swarm_learns=swarm.metric.width.numel() > 0, restarts=restarts,
                  entry_best=s.converged_best, first=math.inf, progress=math.inf, stalled=0,
                  gain=0.0, valley=False)
        if not self.wide(restarts):
            return s
        return _with(s, walker=self.widened(s, start, restarts), valley=True)

    def widened(self, s: BlackBoxState, start: Tensor, restarts: int) -> walker.Walker:
        """IPOP-CMA-ES's restart: an isotropic walker at ``start``, steps ``WIDE_STEP``."""
        n, cap = len(start), float(s.swarm.hyperparams.step_size_max)
        step, best = (torch.tensor(v, dtype=torch.float64, device=start.device) for v in (
            min(WIDE_STEP * math.sqrt(n), cap), self.swarms.sign * math.inf))
        return walker.start(start, step, metric.isotropic(s.walker.metric.width), best,
                            random.fold_in(random.fold_in(s.key, WIDE_STREAM), restarts),
                            torch.zeros_like(s.num_evals))

    def converged(self, s: BlackBoxState, new: AdaptiveBFOState | walker.Walker,
                  spent: int) -> BlackBoxState:
        """After a converging round that spent ``spent``: a restart once a rule below says so."""
        entry_best, was_valley, now = float(s.entry_best), bool(s.valley), self.cost(new.best_loss)
        first, progress, stalled, gain = (float(s.first), float(s.progress),
                                          int(s.stalled) + spent, float(s.gain))
        behind = progress > entry_best
        valley = was_valley or (bool(s.swarm_learns)
                                and int(new.step) % self.swarms.chemotaxis_steps == 0
                                and found_valley(metric.condition(new.metric)))
        if valley and not was_valley:  # the valley's descent (the walker's) counts afresh
            first, progress, stalled, gain = now, now, 0, 0.0
            if isinstance(new, AdaptiveBFOState) and self.per_round >= walker.MIN_ROUND:
                new = self.narrowed(new)
        if not math.isfinite(progress):  # its first finite loss is progress
            if now < progress:
                first, progress, stalled = now, now, 0
        elif progressed(now, progress, entry_best, first, gain, valley, self.rtol):
            progress, stalled, gain = now, 0, progress - now
        spent_all, best_before = int(new.num_evals), float(s.converged_best)
        found_after = spent_all if now < best_before else int(s.found_after)
        held = {"swarm": self.kept(s, new)} if isinstance(new, AdaptiveBFOState) else {
            "walker": new}
        s = _with(s, **held, valley=valley, converged_best=min(best_before, now), gain=gain,
                  found_after=found_after, first=first, progress=progress, stalled=stalled)
        round_size = self.walker_size(s) if isinstance(new, walker.Walker) else self.per_round
        if self.stall_limit is None or not (
                stalled_out(stalled, self.stall_limit * round_size,
                            patience(behind, valley, len(s.best_row)))
                or overspent(spent_all, found_after, behind)):
            return s
        restarts = int(s.restarts)  # a point uniform in the box (the start where a side is open)
        z = random.normal(random.fold_in(s.key, 2 * restarts + 1), s.start.shape, torch.float64)
        place = sample_domain(s.start, z, s.explorer.box, z.new_zeros(()))
        # a wide walker behind is no failure: the next one is larger
        failed = 0 if now < entry_best else int(s.failed) + (not self.wide(restarts))
        return self.restarted(_with(s, failed=failed), place, restarts + 1)

    def narrowed(self, w: AdaptiveBFOState) -> walker.Walker:
        """A swarm in a valley as the walker, at its best bacterium with its step and metric."""
        i = int((self.swarms.sign * w.losses).nan_to_num(math.inf).argmin())
        return walker.start(w.population[i].to(torch.float64, copy=True), w.step_sizes[i], w.metric,
                            w.best_loss, random.fold_in(w.key, WALKER_STREAM), w.num_evals)

    def after(self, s: BlackBoxState) -> BlackBoxState:
        """``s`` with the phase of the next round, and the swarm or moves it needs."""
        fits = int(s.num_evals) + self.per_round <= self.budget
        exploring = self.hand_over is not None and int(s.failed) >= self.hand_over
        walks = s.phase != "polish" and not exploring and self.walking(s)
        size = self.walker_size(s) if walks else self.per_round  # the next converging round's
        polishing = int(s.num_evals) + size > self.main_budget
        if int(s.faces.stage) == moves.CLOSED and polishing and fits:  # the polish opens:
            # the best point's coordinates moved onto the box's faces
            room = min(self.budget - int(s.num_evals),
                       int(FACE_SHARE * (self.budget - self.main_budget)))
            if not math.isfinite(float(s.best_loss)) or len(s.best_row) > FACE_SCAN_SIZE:
                room = 0
            s = s._replace(faces=moves.face_scan(s.best_row, self.cost(s.best_loss),
                                                 *self.sides(s), room))
        if int(s.faces.stage) in (moves.SINGLES, moves.UNION):
            return _with(s, stage=PHASES.index("faces"))
        if not fits:
            return _with(s, stage=PHASES.index("done"))
        if polishing:
            return s if s.phase == "polish" else self.polishing(s)
        return _with(s, stage=PHASES.index("explore" if exploring else "converge"))

    def polishing(self, s: BlackBoxState) -> BlackBoxState:
        """``s`` polishing: a swarm at the best point, steps ``jitter`` down ``POLISH_DECADES``.

        No dispersal; the converging swarm (or the walker's metric) goes on where it holds the
        best, else a new one.
        """
        key, size = random.fold_in(s.key, POLISHER_STREAM), self.swarms.size
        walked, state, learns = self.walking(s), s.swarm, bool(s.swarm_learns)
        held = self.cost((s.walker if walked else s.swarm).best_loss) <= self.cost(s.best_loss)
        if not held:
            state, learns = self.plain.init(as_params(s.best_row, s.given), key=key)._replace(
                metric=s.swarm.metric), False
        elif walked:  # with the walker's metric
            state, learns = self.learner.init(as_params(s.best_row, s.given), key=key)._replace(
                metric=s.walker.metric._replace(path=torch.zeros_like(s.walker.metric.path))), True
        steps = self.kick * torch.logspace(0, -POLISH_DECADES, size, dtype=torch.float64)
        hp = state.hyperparams
        state = state._replace(
            population=s.best_row.expand(size, -1).clone(), step_sizes=steps.to(state.step_sizes),
            losses=torch.full_like(state.losses, float(s.best_loss)),
            hyperparams=hp._replace(elimination_prob=torch.zeros_like(hp.elimination_prob),
                                    elimination_prob_max=torch.zeros_like(
                                        hp.elimination_prob_max)))
        return _with(s, stage=PHASES.index("polish"), swarm=state, swarm_learns=learns,
                     valley=False)


def black_box(loss_fn: LossFn, params: Params, bounds: Any, *args: Any, max_evals: int,
              key: Key, progress: bool = False, **settings: Any) -> BlackBoxResult:
    """Minimize ``loss_fn`` over the box ``bounds`` in at most ``max_evals`` evaluations.

    Runs :func:`black_box_search` with :func:`functional_bfo.run`, round after round,
    keeping each round's best as ``history``. Swarm ``r`` is a
    :func:`functional_bfo.adaptive_bfo` with ``relative_steps=True`` and key
    ``fold_in(key, 2 r)``; the first has ``params`` as bacterium 0 and the rest uniform in
    the box, the others start from a uniform point (key ``fold_in(key, 2 r - 1)``). Odd
    restarts are wide walkers from that point instead (IPOP-CMA-ES's restarts: rounds of
    ``population_size * (swim_length + 1) * 2**r`` points, first steps 0.3 box widths).
    docs/variants.md says how each phase works and how each setting was chosen.

    Args:
        loss_fn: ``loss_fn(params, *args) -> 0-d tensor``; it gets params in their own
            dtypes, the box rounded inward to them.
        params: the first swarm's bacterium 0; the structure, shapes and dtypes.
        bounds: the box, as for :func:`functional_bfo.bfo`; coordinates with an open side
            take absolute steps and restart around ``params``.
        *args: data passed to every ``loss_fn`` call.
        max_evals: the budget, at least one update (``population_size * (swim_length + 1)``).
        key: the random key; the same key gives the same result.
        progress: a ``tqdm`` bar (lines without tqdm) and a summary at the end.
        **settings: ``population_size`` (8) and ``swim_length`` (1) of each swarm (the
            walker's rounds are as large), whose round goes to the evaluator in
            ``swim_batch`` (``swim_length + 1``: one) calls; ``step_size_min`` (1e-12 box widths);
            ``restart_after`` (30; None: never) updates without a gain of
            ``restart_rtol`` (0.01) of the way still to the best of the swarms before (while
            it holds the best: of its own descent for 3x as long, or in a valley its metric
            found of its last gain for D / 10 times as long, 1x to 3x) end a converging
            swarm, as do 2x the evaluations the best's swarm took, for a swarm behind it;
            ``metric_rate`` (2.0, of the swarms' metric and the walker's CMA-ES rates;
            0: isotropic tumbles and no walkers, needed beyond 2000 parameters);
            ``explore_after`` (2; None: never) failed swarms in a row (a wide walker
            behind the best is no failure) start the explorer,
            kicked by ``jitter`` (0.01) box widths; the last ``polish`` (0.1) of the budget
            polishes; any :func:`functional_bfo.adaptive_bfo` setting (``maximize``, ...).

    Returns:
        A :class:`BlackBoxResult`.

    Raises:
        ValueError: no bounds, a bad budget or setting.
        TypeError: params that are not a pytree of floating tensors, or ``relative_steps``.
        BaseException: whatever ``loss_fn`` (or Ctrl-C) raised, its type kept, with the
            rounds before as its ``partial_result`` (a :class:`BlackBoxResult`).

    Warns:
        RuntimeWarning: every loss evaluated was NaN or infinite.

    Examples:
        >>> import torch, functional_bfo as fb
        >>> f = lambda p: (p["x"] - 0.3).square().sum()
        >>> out = fb.black_box(f, {"x": torch.zeros(3, dtype=torch.float64)}, (-1.0, 1.0),
        ...                    max_evals=6000, key=fb.random.key(0))
        >>> bool(out.loss < 1e-8), out.num_evals <= 6000
        (True, True)
    """
    search = black_box_search(bounds, max_evals=max_evals, **settings)
    state = search.init(params, key=key)
    history: list[tuple[int, float]] = []
    show = reporter(progress, max_evals)

    def record(info: dict) -> None:  # run reports every round, and once more when it stops
        history.append((info["num_evals"], info["best_loss"]))
        if show is not None and (info["updates"] % 10 == 0 or "stopped" in info):
            show(info)

    try:
        state = run(search, state, loss_fn, *args, progress=record, log_every=1)
    except BaseException as e:  # the user's exception (or Ctrl-C), with what was found
        last = getattr(e, "last_good_state", state)
        with contextlib.suppress(AttributeError):  # an exception type without a __dict__
            e.partial_result = _result(last, history)  # type: ignore[attr-defined]
        e.add_note(f"functional_bfo.black_box: interrupted after {int(last.num_evals)} "
                   "evaluations; the best point found before is this exception's "
                   ".partial_result.")
        raise
    if not math.isfinite(float(state.best_loss)):
        warnings.warn(f"functional_bfo.black_box: every loss evaluated ({int(state.num_evals)}) is "
                      "NaN or infinite, so the search had nothing to follow; check loss_fn and "
                      "the bounds.", RuntimeWarning, stacklevel=2)
    return _result(state, history)


def _result(state: BlackBoxState, history: list) -> BlackBoxResult:
    """What :func:`black_box` found, the best point in the params' own dtypes."""
    found = as_given(state.best_row, layout(state.given), state.given_box)  # its loss's point
    return BlackBoxResult(found, state.best_loss, int(state.num_evals), int(state.restarts),
                          int(state.explorer_updates), history)


# A converging swarm's restart rules, each a named condition (docs/variants.md, "Restarts").
# Costs are losses with the sign that makes lower better; ``behind``: its progress has not
# reached the best of the swarms before it (``entry_best``).


def wide_restart(restarts: int) -> bool:
    """Odd restarts are wide walkers, the others swarms (BIPOP-CMA-ES's two regimes, in turn)."""
    return restarts % 2 == 1


def found_valley(condition: float) -> bool:
    """Its learned metric (read once a cycle) is stretched: the swarm is in a valley."""
    return condition > VALLEY_CONDITION


def progressed(now: float, progress: float, entry_best: float, first: float, gain: float,
               valley: bool, rtol: float) -> bool:
    """A gain of ``rtol`` of the way still to the best before, or of its own descent.

    Behind, the way to ``entry_best``; ahead, its descent from ``first`` (in a valley: last gain).
    """
    behind = progress > entry_best
    return (progress - now > rtol * (progress - entry_best if behind else first - progress)
            or (valley and not behind and progress - now > rtol * gain))


def stalled_out(stalled: int, limit: int, patience: float) -> bool:
    """``patience`` times ``limit`` evaluations without progress."""
    return stalled >= limit * patience


def patience(behind: bool, valley: bool, n: int) -> float:
    """How many stall windows a search waits in ``n`` dimensions: one behind the best.

    Holding it, a swarm waits ``HOLDING_PATIENCE`` (its descent can be slow); in a valley its
    step adapts, so ``n / WALKER_PATIENCE_D`` of them, from 1 up to ``HOLDING_PATIENCE`` (its
    metric learns in rounds that grow with ``n``).
    """
    if behind:
        return 1.0
    return min(max(n / WALKER_PATIENCE_D, 1.0), HOLDING_PATIENCE) if valley else HOLDING_PATIENCE


def overspent(spent: int, found_after: int, behind: bool) -> bool:
    """Behind, it spent ``BEHIND_BUDGET`` times what the best's swarm took to find it."""
    return behind and spent > BEHIND_BUDGET * found_after


def as_params(rows: Tensor, given: Params) -> Params:
    """Rows ``(..., D)`` as params like ``given``, in float64: views of ``rows``."""
    like = layout(given)
    return unravel(like._replace(dtypes=(torch.float64,) * len(like.dtypes),
                                 dtype=torch.float64), rows)


def as_given(row: Tensor, like: Layout, box: LeafBounds | None) -> Params:
    """A float64 row in the layout ``like``'s dtypes, clipped into its inward-rounded box."""
    return unravel(like, project(row, box, "clip"))


def _with(state: BlackBoxState, **fields: Any) -> BlackBoxState:
    """``state`` with ``fields`` replaced, numbers as tensors (an equal value keeps its tensor)."""
    for name, value in fields.items():
        if not isinstance(value, (Tensor, tuple)):
            old = getattr(state, name)
            fields[name] = old if old.item() == value else torch.tensor(value, dtype=old.dtype)
    return state._replace(**fields)
