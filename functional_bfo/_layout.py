"""The population as one ``(P, D)`` matrix; the params' structure is static (docs/design.md).

Rows are float64 if any leaf is, else float32; a narrower leaf is rounded to its dtype when
a row is handed to the loss, so ``best_params`` is the point evaluated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor, nn

from ._base import LossFn, Params
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
    rows = [x if x.dim() == 1 == len(s) and x.dtype == shape.dtype else
            x.reshape(*x.shape[:x.dim() - len(s)], n).to(shape.dtype)
            for x, s, n in zip(leaves, shape.shapes, shape.sizes)]
    return rows[0] if len(rows) == 1 else torch.cat(rows, dim=-1)


def unravel(shape: Layout, rows: Tensor) -> Params:
    """Rows ``(..., D)`` as params: views of ``rows`` where dtypes match (bool rows stay bool)."""
    batch = rows.shape[:-1]
    blocks = rows.split(shape.sizes, dim=-1) if len(shape.sizes) > 1 else (rows,)
    cast = rows.is_floating_point()
    # No reshape or cast that changes nothing: each is an op under vmap (a loss's rows).
    leaves = [b if b.shape == batch + s else b.reshape(batch + s)
              for b, s in zip(blocks, shape.shapes)]
    leaves = [x.to(dt) if cast and x.dtype != dt else x for x, dt in zip(leaves, shape.dtypes)]
    return shape.spec.unflatten(leaves)


def strided(x: Tensor) -> Tensor:
    """``x`` densified if sparse; the layout read in Python (``to_dense`` has no vmap rule)."""
    return x if x.layout == torch.strided else x.to_dense()


def as_params(state: Any, rows: Tensor) -> Params:
    """Rows over a state's ``D`` coordinates as params: views, in each leaf's dtype.

    A state keeps its population (and a hybrid state its gradients and gradient mask) as one
    ``(P, D)`` matrix: ``as_params(state, state.population)`` holds bacterium ``i``'s params at
    index ``i`` of every leaf of ``state.best_params``' structure.

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


def module_loss(
    module: nn.Module, criterion: Callable[[Tensor, Tensor], Tensor]
) -> tuple[dict[str, Tensor], LossFn]:
    """The module's parameters as a dict, and ``loss_fn(params, inputs, targets)``.

    ``loss_fn`` runs the module with ``torch.func.functional_call`` on the given params (its
    buffers as they are), so it vmaps over a population. The params are detached copies: the
    module is untouched until you load the result with ``module.load_state_dict(best_params,
    strict=False)``, and none requires grad, so :func:`functional_bfo.hybrid_bfo` needs
    ``grad_mask=True``, or ``{n: p.requires_grad for n, p in module.named_parameters()}``
    to keep frozen layers gradient-free.

    Examples:
        >>> import torch, functional_bfo as fb
        >>> params, loss_fn = fb.module_loss(torch.nn.Linear(3, 1), torch.nn.functional.mse_loss)
        >>> sorted(params)
        ['bias', 'weight']
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"Expected an nn.Module, got {type(module).__name__}.")
    params = {name: p.detach().clone() for name, p in module.named_parameters()}
    buffers = dict(module.named_buffers())

    def loss_fn(params: dict[str, Tensor], inputs: Tensor, targets: Tensor) -> Tensor:
        return criterion(torch.func.functional_call(module, (params, buffers), (inputs,)), targets)

    return params, loss_fn
