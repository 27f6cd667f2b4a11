"""Box bounds: validation, per-leaf resolution, and projection by clip, reflect or wrap."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import optree
import torch
from torch import Tensor

from ._checks import as_number, path_str
from ._layout import Layout

BOUNDARY_MODES = ("clip", "reflect", "wrap")
BOUNDS_FORM_MSG = (
    "bounds must be None, a (low, high) pair of numbers or tensors applied to every leaf, "
    "or a pytree shaped like params with a (low, high) pair at each leaf"
)


class LeafBounds(NamedTuple):
    """One leaf's box in the compute dtype, with the constants every projection reuses."""

    low: Tensor
    high: Tensor
    width: Tensor  # high - low: inf where a side is open
    finite: Tensor  # bool: the width is finite
    reflect_period: Tensor  # 2 * width, 1 where open (a remainder needs a finite period)
    wrap_period: Tensor  # width, 1 where open
    open: Tensor | None  # ~finite; None when the host knows every coordinate's box is finite


def leaf_bounds(low: Tensor, high: Tensor, closed: bool = False) -> LeafBounds:
    """The box ``[low, high]`` with its periods; ``closed`` (finite numbers) drops the open mask."""
    width = high - low
    finite = torch.isfinite(width)
    return LeafBounds(low, high, width, finite, torch.where(finite, 2 * width, 1.0),
                      torch.where(finite, width, 1.0), None if closed else ~finite)


def is_closed(bounds: Any) -> bool:
    """Whether ``bounds`` (checked) are finite Python numbers: no coordinate has an open side."""
    pairs = [bounds] if _is_pair(bounds) else optree.tree_leaves(bounds, is_leaf=_is_pair)
    # Comparisons, not math.isfinite: compiled, a number that changed between compiles is
    # symbolic, and dynamo guards on a comparison but cannot trace isfinite.
    return bounds is not None and all(isinstance(v, (int, float)) and -math.inf < v < math.inf
                                      for pair in pairs for v in pair)


def update_box(box: LeafBounds, bounds: Any, closed: bool) -> LeafBounds | None:
    """The state's ``box`` for an update: None without bounds, no open mask if closed."""
    return None if bounds is None else box._replace(open=None) if closed else box


def _is_pair(x: Any) -> bool:
    return (isinstance(x, (tuple, list)) and len(x) == 2
            and not any(isinstance(v, (tuple, list, dict)) for v in x))


def _is_scalar_like(x: Any) -> bool:
    return isinstance(x, (int, float, Tensor)) and not isinstance(x, bool)


def _from_numpy(v: Any) -> Any:
    """A numpy bound as torch takes it: a scalar as a Python number, an array as a tensor."""
    if isinstance(v, np.ndarray) and v.ndim > 0 and v.dtype.kind in "iuf":
        return torch.from_numpy(v.astype(np.float64))
    return as_number(v) if isinstance(v, (np.generic, np.ndarray)) else v


def check_bounds(bounds: Any) -> Any:
    """``bounds`` after checking its form and that low < high; runs once, in the factory.

    numpy values become Python numbers (scalars) and float64 tensors (arrays).
    """
    if bounds is None:
        return None
    single = _is_pair(bounds)
    where = "" if single else " entry"
    bounds = optree.tree_map(lambda pair: tuple(map(_from_numpy, pair)) if _is_pair(pair)
                             else pair, bounds, is_leaf=_is_pair, none_is_leaf=True)
    pairs = [bounds] if single else optree.tree_leaves(bounds, is_leaf=_is_pair)
    if not pairs or not single and isinstance(bounds, (tuple, list)) and all(
            map(_is_scalar_like, bounds)):
        raise ValueError(f"Invalid bounds: {bounds!r}; {BOUNDS_FORM_MSG}.")
    for pair in pairs:
        if not _is_pair(pair):
            raise ValueError(f"Invalid bounds{where}: {pair!r}; {BOUNDS_FORM_MSG}.")
        if not all(_is_scalar_like(v) for v in pair):
            raise ValueError(f"Invalid bounds{where}: {pair!r}; low and high must be numbers or "
                             "tensors (use -inf/inf, not None, for an open side).")
        if any(isinstance(v, Tensor) and (v.dtype == torch.bool or v.is_complex()) for v in pair):
            raise ValueError(f"Invalid bounds{where}: {pair!r}; low and high must be real "
                             "numbers, not bool or complex tensors (a mask is no box): convert "
                             "them, e.g. low.float().")
        low, high = (torch.as_tensor(v, dtype=torch.float64) for v in pair)
        if torch.isnan(low).any() or torch.isnan(high).any() or not bool((low < high).all()):
            raise ValueError(f"Invalid bounds{where}: {pair!r}; expected low < high everywhere "
                             "(use -inf/inf for an open side).")
    return bounds


def _inward(low: Tensor, high: Tensor, dt: torch.dtype, dtype: torch.dtype) -> list[Tensor]:
    """Float64 ends rounded to ``dt`` toward each other (the box stays inside), as ``dtype``."""
    ends = []
    for v, toward in ((low, torch.inf), (high, -torch.inf)):
        r = v.to(dt)
        outside = r.to(torch.float64) < v if toward > 0 else r.to(torch.float64) > v
        ends.append(torch.where(outside, torch.nextafter(r, torch.full_like(r, toward)), r).to(
            dtype))
    return ends


