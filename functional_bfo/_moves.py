"""Moves of points in a box that the black box makes beside its swarms' own tumbles.

The exploring swarm's kicks (population basin hopping) and the polish's face scan (an
optimum on the boundary found exactly, in two rounds of candidates). Pure functions; a point
is a flat float64 row of ``n`` coordinates in optree's flatten order, ``low`` and ``high``
its box (infinite where open).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from . import random
from ._adaptive import AdaptiveBFOState
from ._base import Key
from ._bounds import LeafBounds, box_relative, project, sample_domain


def kicked(state: AdaptiveBFOState, box: LeafBounds | None, jitter: float,
           key: Key) -> AdaptiveBFOState:
    """Every bacterium moved and kept there: by a Gaussian kick, or one coordinate redrawn.

    Even rows move by ``N(0, jitter)`` box widths per coordinate: a hop to a neighbouring
    basin of a rotated landscape (Rastrigin, Ackley). Odd rows get one random coordinate
    redrawn uniformly in the box: another basin of a separable function without disturbing
    the rest (Styblinski-Tang, Schwefel); a coordinate with an open side is kicked instead.
    Forgotten losses make each bacterium's next tumble be kept whatever it costs (so the
    kick is not undone), and steps below three kicks grow back.
    """
    x = state.population  # (P, n), ``box`` its rows' box
    dtype, (size, n) = state.losses.dtype, x.shape
    z = random.normal(key, (size * n,), dtype).reshape(size, n)
    which = (random.uniform(random.fold_in(key, 1), (size,), dtype) * n).long().clamp(max=n - 1)
    odd = torch.arange(size, device=which.device) % 2 == 1
    redraw = (torch.arange(n, device=which.device) == which[:, None]) & odd[:, None]
    kick = project(x + (jitter * box_relative(z, box)).to(x.dtype), box, "clip")
    redrawn = sample_domain(kick, z.to(x.dtype), box, x.new_zeros(()))
    moved = torch.where(redraw, redrawn, torch.where(odd[:, None], x, kick))
    return state._replace(population=moved,
                          losses=torch.full_like(state.losses, torch.nan),
                          step_sizes=state.step_sizes.clamp_min(3 * jitter))


class FaceScan(NamedTuple):
    """The face scan's next round: its points, and what they are."""

    rows: Tensor  # (k, n) float64: the next round's points (k = 0: no round left)
    singles: Tensor | None  # (2, n) bool: which single moves the rows are (None: their union)
    room: int  # evaluations they may spend, this round's included
    base: Tensor  # (n,) float64: the point moved
    base_cost: float  # its cost


def face_scan(base: Tensor, base_cost: float, low: Tensor, high: Tensor, room: int) -> FaceScan:
    """The scan's first round: ``base`` with one coordinate on one face, at most ``room``."""
    rows, singles = base.new_zeros((0, len(base))), None
    if room > 0:
        rows, singles = face_singles(base, low, high)
    if len(rows) > room:  # some untried: no union follows
        rows, singles = rows[:room].clone(), None  # a copy frees the rest
    return FaceScan(rows, singles, room, base, base_cost)


def face_scan_told(scan: FaceScan, costs: Tensor, low: Tensor, high: Tensor) -> FaceScan:
    """The round after ``costs`` (one per row): the single moves' union, if they were singles."""
    room = scan.room - len(scan.rows)
    union = scan.rows.new_zeros((0, scan.rows.shape[1]))  # not a view: it would keep the rows
    if scan.singles is not None:
        single_costs = torch.full(scan.singles.shape, torch.inf, dtype=costs.dtype,
                                  device=costs.device)
        single_costs[scan.singles] = costs  # where each single move went
        union = face_union(scan.base, low, high, single_costs, scan.base_cost)[:room]
    return scan._replace(rows=union, singles=None, room=room)


def face_singles(x: Tensor, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` with one coordinate on one face, a row per move; and the moves' (2, n) mask.

    Mask rows are the low and the high face; moves that would not change ``x`` are left out.
    """
    faces = torch.stack([low, high])
    singles = x.expand(2, len(x), len(x)).clone()  # [f, j]: x with coordinate j on face f
    finite = torch.isfinite(high - low)
    singles.diagonal(dim1=1, dim2=2).copy_(torch.where(finite, faces, x))
    moves = finite & (faces != x)
    return singles[moves], moves


def face_union(x: Tensor, low: Tensor, high: Tensor, single_costs: Tensor,
               cost: float) -> Tensor:
    """``x`` with every single move that beat ``cost`` made at once, as one row.

    Each coordinate goes to its better face; no row unless at least two moves helped.
    """
    better, side = single_costs.min(dim=0)
    helped = better < cost
    if int(helped.sum()) < 2:
        return x.new_zeros((0, len(x)))
    return torch.where(helped, torch.stack([low, high]).gather(0, side[None])[0], x)[None]
