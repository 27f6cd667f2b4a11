"""Canonical Bacterial Foraging Optimization (Passino 2002) as two pure functions over pytrees."""

from __future__ import annotations

import math
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ._ask_tell import Plan, Variant, costs_evaluation, cycle_ends, swim_optimizer, swim_settings
from ._base import Key, Optimizer, Params
from ._bounds import LeafBounds, sample_domain, update_box
from ._checks import check_bool, check_int
from ._chemotaxis import tumble_directions, walk
from ._layout import layout, ravel
from ._population import bacterium_noise, initial_population, per_run, reproduction_index
from ._tree import where
from .evaluate import Evaluator


class BFOHyperparams(NamedTuple):
    """Hyperparameters users tune or schedule, as 0-d tensors in the loss dtype.

    Changing them (see :func:`functional_bfo.with_hyperparams`) neither recompiles a
    compiled ``update`` nor breaks ``vmap`` over them.
    """

    step_size: Tensor  # C: length of a tumble or swim step
    elimination_prob: Tensor  # P_ed: probability that a bacterium is dispersed
    init_scale: Tensor  # spread of new bacteria on coordinates with no finite box
    levy_beta: Tensor  # stability index of Lévy tumbles (used when tumble="levy")
    d_attract: Tensor  # J_cc attractant depth
    w_attract: Tensor  # J_cc attractant width
    h_repel: Tensor  # J_cc repellent height
    w_repel: Tensor  # J_cc repellent width

    # (low, high, low_open) of each field, checked by bfo() and by with_hyperparams().
    RANGES = {  # type: ignore[misc]  # a class constant; mypy's NamedTuple has no ClassVar
        "step_size": (0.0, math.inf, False),
        "elimination_prob": (0.0, 1.0, False),
        "init_scale": (0.0, math.inf, True),
        "levy_beta": (0.0, 1.99, True),
        "d_attract": (0.0, math.inf, False),
        "w_attract": (0.0, math.inf, False),
        "h_repel": (0.0, math.inf, False),
        "w_repel": (0.0, math.inf, False),
    }


class BFOState(NamedTuple):
    """State of :func:`bfo`. Every leaf is a tensor on the params' device.

    The population is one ``(P, D)`` matrix, ``P = population_size`` and ``D`` the params'
    total size, float64 if any params leaf is, else float32. Losses are in the user's sign
    (maximized values when ``maximize=True``), non-finite losses replaced by the
    worst value (+inf, or -inf when maximizing), and NaN only before a bacterium is evaluated.
    """

    population: Tensor  # (P, D): bacterium i's params as row i (fb.as_params shows them)
    losses: Tensor  # (P,) loss at each position; float32, or float64 for float64 params
    health: Tensor  # (P,) cost accumulated since the last reproduction (lower is healthier)
    best_params: Params  # like params: the best position ever evaluated
    best_loss: Tensor  # () its loss
    key: Key  # (2,) int64; see bacterium_noise for how each step draws from it
    step: Tensor  # () int64, chemotactic steps taken (updates)
    num_evals: Tensor  # () int64, loss evaluations so far
    box: LeafBounds  # the rows' box: (D,) rows, or () where every coordinate shares it
    disagreeing_ranks: Tensor  # () int64: ranks whose candidates differed (fb.distributed)
    hyperparams: BFOHyperparams


