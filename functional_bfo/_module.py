"""Turn an ``nn.Module`` and a criterion into a functional ``loss_fn(params, inputs, targets)``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ._base import LossFn


def module_loss(
    module: nn.Module, criterion: Callable[[Tensor, Tensor], Tensor]
) -> tuple[dict[str, Tensor], LossFn]:
    """The module's parameters as a dict, and ``loss_fn(params, inputs, targets)``.

    ``loss_fn`` runs the module with ``torch.func.functional_call`` on the given params (its
    buffers as they are), so it vmaps over a population of parameter sets. The params are
    detached copies: optimizing them never touches the module until you load the result
    back with ``module.load_state_dict(best_params, strict=False)``. Being detached, none
    requires grad, so :func:`functional_bfo.hybrid_bfo` needs its ``grad_mask``: ``True``,
    or ``{n: p.requires_grad for n, p in module.named_parameters()}`` to keep frozen
    layers gradient-free.

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
        outputs = torch.func.functional_call(module, (params, buffers), (inputs,))
        return criterion(outputs, targets)

    return params, loss_fn
