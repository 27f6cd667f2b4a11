"""Adaptive BFO: per-bacterium step sizes (the 1/5th rule) and pressure-driven dispersal.

After Chen, Zhu & Hu, "Adaptive Bacterial Foraging Optimization", 2011.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from . import _metric as metric
from ._ask_tell import Plan, Variant, costs_evaluation, cycle_ends, swim_optimizer, swim_settings
from ._base import Key, Optimizer, Params
from ._bounds import LeafBounds, box_relative, flat_box, sample_domain, update_box
from ._checks import check_bool, check_float, check_int, check_ordered
from ._chemotaxis import SwimResult, tumble_directions, walk
from ._layout import layout, ravel
from ._population import Noise, bacterium_noise, initial_population, per_run, reproduction_index
from ._tree import diversity, first_min, where
from .evaluate import Evaluator


class AdaptiveBFOHyperparams(NamedTuple):
    """Hyperparameters users tune or schedule, as 0-d tensors in the loss dtype."""

    step_size: Tensor  # C_0: initial (and post-dispersal) step size of every bacterium
    step_size_min: Tensor  # floor of the adapted step sizes
    step_size_max: Tensor  # ceiling of the adapted step sizes
    adaptation_rate: Tensor  # a: success multiplies C_i by e^a, failure by e^(-a/4)
    elimination_prob: Tensor  # P_ed with no stagnation and full diversity
    elimination_prob_max: Tensor  # P_ed under full pressure
    init_scale: Tensor  # spread of new bacteria on coordinates with no finite box
    levy_beta: Tensor  # stability index of Lévy tumbles (used when tumble="levy")

    # (low, high, low_open) of each field, checked by adaptive_bfo() and with_hyperparams().
    RANGES = {  # type: ignore[misc]  # a class constant; mypy's NamedTuple has no ClassVar
        "step_size": (0.0, math.inf, False),
        "step_size_min": (0.0, math.inf, True),
        "step_size_max": (0.0, math.inf, False),
        "adaptation_rate": (0.0, 5.0, False),
        "elimination_prob": (0.0, 1.0, False),
        "elimination_prob_max": (0.0, 1.0, False),
        "init_scale": (0.0, math.inf, True),
        "levy_beta": (0.0, 1.99, True),
    }
    ORDERED = (("step_size_min", "step_size_max"),)  # type: ignore[misc]  # a class constant


class AdaptiveBFOState(NamedTuple):
    """State of :func:`adaptive_bfo`: :class:`~functional_bfo.BFOState`'s fields, plus five."""

    population: Tensor  # (P, D): bacterium i's params as row i
    losses: Tensor  # (P,) loss at each position (NaN before the first evaluation)
    health: Tensor  # (P,) cost accumulated since the last reproduction
    best_params: Params  # like params: the best position ever evaluated
    best_loss: Tensor  # () its loss
    key: Key  # (2,) int64
    step: Tensor  # () int64, updates taken
    num_evals: Tensor  # () int64, loss evaluations so far
    box: LeafBounds  # the rows' box: (D,) rows, or () where every coordinate shares it
    disagreeing_ranks: Tensor  # () int64: ranks whose candidates differed (fb.distributed)
    step_sizes: Tensor  # (P,) each bacterium's own step size C_i
    stall: Tensor  # () int64, updates since the best loss last improved
    reference_diversity: Tensor  # () diversity of the initial population
    active_size: Tensor  # () int64, bacteria in play: the first active_size slots
    hyperparams: AdaptiveBFOHyperparams
    metric: metric.TumbleMetric  # the learned tumble metric (of 0 coordinates: none)


