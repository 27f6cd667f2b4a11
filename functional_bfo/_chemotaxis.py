"""Chemotaxis: tumble directions (Gaussian or Lévy–Mantegna) and the swim along them.

A tumble is uniform on the sphere; the swim walks ``theta + k C phi``, ``k = 1 .. N_s + 1``,
every point evaluated (``per_call`` points per evaluator call), so the count is fixed and
the trajectory does not depend on the batching (docs/design.md, "The algorithm").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ._base import Params
from ._bounds import LeafBounds, project
from ._population import Noise
from ._tree import first_min, where

TUMBLES = ("gaussian", "levy")
LEVY_MAX_LENGTH = 1e3  # Mantegna's ratio has no finite variance; cap it so f16 stays finite
ORDER_POINTS_FROM = 1 << 16  # elements per point from which points are built in order (after)


def tumble_directions(noise: Noise, kind: str, levy_beta: Tensor,
                      step: Tensor) -> tuple[Tensor, Tensor]:
    """Unit directions (the noise's normalized) and steps: ``step``, Lévy times Mantegna's."""
    z, u, v = noise.direction, noise.levy_u, noise.levy_v
    direction = z * torch.rsqrt(z.to(u.dtype).square().sum(1)).unsqueeze(1)
    if kind == "gaussian":
        return direction, step
    beta = levy_beta.to(u.dtype)  # sigma, the scale of Mantegna's numerator normal:
    log_ratio = torch.lgamma(1 + beta) - torch.lgamma((1 + beta) / 2)
    rest = torch.sin(math.pi * beta / 2) / (beta * 2 ** ((beta - 1) / 2))
    sigma = (torch.exp(log_ratio) * rest) ** (1 / beta)
    length = sigma * u.abs() / v.abs() ** (1 / beta)
    return direction, step * length.clamp(max=LEVY_MAX_LENGTH)


def ray_point(population: Tensor, direction: Tensor, distance: Tensor,
              bounds: LeafBounds | None, mode: str) -> Tensor:
    """``project(theta + distance * phi)``: ``distance`` (P,) or (G, P), rows point-major."""
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


def walk(population: Tensor, direction: Tensor, step_length: Tensor, known: Tensor,
         cost: Tensor, best: tuple[Tensor, Tensor], *, bounds: LeafBounds | None,
         boundary: str, swims: int, swarm_cost: Callable[[Params], Tensor] | None = None,
         greedy: bool = False, stay_aux: Any = None) -> tuple[Ray, SwimCarry]:
    """The ray ``theta + k C phi``, ``swims + 1`` points, and the swim's start.

    The ray starts at ``k = 1``, or 0 where the ``cost`` is not ``known``. Passino's bacterium
    ends at the last point reached (each one before improved), whatever the first costs; a
    ``greedy`` one at the last no worse than the one before, or stays (with ``stay_aux``).
    """
    ks = torch.arange(swims + 1, dtype=step_length.dtype, device=step_length.device)
    distances = (known.to(cost.dtype) + ks.unsqueeze(1)) * step_length
    built = (ray_point(population, direction, distances, bounds, boundary)
             if population.numel() < ORDER_POINTS_FROM else None)
    last = torch.where(known, cost, torch.inf)
    raw, aux = (last, stay_aux) if greedy else (torch.full_like(last, torch.inf), None)
    return (Ray(population, direction, distances, built, bounds, boundary, swarm_cost, greedy),
            SwimCarry(torch.ones_like(last, dtype=torch.bool), last,
                      torch.full_like(last, -1, dtype=torch.int64), raw, raw, aux, *best))


class SwimCarry(NamedTuple):
    """A swim between its points: where each bacterium ends so far, and the best seen."""

    running: Tensor  # (P,) bool: every point reached so far improved on the one before
    previous: Tensor  # (P,) the compared cost of the last point reached
    point: Tensor  # (P,) int64: the point of the ray where it ends (-1: where it stands)
    raw_cost: Tensor  # (P,) there
    cost: Tensor  # (P,) there (raw_cost plus J_cc when swarming)
    aux: Any  # there
    best_params: Tensor  # (D,) the best before this swim
    best_cost: Tensor
    seen: tuple[Tensor, ...] = ()  # every batch's raw costs so far, point-major


class Ray(NamedTuple):
    """One update's swim, fixed before any loss: losses only decide where each bacterium ends."""

    population: Tensor  # (P, D)
    direction: Tensor  # (P, D)
    distances: Tensor  # (N_s + 1, P): every point's place on the ray
    built: Tensor | None  # ((N_s + 1) P, D) every point, point-major, if built at once
    bounds: LeafBounds | None
    boundary: str
    swarm_cost: Callable[[Params], Tensor] | None
    greedy: bool  # stays unless a point is no worse than the one before (Passino's: moves)

    def points(self, along: Tensor, first: int = 0) -> Tensor:
        """The candidates at ``along`` (G, P), points ``first`` on: G P rows, point-major."""
        if self.built is None:
            return ray_point(self.population, self.direction, along, self.bounds, self.boundary)
        return self.built[first * along.shape[1]:(first + along.shape[0]) * along.shape[1]]

    def take(self, carry: SwimCarry, candidates: Params, raw: Tensor, aux: Any) -> SwimCarry:
        """The carry after the ray's next points scored ``raw`` (and ``aux``)."""
        size = carry.previous.shape[0]
        running, previous = carry.running, carry.previous
        end = (carry.point, carry.raw_cost, carry.cost, carry.aux)
        points = raw.shape[0] // size
        for g in range(points):
            point_raw, point_aux = (raw, aux) if points == 1 else point_rows((raw, aux), g, size)
            cost = point_raw
            if self.swarm_cost is not None:  # J_cc per point: the same sums whatever the batch
                cost = point_raw + self.swarm_cost(point_rows(candidates, g, size))
            improved = running & (cost <= previous if self.greedy else cost < previous)
            ends = improved if self.greedy else running
            point = end[0] + ends  # ends holds on a prefix of the points: a count
            if self.swarm_cost is None:  # the compared cost is the raw one: one where for both
                raw_end, aux_end = where(ends, (point_raw, point_aux), (end[1], end[3]))
                end = (point, raw_end, raw_end, aux_end)
            else:
                end = (point, *where(ends, (point_raw, cost, point_aux), end[1:]))
            running, previous = improved, cost
        return SwimCarry(running, previous, *end, carry.best_params, carry.best_cost,
                         carry.seen + (raw,))

    def finish(self, carry: SwimCarry) -> SwimResult:
        """Where each bacterium ends, and the best: the first of equal costs, point-major."""
        moved = carry.point >= 0
        point = carry.point.clamp_min(0) if self.greedy else carry.point  # Passino's always move
        cost, at = first_min(torch.cat(carry.seen) if len(carry.seen) > 1 else carry.seen[0])
        final = ray_point(self.population, self.direction, self.distances.gather(
            0, point.unsqueeze(0))[0], self.bounds, self.boundary)
        if self.built is not None:
            row = self.built.index_select(0, at)[0]
        else:
            bacterium = at % self.distances.shape[1]
            row = ray_point(self.population.index_select(0, bacterium),
                            self.direction.index_select(0, bacterium),
                            self.distances.reshape(-1).index_select(0, at), self.bounds,
                            self.boundary)[0]
        if self.greedy:  # those that stay keep their rows
            final = where(moved, final, self.population)
        better = cost[0] < carry.best_cost
        best = torch.where(better, row, carry.best_params)  # the best row
        return SwimResult(final, carry.raw_cost, carry.cost, carry.aux, best,
                          torch.where(better, cost[0], carry.best_cost), moved)


def after(x: Tensor, *events: Tensor) -> Tensor:
    """``x``, made to depend on ``events`` without changing it: orders a large swim's points.

    Compiled, independent points fuse and keep every point's activations alive at once
    (docs/design.md, "Large swims evaluate their points in order").
    """
    for event in events:
        if event.numel():
            x = torch.where(event.reshape(-1)[0] != 0, x, x)
    return x


def point_rows(stacked: Any, g: int, size: int) -> Any:
    """Rows of swim point ``g`` (``size`` rows each) of every leaf."""
    return optree.tree_map(lambda x: x[g * size:(g + 1) * size], stacked)