def bfo(
    population_size: int = 50,
    *,
    step_size: float = 0.1,
    swim_length: int = 4,
    swim_batch: int = 1,
    chemotaxis_steps: int = 100,
    reproduction_steps: int = 4,
    elimination_prob: float = 0.25,
    swarming: bool = False,
    d_attract: float = 0.1,
    w_attract: float = 0.2,
    h_repel: float = 0.1,
    w_repel: float = 10.0,
    tumble: str = "gaussian",
    levy_beta: float = 1.5,
    bounds: Any = None,
    boundary: str = "reflect",
    init_scale: float = 1.0,
    maximize: bool = False,
    evaluator: Evaluator | None = None,
) -> Optimizer:
    r"""Canonical Bacterial Foraging Optimization (Passino 2002).

    One ``update`` is one chemotactic step of the whole population. For bacterium
    :math:`i` at position :math:`\theta_i` with cost :math:`J_i` (the loss, plus
    :math:`J_{cc}` when ``swarming``):

    .. math::

        \begin{aligned}
        &\textbf{if } s > 0 \text{ and } N_c \mid s:\ \text{the healthiest half (lowest }
            \textstyle\sum J\text{) splits, health resets} \\
        &\textbf{if } s > 0 \text{ and } N_c N_{re} \mid s:\ \text{each bacterium moves to a
            random place with probability } P_{ed} \\
        &\phi_i = \Delta_i / \lVert\Delta_i\rVert,\quad \Delta_i \sim \mathcal{N}(0, I)
            \quad\text{(tumble)} \\
        &\theta_i^{(k)} = \operatorname{bound}(\theta_i + k\, C\, \phi_i),\quad
            k = 1, \dots, N_s + 1 \quad\text{(swim, all evaluated)} \\
        &\theta_i \leftarrow \theta_i^{(k^*)},\quad k^* = \text{first } k \text{ with }
            J(\theta_i^{(k)}) \ge J(\theta_i^{(k-1)}),\ \text{else } N_s + 1
        \end{aligned}

    This is Passino's trajectory exactly (the move is unconditional, the swim continues while
    it improves), except that every point of the swim ray is evaluated in a fixed number of
    batched calls: ``P (N_s + 1)`` evaluations per update, none repeated, and points past the
    stop still update the best ever seen. A bacterium whose loss is unknown (at start, or
    just dispersed) spends its first evaluation on its own position.

    Args:
        population_size: number of bacteria ``S``; the initial params are bacterium 0.
        step_size: ``C``, the length of a tumble or swim step (a tunable tensor in the state).
        swim_length: ``N_s``, the most swim steps after a tumble.
        swim_batch: how many of the swim's ``N_s + 1`` points go to the evaluator in one
            call, as ``swim_batch * P`` stacked candidates; ``swim_length + 1`` evaluates the
            whole ray at once, faster eagerly for cheap losses (compiled: no gain) but holding
            that many times the candidates and activations (and ``hybrid_bfo``'s gradients).
            Results do not depend on it, beyond the last bits of losses whose kernels round
            by batch shape (matrix products).
        chemotaxis_steps: ``N_c``, updates between reproductions.
        reproduction_steps: ``N_re``, reproductions between elimination–dispersal events.
        elimination_prob: ``P_ed``, the chance a bacterium is dispersed at such an event.
        swarming: add Passino's cell-to-cell term ``J_cc`` to the cost the swim compares.
            Off by default: its constants are absolute, so it distorts losses below ~0.1,
            and it costs a (P, P) distance matrix per swim step.
        d_attract: ``J_cc`` attractant depth.
        w_attract: ``J_cc`` attractant width.
        h_repel: ``J_cc`` repellent height.
        w_repel: ``J_cc`` repellent width.
        tumble: ``"gaussian"`` (unit steps) or ``"levy"`` (step lengths drawn by Mantegna's
            algorithm, heavy-tailed, capped at 1000 steps).
        levy_beta: stability index of Lévy tumbles, in (0, 1.99] (Mantegna's range).
        bounds: None; a ``(low, high)`` pair of numbers or tensors for every leaf; or a pytree
            like params with a ``(low, high)`` pair per leaf (use ``±inf`` for an open side).
        boundary: how a step that leaves the box comes back: ``"clip"``, ``"reflect"`` or
            ``"wrap"``. No position ever leaves the box.
        init_scale: standard deviation of the initial (and dispersed) bacteria around the
            params on coordinates with no finite box; within a finite box they are uniform.
        maximize: maximize the loss instead.
        evaluator: how the population is evaluated; default
            :func:`functional_bfo.evaluate.vmap` with no chunking.

    Returns:
        An :class:`~functional_bfo.Optimizer` of pure ``init(params, *, key)`` and
        ``update(state, loss_fn, *args)``.

    Raises:
        ValueError: a hyperparameter is out of range or bounds are malformed.

    Examples:
        >>> import torch, functional_bfo as fb
        >>> opt = fb.bfo(population_size=8, chemotaxis_steps=5)
        >>> state = opt.init({"x": torch.ones(3)}, key=fb.random.key(0))
        >>> for _ in range(20):
        ...     state = opt.update(state, lambda p: p["x"].square().sum())
        >>> bool(state.best_loss < 3.0), int(state.num_evals)
        (True, 800)

    BFO is a slow, robust, derivative-free local-to-global search: use it for small (up to ~10^4
    parameters), non-differentiable, noisy or multimodal problems. For smooth problems a gradient
    method is far cheaper; for hard black-box problems CMA-ES usually converges faster.

    References:
        K. M. Passino, `Biomimicry of bacterial foraging for distributed optimization and
        control <https://doi.org/10.1109/MCS.2002.1004010>`_, 2002.
        R. N. Mantegna, `Fast, accurate algorithm for numerical simulation of Lévy stable
        stochastic processes <https://doi.org/10.1103/PhysRevE.49.4677>`_, 1994.
    """
    checked = swim_settings(locals(), BFOHyperparams.RANGES)  # the arguments
    n_re = check_int("reproduction_steps", reproduction_steps, 1)
    check_bool("swarming", swarming)
    return swim_optimizer(BFO, BFOSettings(**checked, reproduction_steps=n_re, swarming=swarming))