def adaptive_bfo(
    population_size: int = 32,
    *,
    step_size: float = 0.1,
    step_size_min: float = 1e-7,
    step_size_max: float = 1.0,
    adaptation_rate: float = 0.3,
    swim_length: int = 4,
    swim_batch: int = 1,
    chemotaxis_steps: int = 10,
    elimination_prob: float = 0.02,
    elimination_prob_max: float = 0.25,
    stagnation_steps: int = 20,
    min_population_size: int | None = None,
    tumble: str = "gaussian",
    levy_beta: float = 1.5,
    bounds: Any = None,
    boundary: str = "reflect",
    relative_steps: bool = False,
    metric_rate: float = 0.0,
    init_scale: float = 1.0,
    maximize: bool = False,
    evaluator: Evaluator | None = None,
) -> Optimizer:
    r"""Adaptive BFO: self-tuning step sizes and dispersal, with static shapes.

    Each update is a chemotactic step as in :func:`functional_bfo.bfo`, with three changes:

    .. math::

        \begin{aligned}
        &\theta_i \leftarrow \text{the last point of the swim ray } \theta_i + k C_i
            \phi_i \text{ no worse than the one before (or stay)} \\
        &C_i \leftarrow \operatorname{clip}\big(C_i\, e^{a}\big) \text{ if } \theta_i
            \text{ moved, else } \operatorname{clip}\big(C_i\, e^{-a/4}\big) \\
        &P_{ed} = P_{ed}^{0} + (P_{ed}^{max} - P_{ed}^{0})\,\min\!\Big(1, \max\big(
            \tfrac{\text{stall}}{N_{stag}},\ 1 - \tfrac{\text{diversity}}{\text{diversity}_0}
            \big)\Big)
        \end{aligned}

    The success rule settles where one step in five succeeds (Rechenberg's 1/5th rule), so
    each bacterium's step shrinks near an optimum and grows on a slope; a tie counts as a
    success, so on a plateau (a step function, a loss flat to its precision) steps grow until
    they see past it instead of freezing. At every reproduction (every ``chemotaxis_steps``
    updates; copies inherit their parent's step size) bacteria are dispersed with probability
    :math:`P_{ed}`, which rises as the best loss stalls or the swarm collapses; the bacterium
    holding the best cost is never dispersed, and a dispersed one restarts at :math:`C_0`.

    Args:
        population_size: number of bacteria; the initial params are bacterium 0.
        step_size: ``C_0``, every bacterium's initial (and post-dispersal) step size,
            clamped into ``[step_size_min, step_size_max]``.
        step_size_min: floor of the step sizes, at most ``step_size_max``.
        step_size_max: ceiling of the step sizes; it wins over ``step_size``, so lowering
            it alone caps every step (a floor above it is refused, here and by
            :func:`~functional_bfo.with_hyperparams`).
        adaptation_rate: ``a`` above.
        swim_length: ``N_s``, the most swim steps after a tumble.
        swim_batch: swim points per evaluator call, as in :func:`functional_bfo.bfo`.
        chemotaxis_steps: updates between reproductions (and dispersal events).
        elimination_prob: ``P_ed`` with no pressure.
        elimination_prob_max: ``P_ed`` under full pressure.
        stagnation_steps: ``N_stag``, updates without improvement that mean full pressure.
        min_population_size: let the active population vary between this and ``population_size`` (a
            mask over the fixed buffer): at each reproduction it grows by ``max(1, P // 8)`` once
            the best has stalled ``stagnation_steps`` updates and shrinks by one while the best
            improves. Inactive slots neither move nor count in ``num_evals`` (``vmap`` still
            computes their padding evaluations). None keeps all ``population_size`` active.
        tumble: ``"gaussian"`` or ``"levy"`` (see :func:`functional_bfo.bfo`).
        levy_beta: stability index of Lévy tumbles, in (0, 1.99].
        bounds: as in :func:`functional_bfo.bfo`.
        boundary: ``"clip"``, ``"reflect"`` or ``"wrap"``.
        relative_steps: measure ``step_size``, ``step_size_min`` and ``step_size_max`` in units of
            each coordinate's box width where the box is finite (absolute where it is not), so one
            setting suits a +-1 box and a +-600 one. Part of the black-box setup (docs/variants.md).
        metric_rate: above 0, tumbles follow a metric (``state.metric``) learned from the
            swarm's successful tumbles at this rate (2.0 in the black-box setup), so that they
            point along a narrow rotated valley; a lone bacterium learns from its evolution
            path, as the (1+1)-CMA-ES does (docs/variants.md). It costs ``n^2`` memory and
            ``n^3`` time per update for ``n`` parameters, so it is limited to 2000.
        init_scale: spread of new bacteria on coordinates with no finite box.
        maximize: maximize the loss instead.
        evaluator: how the population is evaluated (default ``evaluate.vmap()``).

    Returns:
        An :class:`~functional_bfo.Optimizer` of pure ``init`` and ``update``.

    Raises:
        ValueError: a hyperparameter is out of range or bounds are malformed.

    Examples:
        >>> import torch, functional_bfo as fb
        >>> opt = fb.adaptive_bfo(population_size=8)
        >>> state = opt.init({"x": torch.ones(3)}, key=fb.random.key(0))
        >>> state = fb.run(opt, state, lambda p: p["x"].square().sum(), max_steps=100)
        >>> bool(state.best_loss < 1e-3)
        True

    References:
        H. Chen, Y. Zhu, K. Hu, `Adaptive bacterial foraging optimization
        <https://doi.org/10.1155/2011/108269>`_, 2011.
        I. Rechenberg, Evolutionsstrategie, 1973 (the 1/5th success rule).
    """
    return swim_optimizer(ADAPTIVE, swarm_settings(**locals()))  # the arguments above


