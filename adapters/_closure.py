"""Closure evaluation: write each candidate into the parameters, call the closure, read the loss.

This is the only place the stateful world touches the model during a step. The closure may
return a float or a one-element tensor and may call ``backward``; it always runs with
gradients enabled and is never asked to differentiate anything itself.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

CLOSURE_RETURN_MSG = (
    "The closure must return the loss as a float or a one-element floating tensor; it returned "
    "{what}. End it with `return loss` (or `return loss.item()`)."
)


def as_loss(value: Any) -> float | Tensor:
    """One closure result as a Python float or a 0-d float64 tensor (no host sync)."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(CLOSURE_RETURN_MSG.format(
                what=f"a tensor of shape {tuple(value.shape)}"))
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(CLOSURE_RETURN_MSG.format(what=f"a {value.dtype} tensor"))
        return value.detach().reshape(()).to(torch.float64)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise TypeError(CLOSURE_RETURN_MSG.format(what=f"{type(value).__name__} {value!r:.60}"))


def stack_losses(values: list[float | Tensor], device: torch.device) -> Tensor:
    """The closure results of a population as one float64 tensor of shape (P,)."""
    if all(isinstance(v, float) for v in values):
        return torch.tensor(values, dtype=torch.float64, device=device)
    return torch.stack([torch.as_tensor(v, dtype=torch.float64).to(device) for v in values])


def write(params: list[Tensor], values: list[Tensor]) -> None:
    """Copy ``values`` into the parameters in place (the model sees them)."""
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)


class ClosureEvaluator:
    """A core evaluator that runs the user's closure once per bacterium.

    The core passes it a population; for each bacterium it writes the candidate into
    ``params``, calls ``self.closure`` and reads the loss, and with ``with_grads`` also each
    parameter's ``.grad`` (cleared before the call, so candidates never share gradients; a
    gradient the closure did not produce is NaN, i.e. unknown, on leaves that require
    gradients and zero elsewhere). ``loss_fn`` from the core is ignored: the closure is it.
    """

    def __init__(self, params: list[Tensor], with_grads: bool) -> None:
        self.params = params
        self.with_grads = with_grads
        self.closure: Callable[[], Any] | None = None

    def __call__(self, loss_fn: Any, population: list[Tensor], *args: Any):
        if self.closure is None:
            raise RuntimeError("ClosureEvaluator called outside step(closure).")
        size = population[0].shape[0]
        losses: list[float | Tensor] = []
        grads: list[list[Tensor]] = [[] for _ in self.params]
        for i in range(size):
            write(self.params, [x[i] for x in population])
            if self.with_grads:
                for p in self.params:
                    p.grad = None
            with torch.enable_grad():
                losses.append(as_loss(self.closure()))
            if self.with_grads:
                for slot, p in zip(grads, self.params):
                    slot.append(_grad_of(p))
        out = stack_losses(losses, population[0].device)
        if not self.with_grads:
            return out
        return out, [torch.stack(slot) for slot in grads]


def _grad_of(p: Tensor) -> Tensor:
    """A copy of ``p.grad``; NaN (unknown) if ``p`` takes gradients but got none, else zero."""
    if p.grad is not None:
        return p.grad.detach().to(p.dtype).clone()
    return torch.full_like(p, torch.nan) if p.requires_grad else torch.zeros_like(p)
