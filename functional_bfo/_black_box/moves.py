"""Moves the black box makes beside its swarms' tumbles: kicks and the face scan."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .. import random
from .._adaptive import AdaptiveBFOState
from .._base import Key
from .._bounds import LeafBounds, box_relative, project, sample_domain


def kicked(state: AdaptiveBFOState, box: LeafBounds | None, jitter: float,
           key: Key) -> AdaptiveBFOState:
    """Every bacterium kicked and kept, its loss forgotten and its step at least three kicks.

    Even rows move by ``N(0, jitter)`` (a neighbouring basin of a rotated landscape), odd
    ones get one coordinate redrawn in the box (another basin of a separable one).
    """
    x = state.population
    dtype, (size, n) = state.losses.dtype, x.shape
    z = random.normal(key, (size * n,), dtype).reshape(size, n)
    which = (random.uniform(random.fold_in(key, 1), (size,), dtype) * n).long().clamp(max=n - 1)
    odd = torch.arange(size, device=which.device) % 2 == 1
    redraw = (torch.arange(n, device=which.device) == which[:, None]) & odd[:, None]
    kick = project(x + (jitter * box_relative(z, box)).to(x.dtype), box, "clip")
    redrawn = sample_domain(kick, z.to(x.dtype), box, x.new_zeros(()))
    moved = torch.where(redraw, redrawn, torch.where(odd[:, None], x, kick))
    return state._replace(population=moved, losses=torch.full_like(state.losses, torch.nan),
                          step_sizes=state.step_sizes.clamp_min(3 * jitter))


# A face scan's stages: not opened, its single moves next, their union next, done.
CLOSED, SINGLES, UNION, DONE = range(4)


class FaceScan(NamedTuple):
    """The face scan of a point: its fixed-shape record, from which each round is rebuilt."""

    base: Tensor  # (n,) float64: the point moved
    base_cost: Tensor  # () float64: its cost
    room: Tensor  # () int64: evaluations the scan may still spend
    single_costs: Tensor  # (2, n) float64: each single move's cost (inf: not made)
    stage: Tensor  # () int64: CLOSED, SINGLES, UNION or DONE

    RANGES = {"stage": (CLOSED, DONE, False)}  # type: ignore[misc]  # a class constant


def face_scan(base: Tensor, base_cost: float, low: Tensor, high: Tensor, room: int) -> FaceScan:
    """The scan of ``base``: a round of its single moves next (at most ``room``), if any."""
    ahead = room > 0 and len(face_moves(base, low, high)) > 0
    return FaceScan(  # type: ignore[call-arg]  # RANGES is a class constant
        base, torch.tensor(base_cost, dtype=torch.float64), torch.tensor(room),
        torch.full((2, len(base)), torch.inf, dtype=torch.float64, device=base.device),
        torch.tensor(SINGLES if ahead else DONE))


def face_rows(scan: FaceScan, low: Tensor, high: Tensor) -> Tensor:
    """The scan's next round, a (k, n) float64 row per point (k = 0: no round left)."""
    stage, room, base = int(scan.stage), int(scan.room), scan.base
    if stage == SINGLES:
        return moved(base, low, high, face_moves(base, low, high)[:room])
    if stage == UNION:
        return face_union(base, low, high, scan.single_costs, scan.base_cost)[:room]
    return base.new_zeros((0, len(base)))


def face_count(scan: FaceScan, low: Tensor, high: Tensor) -> int:
    """The points of the scan's next round, without making them."""
    if int(scan.stage) == SINGLES:
        return min(len(face_moves(scan.base, low, high)), int(scan.room))
    return int(int(scan.stage) == UNION)  # a union is one row, made only where it helps


def face_scan_told(scan: FaceScan, costs: Tensor, low: Tensor,
                   high: Tensor) -> tuple[FaceScan, Tensor]:
    """The scan after its round's ``costs``, and the round's least costly row."""
    best, room = int(costs.argmin()), int(scan.room) - len(costs)
    if int(scan.stage) == UNION:
        found = face_union(scan.base, low, high, scan.single_costs, scan.base_cost)[best]
        return scan._replace(room=torch.tensor(room), stage=torch.tensor(DONE)), found
    every = face_moves(scan.base, low, high)
    made = every[:len(costs)]
    single_costs = scan.single_costs.index_put((made[:, 0], made[:, 1]), costs.to(torch.float64))
    found = moved(scan.base, low, high, made[best:best + 1])[0]
    union = face_union(scan.base, low, high, single_costs, scan.base_cost)[:room]
    stage = UNION if len(union) and len(made) == len(every) else DONE
    return scan._replace(room=torch.tensor(room), single_costs=single_costs,
                         stage=torch.tensor(stage)), found


def face_moves(x: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """The single moves of ``x`` onto a face that change it, (m, 2) rows of (face, coordinate)."""
    return (torch.isfinite(high - low) & (torch.stack([low, high]) != x)).nonzero()


def moved(x: Tensor, low: Tensor, high: Tensor, which: Tensor) -> Tensor:
    """``x`` with one coordinate on one face, a row per ``(face, coordinate)`` of ``which``."""
    rows = x.expand(len(which), len(x)).clone()
    rows[torch.arange(len(which), device=x.device), which[:, 1]] = torch.stack(
        [low, high])[which[:, 0], which[:, 1]]
    return rows


def face_union(x: Tensor, low: Tensor, high: Tensor, single_costs: Tensor, cost: Tensor) -> Tensor:
    """``x`` with every single move that beat ``cost`` made at once (no row unless two helped)."""
    better, side = single_costs.min(dim=0)
    helped = better < cost
    if int(helped.sum()) < 2:
        return x.new_zeros((0, len(x)))
    return torch.where(helped, torch.stack([low, high]).gather(0, side[None])[0], x)[None]