def swarm_settings(population_size: int, **given: Any) -> AdaptiveSettings:
    """:func:`adaptive_bfo`'s validated settings; its defaults where not ``given`` (hybrid too)."""
    defaults = adaptive_bfo.__kwdefaults__ or {}
    if unknown := sorted(given.keys() - defaults.keys()):
        raise TypeError(f"adaptive_bfo() got an unexpected keyword argument {unknown[0]!r}")
    a = {**defaults, **given, "population_size": population_size}
    checked = swim_settings(a, AdaptiveBFOHyperparams.RANGES)
    n_stag = check_int("stagnation_steps", a["stagnation_steps"], 1)
    size = checked["size"]
    min_size = size if a["min_population_size"] is None else check_int(
        "min_population_size", a["min_population_size"], 1)
    if min_size > size:
        raise ValueError(f"Invalid min_population_size: {a['min_population_size']}; expected "
                         f"at most population_size={size}.")
    check_ordered(checked["hyper"], AdaptiveBFOHyperparams.ORDERED)
    check_bool("relative_steps", a["relative_steps"])
    return AdaptiveSettings(**checked, stagnation_steps=n_stag, min_size=min_size,
                            relative_steps=a["relative_steps"],
                            metric_rate=check_float("metric_rate", a["metric_rate"], 0.0))


def adaptive_init(static: AdaptiveSettings, params: Params, *, key: Key) -> AdaptiveBFOState:
    """The BFO start, every bacterium at the initial step size, and an isotropic metric."""
    size, rate, hyper = static.size, static.metric_rate, static.hyper
    start = initial_population(params, key, size, static.bounds, hyper["init_scale"])
    dtype, device, shape = start.dtype, start.key.device, layout(params)
    if rate > 0 and (n := shape.size) > metric.MAX_METRIC_SIZE:
        raise ValueError(f"metric_rate={rate} learns a {n} x {n} tumble metric; it is limited "
                         f"to {metric.MAX_METRIC_SIZE} parameters (n^2 memory, n^3 time per "
                         "update). Pass metric_rate=0 for isotropic tumbles.")
    box = flat_box(static.bounds if static.relative_steps else None, shape, device, torch.float64)
    return per_run(AdaptiveBFOState(
        **start.state_fields(static.sign, hyper, AdaptiveBFOHyperparams),
        step_sizes=torch.full((size,), hyper["step_size"], dtype=dtype, device=device).clamp(
            hyper["step_size_min"], hyper["step_size_max"]),
        stall=torch.zeros((), dtype=torch.int64, device=device),
        reference_diversity=diversity(start.population, dtype),
        active_size=torch.tensor(size, dtype=torch.int64, device=device),
        metric=metric.isotropic(metric.widths(box, shape.size, device) if rate > 0
                                else torch.zeros(0, dtype=torch.float64, device=device)),
    ))


