"""Moves of points in a box that the black box makes beside its swarms' own tumbles.

The exploring swarm's kicks (population basin hopping) and the polish's face moves (an
optimum on the boundary found exactly). Pure functions of points, a box and a key; points
are flat float64 rows of ``n`` coordinates in optree's flatten order, or populations.
"""

from __future__ import annotations

from typing import Any

import optree
import torch
from torch import Tensor

from . import random
from ._adaptive import AdaptiveBFOState
from ._base import Key, Params
from ._bounds import LeafBounds, box_relative, project, sample_domain
from ._metric import flat_rows
from ._tree import numel, rows, unflatten_like

# Distances to a face (in box widths) within which the snaps move the best point's
# coordinates onto the face: one candidate each, from a third of the box down to 1e-8.5.
SNAP_WIDTHS = tuple(10 ** (-k / 2) for k in range(1, 18))


def kicked(state: AdaptiveBFOState, start: Params, box: list, jitter: float,
           key: Key) -> AdaptiveBFOState:
    """Every bacterium moved and kept there: by a Gaussian kick, or one coordinate redrawn.

    Even rows move by ``N(0, jitter)`` box widths per coordinate, odd rows get one random
    coordinate redrawn uniformly in the box. The Gaussian kick hops to a neighbouring basin
    of a rotated landscape (Rastrigin, Ackley); the redraw moves one coordinate of a
    separable function into another of its basins without disturbing the rest
    (Styblinski-Tang, Schwefel). A coordinate with an open side gets the Gaussian kick
    instead. Forgetting the losses makes the next tumble of each bacterium be accepted
    whatever it costs (so the kick is not undone), and steps below three kicks grow back.
    """
    dtype, size = state.losses.dtype, state.losses.shape[0]
    z = random.tree_normal_like(key, state.population, dtype)
    n = numel(start)
    which = (random.uniform(random.fold_in(key, 1), (size,), dtype) * n).long()
    device = which.device
    odd = torch.arange(size, device=device) % 2 == 1
    redraw = (torch.arange(n, device=device) == which.clamp(max=n - 1).unsqueeze(1)) \
        & odd.unsqueeze(1)
    leaves, spec = optree.tree_flatten(state.population)
    gaussian: list[Any] = spec.flatten_up_to(box_relative(z, box))
    no_spread = torch.zeros((), dtype=dtype, device=device)
    moved = []
    normals: list[Any] = spec.flatten_up_to(z)
    redraws: list[Any] = spec.flatten_up_to(unflatten_like(redraw, start))
    for x, zi, k, r, b in zip(leaves, normals, gaussian, redraws, box):
        kick = project(x + (jitter * k).to(x.dtype), b, "clip")
        redrawn = sample_domain(kick, zi.to(x.dtype), b, no_spread.to(x.dtype))
        moved.append(torch.where(r, redrawn, torch.where(rows(odd, x), x, kick)))
    return state._replace(population=spec.unflatten(moved),
                          losses=torch.full_like(state.losses, torch.nan),
                          step_sizes=state.step_sizes.clamp_min(3 * jitter))


def face_snaps(x: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """``x`` with its coordinates near a face moved onto it: a row per distance.

    A row per width ``w`` of ``SNAP_WIDTHS`` that moves a new set (maybe no row): every
    coordinate within ``w`` box widths of its nearest face, onto that face.
    """
    finite = torch.isfinite(high - low)
    face = torch.where(x - low <= high - x, low, high)
    gap = torch.where(finite, (x - face).abs() / (high - low), torch.inf)
    masks: list[Tensor] = []
    for width in SNAP_WIDTHS:
        mask = (gap <= width) & (gap > 0)
        if bool(mask.any()) and not any(torch.equal(mask, m) for m in masks):
            masks.append(mask)
    return torch.where(torch.stack(masks), face, x) if masks else x.new_zeros((0, len(x)))


def face_singles(x: Tensor, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` with one coordinate on one face, a row per move; and the moves' (2, n) mask.

    Mask rows are the low and the high face; moves that would not change ``x`` are left out.
    """
    n = len(x)
    faces = torch.stack([low, high])
    singles = x.expand(2, n, n).clone()  # [f, j] = x with coordinate j on face f
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


def flat_box(params: Params, box: list[LeafBounds | None]) -> tuple[Tensor, Tensor]:
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


def flat(params: Params) -> Tensor:
    """One point's coordinates as an (n,) float64 row."""
    return flat_rows(optree.tree_map(lambda v: v.unsqueeze(0), params))[0]


def as_params(flat_rows: Tensor, template: Params) -> Params:
    """Rows of flat coordinates as a population shaped and typed like ``template``."""
    return optree.tree_map(lambda v, t: v.to(t.dtype), unflatten_like(flat_rows, template),
                           template)


def uniform_point(params: Params, box: list[LeafBounds | None], key: Key) -> Params:
    """A point uniform in the resolved ``box`` (``params`` itself where a side is open)."""
    leaves, spec = optree.tree_flatten(params)
    dtype = torch.promote_types(leaves[0].dtype, torch.float32)
    z = optree.tree_leaves(random.tree_normal_like(key, params, dtype))
    scale = torch.zeros((), dtype=dtype)
    return spec.unflatten([sample_domain(x.to(dtype), zi, b, scale.to(x.device)).to(x.dtype)
                           for x, zi, b in zip(leaves, z, box)])