class BFOSettings(NamedTuple):
    """The validated settings of a :func:`bfo` optimizer (its tensors' initial values too)."""

    size: int
    swims: int
    chemotaxis_steps: int
    reproduction_steps: int
    swarming: bool
    tumble: str
    bounds: Any
    boundary: str
    closed: bool  # every side of the box is finite (is_closed)
    sign: float
    swim_batch: int
    evaluator: Evaluator
    hyper: dict[str, float]  # BFOHyperparams' initial values


def bfo_init(static: BFOSettings, params: Params, *, key: Key) -> BFOState:
    """The params as bacterium 0, the rest spread around them (or over the box)."""
    start = initial_population(params, key, static.size, static.bounds,
                               static.hyper["init_scale"])
    return per_run(BFOState(**start.state_fields(static.sign, static.hyper, BFOHyperparams)))


def bfo_plan(static: BFOSettings, state: BFOState, cycles: bool) -> Plan:
    """Reproduction, dispersal and the tumble: the update's swim, before any loss."""
    hp, dtype, shape = state.hyperparams, state.losses.dtype, layout(state.best_params)
    box = update_box(state.box, static.bounds, static.closed)
    best = ravel(shape, state.best_params)
    noise = bacterium_noise(state.key, state.step, static.size, shape.size, dtype)
    n_c, n_re = static.chemotaxis_steps, static.reproduction_steps
    population, losses, health = state.population, state.losses, state.health
    if cycles:  # else the driver knows that no cycle ends here (at_step)
        ends = cycle_ends(state.step, n_c)  # the healthiest half splits, health restarts at 0
        source = reproduction_index(health, ends)
        population, losses = population.index_select(0, source), losses.index_select(0, source)
        health = torch.where(ends, 0.0, health)
    cost = static.sign * losses  # NaN where never evaluated
    known = ~torch.isnan(cost)
    if cycles:  # elimination-dispersal
        dispersed = ends & (state.step % (n_c * n_re) == 0) & (noise.coin < hp.elimination_prob)
        population = where(dispersed, sample_domain(best, noise.place, box, hp.init_scale),
                           population)
        known = known & ~dispersed

    swarm_cost = None
    if static.swarming:  # J_cc against the population as it stands at the start of the step
        swarm_cost = partial(cell_to_cell, swarm=population, hp=hp, dtype=dtype,
                             swarm_sq=population.to(dtype).square().sum(1))
        cost = cost + swarm_cost(population)

    direction, steps = tumble_directions(noise, static.tumble, hp.levy_beta, hp.step_size)
    ray, carry = walk(population, direction, steps, known, cost,
                      (best, static.sign * state.best_loss), bounds=box,
                      boundary=static.boundary, swims=static.swims, swarm_cost=swarm_cost)
    return Plan(ray, carry, None, health, None, shape, static.size * (static.swims + 1))


def cell_to_cell(positions: Tensor, swarm: Tensor, swarm_sq: Tensor, hp: BFOHyperparams,
                 dtype: torch.dtype) -> Tensor:
    """Passino's J_cc (eq. 2) of each row of ``positions`` against ``swarm``, shape (P,).

    Squared distances as ``|a|^2 + |b|^2 - 2 a.b``: a (P, P) matrix, never (P, P, D).
    """
    a = positions.to(dtype)
    cross = torch.einsum("pd,qd->pq", a, swarm.to(dtype))
    d2 = (a.square().sum(1).unsqueeze(1) + swarm_sq.unsqueeze(0) - 2 * cross).clamp_min(0)
    return (-hp.d_attract * torch.exp(-hp.w_attract * d2)
            + hp.h_repel * torch.exp(-hp.w_repel * d2)).sum(dim=1)


BFO = Variant("bfo", BFOState, bfo_init, bfo_plan, costs_evaluation)
