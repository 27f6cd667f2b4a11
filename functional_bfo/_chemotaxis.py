"""Chemotaxis: tumble directions (Gaussian or Lévy–Mantegna) and the swim along them.

A tumble picks a unit direction uniformly on the sphere (a normalized Gaussian; Passino
draws each coordinate in [-1, 1], which favours the cube's diagonals). The swim walks the
ray ``theta + k * C * phi`` for ``k = 1 .. N_s + 1`` and stops at the first step that does
not improve on the previous one. Every point of the ray is evaluated, so no evaluation is
repeated and the count per update is fixed; points past the stop still count towards the
best ever seen. The points go to the evaluator ``per_call`` at a time (stacked as
``per_call * P`` candidates): fewer calls cost less per-call overhead, more points per
call hold more candidates (and the loss's activations) at once; the trajectory is the
same. Variants reuse ``swim`` with their own directions, step lengths and evaluations.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ._base import Params
from ._bounds import LeafBounds, project
from ._checks import check_losses
from ._layout import Layout, unravel
from ._tree import first_min, where

TUMBLES = ("gaussian", "levy")
LEVY_MAX_LENGTH = 1e3  # Mantegna's ratio has no finite variance; cap it so f16 stays finite
# A swim whose candidates hold this many elements per point builds each point when it is
# evaluated, one after another (see ``after``). A smaller one builds every point at once
# (2.6 MB at most) and takes its best row from them: fewer ops per eager update, and
# inductor may fuse the points side by side.
ORDER_POINTS_FROM = 1 << 16


def mantegna_sigma(beta: Tensor) -> Tensor:
    """Scale of Mantegna's numerator normal for stability index ``beta`` (Mantegna 1994)."""
    log_ratio = torch.lgamma(1 + beta) - torch.lgamma((1 + beta) / 2)
    rest = torch.sin(math.pi * beta / 2) / (beta * 2 ** ((beta - 1) / 2))
    return (torch.exp(log_ratio) * rest) ** (1 / beta)


def tumble_directions(z: Tensor, u: Tensor, v: Tensor, kind: str, levy_beta: Tensor):
    """Unit directions and step-length multipliers of the whole population.

    ``z`` is (P, D) standard normals: normalizing each bacterium's row gives a direction
    uniform on the sphere. The multiplier is 1 for Gaussian tumbles, else Mantegna's
    ``sigma |u| / |v|^(1/beta)`` from the normals ``u``, ``v`` (P,).
    """
    direction = z * torch.rsqrt(z.to(u.dtype).square().sum(1)).unsqueeze(1)
    if kind == "gaussian":
        return direction, torch.ones_like(u)
    beta = levy_beta.to(u.dtype)
    length = mantegna_sigma(beta) * u.abs() / v.abs() ** (1 / beta)
    return direction, length.clamp(max=LEVY_MAX_LENGTH)


def ray_point(population: Tensor, direction: Tensor, distance: Tensor,
              bounds: LeafBounds | None, mode: str) -> Tensor:
    """``project(theta + distance * phi)`` per bacterium (rows ``(P, D)``).

    ``distance`` of shape (P,) gives one point per bacterium; of shape (G, P), G points each,
    stacked point-major as ``G * P`` rows (row ``g * P + i`` is bacterium i's point g).
    """
    point = project(population + distance.unsqueeze(-1) * direction, bounds, mode)
    if distance.dim() > 1:  # not -1: with D = 0 it would be undetermined
        point = point.reshape(distance.numel(), population.shape[-1])
    return point


class SwimResult(NamedTuple):
    """Where each bacterium ends its swim, and what was learned on the way."""

    population: Tensor  # (P, D) final positions
    raw_cost: Tensor  # (P,) sign-adjusted loss there (+inf if non-finite)
    cost: Tensor  # (P,) the cost the swim compared: raw_cost plus J_cc when swarming
    aux: Any  # the evaluation's auxiliary output there (e.g. gradients), or None
    best_params: Tensor  # (D,) the elitist best over every evaluated point
    best_cost: Tensor
    moved: Tensor  # (P,) bool: the bacterium left where it stood


def walk(
    population: Tensor,
    direction: Tensor,
    step_length: Tensor,
    start: Tensor,
    *,
    bounds: LeafBounds | None,
    boundary: str,
    swims: int,
    swarm_cost: Callable[[Params], Tensor] | None = None,
    greedy: bool = False,
    ties: bool = False,
) -> Ray:
    """The ray ``theta + (start + k) C phi`` for ``k = 0 .. swims`` (``C = step_length``).

    A bacterium reaches point ``k + 1`` while each point it reached improved on the one
    before. Passino's bacterium ends at the last point it reached, improving or not;
    ``greedy`` ends at the last point that improved, or stays. With ``ties`` a point as good
    as the one before counts as improved, so a greedy swim drifts across a plateau.
    """
    ks = torch.arange(swims + 1, dtype=step_length.dtype, device=step_length.device)
    distances = (start + ks.unsqueeze(1)) * step_length
    built = (ray_point(population, direction, distances, bounds, boundary)
             if population.numel() < ORDER_POINTS_FROM else None)
    return Ray(population, direction, distances, built, bounds, boundary, swarm_cost, greedy,
               ties)