def flat_box(bounds: Any, shape: Layout, device: torch.device,
             dtype: torch.dtype | None = None) -> LeafBounds | None:
    """The box of a row of ``shape`` over its ``D`` coordinates (None: unbounded).

    Each leaf's box is rounded inward to the leaf's dtype, held in ``dtype`` (default the rows').
    """
    if bounds is None:
        return None
    dtype = dtype or shape.dtype
    try:
        pairs = ([bounds] * len(shape.sizes) if _is_pair(bounds)
                 else shape.spec.flatten_up_to(bounds))
    except ValueError as e:
        raise ValueError(f"bounds does not match the structure of params: {e}. "
                         f"params is {shape.spec}; {BOUNDS_FORM_MSG}.") from None
    for path, leaf_shape, pair in zip(shape.spec.paths(), shape.shapes, pairs):
        if not _is_pair(pair):  # values were checked by check_bounds; this stays sync-free
            raise ValueError(f"Invalid bounds at {path_str(path)}: {pair!r}; {BOUNDS_FORM_MSG}.")
        for v in pair:
            if isinstance(v, Tensor) and not broadcasts(v.shape, leaf_shape):
                raise ValueError(f"bounds at {path_str(path)} have shape {tuple(v.shape)}, which "
                                 f"does not broadcast to the leaf's shape {tuple(leaf_shape)}.")
    closed = is_closed(bounds)
    if all(isinstance(v, (int, float)) for pair in pairs for v in pair):
        # One value per leaf, rounded once per dtype, then spread over the coordinates.
        ends = torch.tensor(pairs, dtype=torch.float64, device=device)  # (leaves, 2)
        low, high = _inward(ends[:, 0], ends[:, 1], shape.dtypes[0], dtype)
        for dt in set(shape.dtypes) - {shape.dtypes[0]}:
            mine = torch.tensor([d == dt for d in shape.dtypes], device=device)
            low, high = (torch.where(mine, new, old) for new, old in zip(
                _inward(ends[:, 0], ends[:, 1], dt, dtype), (low, high)))
        if len(set(map(tuple, pairs))) == 1 and len(set(shape.dtypes)) == 1:
            return leaf_bounds(low[0], high[0], closed)
        repeats = torch.tensor(shape.sizes, device=device)
        return leaf_bounds(low.repeat_interleave(repeats, output_size=shape.size),
                           high.repeat_interleave(repeats, output_size=shape.size), closed)
    lows, highs = [], []
    for leaf_shape, dt, pair in zip(shape.shapes, shape.dtypes, pairs):
        low, high = (torch.as_tensor(v, dtype=torch.float64, device=device) for v in pair)
        low, high = _inward(low, high, dt, dtype)
        lows.append(low.expand(leaf_shape).reshape(-1))
        highs.append(high.expand(leaf_shape).reshape(-1))
    return leaf_bounds(torch.cat(lows), torch.cat(highs), closed)


def broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to ``to`` (``torch.broadcast_shapes`` costs ~80 us a call)."""
    return len(shape) <= len(to) and all(s in (1, t) for s, t in zip(shape[::-1], to[::-1]))


def project(x: Tensor, bounds: LeafBounds | None, mode: str) -> Tensor:
    """``x`` (any dtype) moved into the box; coordinates with an infinite side are clipped."""
    if bounds is None:
        return x
    low, high = bounds.low, bounds.high
    if mode != "clip":
        period = bounds.reflect_period if mode == "reflect" else bounds.wrap_period
        y = torch.remainder(x - low, period)
        if mode == "reflect":  # past the far face, folded back: where(y > width, ...) bitwise
            y = torch.minimum(y, period - y)
        # Only what left the box moves: low + y rounds to the spacing of |low|'s floats.
        out = (x < low) | (x > high)
        x = torch.where(out if bounds.open is None else out & bounds.finite, low + y, x)
    # The final clamp also catches rounding at the faces, so no position ever leaves the box.
    return torch.clamp(x, low, high)


def box_relative(direction: Tensor, bounds: LeafBounds | None) -> Tensor:
    """Rows of directions scaled by each coordinate's box width (1 where infinite)."""
    if bounds is None:
        return direction
    return direction * torch.where(bounds.finite, bounds.width, 1.0).to(direction.dtype)


def sample_domain(anchor: Tensor, z: Tensor, bounds: LeafBounds | None, scale: Tensor) -> Tensor:
    """New positions from normals ``z``: uniform in a finite box, else ``anchor + scale * z``."""
    if bounds is None:
        return anchor + scale * z
    low, high, width = bounds.low, bounds.high, bounds.width
    inside = low + width * torch.special.ndtr(z)
    if bounds.open is None:  # every side finite: no open coordinate to place around anchor
        return inside
    return torch.where(bounds.finite, inside, torch.clamp(anchor + scale * z, low, high))