class AdaptiveSettings(NamedTuple):
    """The validated settings of an :func:`adaptive_bfo` optimizer."""

    size: int
    swims: int
    chemotaxis_steps: int
    stagnation_steps: int
    bounds: Any
    boundary: str
    tumble: str
    sign: float
    min_size: int  # smallest active population (== size: fixed)
    relative_steps: bool  # steps in units of the box width where it is finite
    swim_batch: int  # swim points per evaluator call
    metric_rate: float  # learning rate of the tumble metric (0: none)
    closed: bool  # every side of the box is finite (is_closed)
    evaluator: Any
    hyper: dict[str, float]  # the hyperparameters' initial values
    gradient: Any = None  # hybrid_bfo's GradientSettings (None: no gradients)


class AdaptiveKeep(NamedTuple):
    """What an adaptive update keeps from before its swim for after it."""

    step_sizes: Tensor  # (P,) clamped step sizes after reproduction and dispersal
    active_size: Tensor  # () the active population size
    source: Tensor  # (P,) reproduction source of each slot
    known: Tensor  # (P,) whether each bacterium knew its loss before the swim


def adaptive_plan(static: AdaptiveSettings, state: Any, cycles: bool, steer=None,
                  start_aux=None) -> Plan:
    """Reproduce, disperse and tumble: the update's greedy swim, before any loss.

    ``steer(direction, source, known)`` bends the tumble and ``start_aux(source, known)`` is the aux
    kept where a bacterium stays (the hybrid's gradients).
    """
    size, sign = static.size, static.sign
    hp, dtype, shape = state.hyperparams, state.losses.dtype, layout(state.best_params)
    box = update_box(state.box, static.bounds, static.closed)
    best = ravel(shape, state.best_params)
    noise = bacterium_noise(state.key, state.step, size, shape.size, dtype)

    slots = torch.arange(size, device=state.step.device)
    population, losses, step_sizes = state.population, state.losses, state.step_sizes
    health, count, source, dispersed = state.health, state.active_size, slots, None
    if cycles:  # else the driver knows that no cycle ends here (at_step)
        flag = cycle_ends(state.step, static.chemotaxis_steps)
        health = torch.where(flag, 0.0, health)
        if size > 1:  # reproduction copies a lone bacterium, and as the leader it stays
            population, losses, step_sizes, count, source, dispersed = cycle_event(
                static, flag, state, slots, noise, best, box, dtype)
    if dispersed is None:  # no event could fire: nobody dispersed (one op, only then)
        dispersed = torch.zeros_like(slots, dtype=torch.bool)
    # Within the current bounds, the ceiling winning: a lowered step_size_max caps every step.
    step_sizes = step_sizes.clamp(hp.step_size_min, hp.step_size_max)
    cost = sign * losses  # NaN where never evaluated
    # A fixed population has every slot active: no masks (bitwise the same, fewer ops).
    active = slots < count if static.min_size < size else None
    known = ~torch.isnan(cost) & ~dispersed
    if active is not None:
        known = known & active

    direction, steps = tumble_directions(noise, static.tumble, hp.levy_beta, step_sizes)
    if static.relative_steps:
        direction = box_relative(direction, box)
    if static.metric_rate > 0:
        direction = metric.shape_directions(state.metric, direction)
    if steer is not None:
        direction = steer(direction, source, known)
    steps = steps if active is None else steps * active
    ray, carry = walk(population, direction, steps, known, cost, (best, sign * state.best_loss),
                      bounds=box, boundary=static.boundary, swims=static.swims, greedy=True,
                      stay_aux=None if start_aux is None else start_aux(source, known))
    keep = AdaptiveKeep(step_sizes, count, source, known)
    return Plan(ray, carry, active, health, keep, shape, count * (static.swims + 1), held=cost)