class Plan(NamedTuple):
    """One update before any loss: the ray, the swim's start, and what the variant keeps.

    ``active`` (P,) marks the bacteria in play (None: all); the others' points are padding,
    scored +inf whatever they cost. ``keep`` is the variant's own (its ``assemble`` reads it).
    ``shape`` is the layout of the rows, read once from the state's ``best_params``.
    """

    ray: Ray
    carry: SwimCarry
    active: Tensor | None
    keep: Any
    shape: Layout

    def needed(self) -> Tensor:
        """(N_s + 1) P bools, point-major: the candidates whose loss the update reads."""
        rows = self.ray.distances.shape[0]
        if self.active is None:
            return torch.ones(self.ray.distances.numel(), dtype=torch.bool,
                              device=self.ray.distances.device)
        return self.active.repeat(rows)

    def padded(self, costs: Tensor) -> Tensor:
        """``costs`` of stacked points with the padding rows at +inf: they never win nor move.

        Their aux (gradients) is kept: it only reaches slots out of play, which never lend
        it to one in play (a slot woken up starts afresh).
        """
        if self.active is None:
            return costs
        return torch.where(self.active, costs.reshape(-1, self.active.shape[0]),
                           torch.inf).reshape(-1)

    def swim(self, evaluate: Callable[[Params], tuple[Tensor, Any]], per_call: int) -> SwimResult:
        """``update``'s swim: the points ``per_call`` at a time to ``evaluate``.

        ``evaluate`` maps stacked candidates (``G * P`` rows) to ``(cost, aux)``; ``aux``
        is kept at each final point without storing the whole ray.
        """
        ray, carry = self.ray, self.carry
        raw: Tensor | None = None
        aux: Any = None
        for first in range(0, ray.distances.shape[0], per_call):
            along = ray.distances[first:first + per_call]  # (G, P)
            if ray.built is None and raw is not None:  # after the previous points' outcome
                along = after(along, raw, *optree.tree_leaves(aux))
            candidates = ray.points(along, first)
            raw, aux = evaluate(candidates)
            raw = self.padded(raw)
            carry = ray.take(carry, along, candidates, raw, aux)
        return ray.finish(carry)

    def told(self, costs: Tensor, aux: Any) -> SwimResult:
        """``tell``'s swim: every point's cost (and aux) at once.

        The candidates are rebuilt from the ray (only J_cc reads them), not taken from the
        caller, whose copy may have been edited.
        """
        ray = self.ray
        candidates = ray.points(ray.distances) if ray.swarm_cost is not None else None
        return ray.finish(ray.take(self.carry, ray.distances, candidates, self.padded(costs),
                                   aux))


class SwimCarry(NamedTuple):
    """A swim between its points: where each bacterium ends so far, and the best seen."""

    running: Tensor  # (P,) bool: every point reached so far improved on the one before
    previous: Tensor  # (P,) the compared cost of the last point reached
    distance: Tensor  # (P,) where it ends along the ray (NaN: where it stands)
    raw_cost: Tensor  # (P,) there
    cost: Tensor  # (P,) there (raw_cost plus J_cc when swarming)
    aux: Any  # there
    best_params: Tensor  # (D,) the best before this swim
    best_cost: Tensor
    seen: tuple[Tensor, ...] = ()  # every batch's raw costs so far, point-major


