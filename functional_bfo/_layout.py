"""The population as one matrix: a params pytree is a row of ``D`` numbers, its structure static.

A state keeps the population as one ``(P, D)`` matrix in one floating dtype, ``D`` the
params' total size, so an update costs the same ops for 1 leaf or 100 (as evosax ravels a
solution pytree, and EvoX holds a ``(pop_size, dim)`` tensor). The params' structure
(treespec, leaf shapes and dtypes) is static, read from ``state.best_params``, and meets the
user only at the edges: the rows handed to the loss, ``ask``'s candidates, ``best_params``.

The dtype rule: rows are float64 if any leaf is, else float32 (the loss and step dtype). A
leaf of another dtype (bfloat16, float16, float32 beside a float64 leaf) sees its
coordinates rounded to its own dtype when a row is handed to the loss; positions keep the
row's precision, and ``best_params`` is the rounded point that was evaluated.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ._base import Params
from ._checks import compute_dtype


class Layout(NamedTuple):
    """Where each leaf of params lives in a row: static, known from shapes and dtypes alone."""

    spec: optree.PyTreeSpec
    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]
    sizes: tuple[int, ...]  # each leaf's number of coordinates, in optree's flatten order
    dtype: torch.dtype  # the rows' dtype

    @property
    def size(self) -> int:
        """``D``, the number of coordinates in a row."""
        return sum(self.sizes)


def layout(params: Params) -> Layout:
    """The layout of ``params`` (a pytree of tensors, e.g. ``state.best_params``)."""
    leaves, spec = optree.tree_flatten(params)
    return Layout(spec, tuple(x.shape for x in leaves), tuple(x.dtype for x in leaves),
                  tuple(x.numel() for x in leaves), compute_dtype(leaves))


def ravel(shape: Layout, params: Params) -> Tensor:
    """``params`` (like the layout's, with any leading batch axes) as rows ``(..., D)``."""
    leaves: list[Any] = shape.spec.flatten_up_to(params)
    rows = [x.reshape(*x.shape[:x.dim() - len(s)], n).to(shape.dtype)
            for x, s, n in zip(leaves, shape.shapes, shape.sizes)]
    return rows[0] if len(rows) == 1 else torch.cat(rows, dim=-1)


def unravel(shape: Layout, rows: Tensor) -> Params:
    """Rows ``(..., D)`` as params: leaves ``(..., *shape)``, views where their dtype is the rows'.

    The leaves are views of ``rows`` (a column block split by ``reshape``), so handing a
    population to the loss copies nothing; a leaf of another dtype is rounded to it. Rows
    of bools (a mask) stay bools.
    """
    batch = rows.shape[:-1]
    blocks = rows.split(shape.sizes, dim=-1) if len(shape.sizes) > 1 else (rows,)
    cast = rows.is_floating_point()
    # No reshape or cast that changes nothing: each is an op under vmap (a loss's rows).
    leaves = [b if b.shape == batch + s else b.reshape(batch + s)
              for b, s in zip(blocks, shape.shapes)]
    leaves = [x.to(dt) if cast and x.dtype != dt else x for x, dt in zip(leaves, shape.dtypes)]
    return shape.spec.unflatten(leaves)


def strided(x: Tensor) -> Tensor:
    """``x`` as an ordinary tensor: a sparse gradient (``nn.Embedding(sparse=True)``) densified.

    A population's rows are dense whatever the layout of a gradient handed in. The layout
    is read in Python, not by ``to_dense``, which dispatches an op even on a dense tensor
    and has no batching rule under ``vmap``.
    """
    return x if x.layout == torch.strided else x.to_dense()


def as_params(state: Any, rows: Tensor) -> Params:
    """Rows over a state's ``D`` coordinates as params: views, in each leaf's dtype.

    A state keeps its population as one ``(P, D)`` matrix (and a hybrid state its gradients
    and gradient mask as rows too): ``as_params(state, state.population)`` is bacterium
    ``i``'s params at index ``i`` of every leaf. ``rows`` is ``(..., D)``; the structure is
    ``state.best_params``'.

    Raises:
        ValueError: ``rows`` is not a tensor whose last axis has ``D`` entries.

    Examples:
        >>> import torch, functional_bfo as fb
        >>> state = fb.bfo(population_size=4).init({"w": torch.zeros(2, 3)}, key=fb.random.key(0))
        >>> population = fb.as_params(state, state.population)
        >>> tuple(state.population.shape), tuple(population["w"].shape)
        ((4, 6), (4, 2, 3))
    """
    shape = layout(state.best_params)
    if not isinstance(rows, Tensor) or tuple(rows.shape[-1:]) != (shape.size,):
        found = tuple(rows.shape) if isinstance(rows, Tensor) else type(rows).__name__
        raise ValueError(f"as_params takes rows of the state's {shape.size} coordinates, "
                         f"shape (..., {shape.size}), e.g. state.population; got {found}.")
    return unravel(shape, rows)