def cycle_event(static: AdaptiveSettings, flag: Tensor, state: Any, slots: Tensor, noise: Noise,
                best: Tensor, box: LeafBounds | None, dtype: torch.dtype) -> tuple[Tensor, ...]:
    """Reproduction, then dispersal under pressure, where ``flag`` holds: the swarm's new rows."""
    hp, stall, count, size = state.hyperparams, state.stall, state.active_size, static.size
    varying = static.min_size < size
    source = reproduction_index(state.health, flag, count if varying else None)
    population, losses, step_sizes = (x.index_select(0, source) for x in (
        state.population, state.losses, state.step_sizes))
    cost = static.sign * losses  # NaN where never evaluated
    spread = diversity(population, dtype) / state.reference_diversity.clamp_min(1e-30)
    pressure = torch.maximum(stall.to(dtype) / static.stagnation_steps, 1 - spread).clamp(0, 1)
    p_ed = hp.elimination_prob + (hp.elimination_prob_max - hp.elimination_prob) * pressure
    if varying:  # grow under pressure, shrink while improving; woken slots start afresh
        stalled = stall >= static.stagnation_steps
        change = torch.where(stalled, max(1, size // 8), (stall == 0).long().neg())
        new_count = torch.where(flag, (count + change).clamp(static.min_size, size), count)
        woken = (slots < new_count) & (slots >= count)
        count = new_count
    unknown = torch.isnan(cost) if not varying else torch.isnan(cost) | (slots >= count)
    leader = first_min(torch.where(unknown, torch.inf, cost))[1]
    dispersed = flag & (noise.coin < p_ed) & (slots != leader)
    if varying:
        dispersed = (dispersed & (slots < count)) | woken
    population = where(dispersed, sample_domain(best, noise.place, box, hp.init_scale),
                       population)
    step_sizes = torch.where(dispersed, hp.step_size, step_sizes)
    return population, losses, step_sizes, count, source, dispersed


def adaptive_finish(static: AdaptiveSettings, state: AdaptiveBFOState, plan: Plan,
                    result: SwimResult) -> dict:
    """Its own fields, and the metric learned from the tumbles that moved a known bacterium."""
    learned, known = state.metric, plan.keep.known
    if static.metric_rate > 0:  # in float64, each side cast first, as the metric sees it
        steps = (result.population.to(torch.float64)
                 - state.population.index_select(0, plan.keep.source).to(torch.float64))
        learned = metric.learn(state.metric, steps, known & (steps != 0).any(dim=1),
                               static.metric_rate, known)
    return dict(**adaptive_fields(static, state, plan, result), metric=learned)


def adaptive_fields(static: AdaptiveSettings, state: Any, plan: Plan, result: SwimResult) -> dict:
    """The update after its swim: the 1/5th success rule, the stall count, the counters."""
    hp, keep = state.hyperparams, plan.keep
    # The 1/5th success rule (a tie moves and counts as a success), only where the cost was known.
    grow = torch.where(result.moved & keep.known, hp.adaptation_rate, -hp.adaptation_rate / 4)
    adapted = (keep.step_sizes * torch.exp(grow)).clamp(hp.step_size_min, hp.step_size_max)
    improved = result.best_cost < static.sign * state.best_loss
    return dict(
        step_sizes=torch.where(keep.known, adapted, keep.step_sizes),
        stall=torch.where(improved, torch.zeros_like(state.stall), state.stall + 1),
        reference_diversity=state.reference_diversity,
        active_size=keep.active_size,
    )


ADAPTIVE = Variant("adaptive_bfo", AdaptiveBFOState, adaptive_init, adaptive_plan,
                   costs_evaluation, adaptive_finish)