class Ray(NamedTuple):
    """One update's swim: the ray every bacterium walks, known before any loss is.

    Every point is evaluated whatever the losses, so the candidates are fixed up front;
    the losses, taken a batch of points at a time, only decide where each bacterium ends.
    """

    population: Tensor  # (P, D)
    direction: Tensor  # (P, D)
    distances: Tensor  # (N_s + 1, P): every point's place on the ray
    built: Tensor | None  # ((N_s + 1) P, D) every point, point-major, if built at once
    bounds: LeafBounds | None
    boundary: str
    swarm_cost: Callable[[Params], Tensor] | None
    greedy: bool
    ties: bool

    def begin(self, last: Tensor, stay: tuple[Tensor, Any] | None, best_params: Params,
              best_cost: Tensor) -> SwimCarry:
        """Before the first point: Passino's bacterium arrives there whatever its cost."""
        running = torch.ones_like(last, dtype=torch.bool)
        if stay is None:
            inf = torch.full_like(last, torch.inf)
            return SwimCarry(running, last, torch.full_like(last, torch.nan), inf, inf, None,
                             best_params, best_cost)
        return SwimCarry(running, last, torch.full_like(last, torch.nan), stay[0], stay[0],
                         stay[1], best_params, best_cost)

    def points(self, along: Tensor, first: int = 0) -> Tensor:
        """The candidates at ``along`` (G, P), points ``first`` on: G P rows, point-major."""
        if self.built is None:
            return ray_point(self.population, self.direction, along, self.bounds,
                             self.boundary)
        return self.built[first * along.shape[1]:(first + along.shape[0]) * along.shape[1]]

    def take(self, carry: SwimCarry, along: Tensor, candidates: Params, raw: Tensor,
             aux: Any) -> SwimCarry:
        """The carry after the points ``along`` scored ``raw`` (and ``aux``)."""
        size = carry.previous.shape[0]
        running, previous = carry.running, carry.previous
        end = (carry.distance, carry.raw_cost, carry.cost, carry.aux)
        for g in range(along.shape[0]):
            point_raw, point_aux = point_rows((raw, aux), g, size)
            cost = point_raw
            if self.swarm_cost is not None:  # J_cc per point: the same sums whatever the batch
                cost = point_raw + self.swarm_cost(point_rows(candidates, g, size))
            better = cost <= previous if self.ties else cost < previous
            improved = running & better
            ends = improved if self.greedy else running
            if self.swarm_cost is None:  # the compared cost is the raw one: one where for both
                distance, raw_end, aux_end = where(ends, (along[g], point_raw, point_aux),
                                                   (end[0], end[1], end[3]))
                end = (distance, raw_end, raw_end, aux_end)
            else:
                end = where(ends, (along[g], point_raw, cost, point_aux), end)
            running, previous = improved, cost
        return SwimCarry(running, previous, *end, carry.best_params, carry.best_cost,
                         carry.seen + (raw,))

    def finish(self, carry: SwimCarry) -> SwimResult:
        """Where each bacterium ends (the greedy ones that never improved stay), and the best.

        The best point of the whole ray is found once, over every point's cost: the first
        of equal costs in point-major order, as batch after batch would keep it. Its row is
        taken from the ray built at once, else rebuilt, as the final positions are.
        """
        final = ray_point(self.population, self.direction, carry.distance, self.bounds,
                          self.boundary)
        moved = ~torch.isnan(carry.distance)
        if self.greedy:  # NaN rows (those that stay) are replaced whole
            final = where(moved, final, self.population)
        cost, at = first_min(torch.cat(carry.seen) if len(carry.seen) > 1 else carry.seen[0])
        if self.built is not None:
            row = self.built.index_select(0, at)[0]
        else:
            bacterium = at % self.distances.shape[1]
            row = ray_point(self.population.index_select(0, bacterium),
                            self.direction.index_select(0, bacterium),
                            self.distances.reshape(-1).index_select(0, at), self.bounds,
                            self.boundary)[0]
        better = cost[0] < carry.best_cost
        best = torch.where(better, row, carry.best_params)  # the best row
        return SwimResult(final, carry.raw_cost, carry.cost, carry.aux, best,
                          torch.where(better, cost[0], carry.best_cost), moved)


def after(x: Tensor, *events: Tensor) -> Tensor:
    """``x``, computed from each of ``events``: a data dependence that leaves the values alone.

    Compiled, a swim's points do not depend on each other, so inductor may fuse their
    pointwise work side by side, or run every point's forward pass before any backward,
    which keeps every point's activations alive at once (on the MLP benchmark five 8 MB
    buffers, paged in afresh every update: 0.75x the time when ordered). Computing a
    point's distances from the previous point's outcome orders them. One element of each
    event suffices: inductor computes a buffer whole (an empty event has none to give).
    """
    for event in events:
        if event.numel():
            x = torch.where(event.reshape(-1)[0] != 0, x, x)
    return x


def point_rows(stacked: Any, g: int, size: int) -> Any:
    """Rows of swim point ``g`` (``size`` rows each) of every leaf."""
    return optree.tree_map(lambda x: x[g * size:(g + 1) * size], stacked)


def costs_by(evaluator, loss_fn, args: tuple, dtype: torch.dtype, sign: float,
             shape: Layout | None = None):
    """``evaluate(candidates) -> (cost, None)``: sign-adjusted losses, non-finite as +inf.

    ``candidates`` may stack several swim points of every bacterium: one loss per row.
    With ``shape`` they are rows of that layout, handed to the evaluator as params (or as
    rows, with a loss of a row, to an evaluator that takes any structure).
    """

    def evaluate(candidates: Params) -> tuple[Tensor, None]:
        count = optree.tree_leaves(candidates)[0].shape[0]
        loss = loss_fn
        if shape is not None and getattr(evaluator, "any_structure", False):
            loss = functools.partial(loss_of_row, loss_fn, shape)  # rows batched as one tensor
        elif shape is not None:
            candidates = unravel(shape, candidates)
        with torch.no_grad():
            losses = check_losses(evaluator(loss, candidates, *args), count).to(dtype)
        return rank_costs(losses, sign), None

    return evaluate


def loss_of_row(loss_fn: Callable[..., Tensor], shape: Layout, row: Tensor,
                 *args: Any) -> Tensor:
    """``loss_fn`` of the params that ``row`` holds."""
    return loss_fn(unravel(shape, row), *args)


def rank_costs(losses: Tensor, sign: float) -> Tensor:
    """Losses as costs to minimize; non-finite ones rank last and can never become best.

    One ``nan_to_num`` rather than ``where(isfinite(...))``, which is five eager ops.
    """
    costs = losses if sign == 1 else -losses
    return costs.nan_to_num(nan=torch.inf, posinf=torch.inf, neginf=torch.inf)
