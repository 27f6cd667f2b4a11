"""Scoring candidates on the model: the only place an optimizer step touches the model.

The closure path writes each candidate into the parameters and calls the user's closure; the
fast path batches ``loss_fn`` with ``torch.func.vmap``. Either way a candidate leaves no
trace: the model's buffers (BatchNorm running statistics and counters) are put back after
every candidate, and :func:`evaluating_candidates` tells the model's code (logging, metrics)
that the forward pass scores a candidate.
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from functional_bfo.evaluate import batched

CLOSURE_RETURN_MSG = (
    "{who} must return the loss as a float or a one-element floating tensor; it returned "
    "{what}. End it with `return loss` (or `return loss.item()`)."
)

_SCORING = contextvars.ContextVar("functional_bfo_scoring_candidates", default=False)


def evaluating_candidates() -> bool:
    """True while an optimizer step scores candidates: skip logging and metrics then.

    The last forward pass of a step that tracks a ``module`` (the best parameters, to
    update its buffers) is not a candidate.

    Examples:
        >>> from functional_bfo.adapters import evaluating_candidates
        >>> evaluating_candidates()
        False
    """
    return _SCORING.get()


@contextlib.contextmanager
def scoring_candidates() -> Iterator[None]:
    token = _SCORING.set(True)
    try:
        yield
    finally:
        _SCORING.reset(token)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside ``DataParallel`` / ``DistributedDataParallel`` (or the model)."""
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    while isinstance(module, wrappers):
        module = module.module
    return module


class Buffers:
    """A model's buffers as they were before a step, put back after every candidate."""

    def __init__(self, module: torch.nn.Module | None) -> None:
        if module is not None and not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be the torch.nn.Module being optimized; got "
                            f"{type(module).__name__}.")
        self.module = None if module is None else unwrap(module)
        self.tensors: list[Tensor] = []
        self.saved: list[Tensor] = []

    @property
    def settle(self) -> bool:
        """Whether a step ends with one forward pass at the best params (train mode).

        The model's buffers, and what its code logs, are then the best's.
        """
        return self.module is not None and self.module.training

    def save(self) -> None:
        """Keep the buffers as they are (read now: ``module.to()`` replaces them)."""
        self.tensors = [] if self.module is None else list(self.module.buffers())
        self.saved = [b.detach().clone() for b in self.tensors]

    def restore(self) -> None:
        if not self.tensors:
            return
        with torch.no_grad():
            for b, s in zip(self.tensors, self.saved):
                b.copy_(s)

    @contextlib.contextmanager
    def batch_statistics(self) -> Iterator[None]:
        """Train-mode normalization layers normalize by batch statistics, writing none.

        ``vmap`` cannot update running statistics in place; this is what
        ``torch.func.replace_all_batch_norm_modules_`` does, for this block only.
        """
        layers = [] if self.module is None else [
            m for m in self.module.modules()
            if m.training and getattr(m, "track_running_stats", False)]
        for m in layers:
            m.track_running_stats = False
        try:
            yield
        finally:
            for m in layers:
                m.track_running_stats = True


def as_loss(value: Any, who: str = "The closure") -> float | Tensor:
    """One closure result as a Python float or a 0-d float64 tensor (no host sync)."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(CLOSURE_RETURN_MSG.format(
                who=who, what=f"a tensor of shape {tuple(value.shape)}"))
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(CLOSURE_RETURN_MSG.format(who=who, what=f"a {value.dtype} tensor"))
        return value.detach().reshape(()).to(torch.float64)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise TypeError(CLOSURE_RETURN_MSG.format(
        who=who, what=f"{type(value).__name__} {value!r:.60}"))


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


class CandidateEvaluator:
    """The core evaluator of one param group: the closure per candidate, or ``loss_fn`` vmapped.

    With ``closure`` set (during ``step(closure)``) each bacterium is written into
    ``params``, the buffers are put back, and the closure is called with gradients enabled;
    with ``with_grads`` each parameter's ``.grad`` is read too (cleared before the call, so
    candidates never share gradients; a gradient the closure did not produce is NaN, i.e.
    unknown, if the closure called no ``backward``, else zero). Without a closure the
    core's ``loss_fn`` is batched with ``torch.func.vmap`` (with ``grad_and_value`` for
    the hybrid), as the core's default evaluator does.
    """

    def __init__(self, params: list[Tensor], buffers: Buffers, with_grads: bool,
                 chunk_size: int | None) -> None:
        self.params, self.buffers = params, buffers
        self.with_grads, self.chunk_size = with_grads, chunk_size
        self.closure: Callable[[], Any] | None = None

    def __call__(self, loss_fn: Any, population: list[Tensor], *args: Any):
        if self.closure is None:
            if not self.with_grads:
                return batched(loss_fn, population, args, self.chunk_size)
            grads, losses = batched(torch.func.grad_and_value(loss_fn), population, args,
                                    self.chunk_size)
            return losses, grads
        losses: list[float | Tensor] = []
        grads: list[list[Tensor]] = [[] for _ in self.params]
        with torch.enable_grad(), scoring_candidates():
            for i in range(population[0].shape[0]):
                write(self.params, [x[i] for x in population])
                if self.with_grads:
                    for p in self.params:
                        p.grad = None
                try:
                    losses.append(as_loss(self.closure()))
                finally:
                    self.buffers.restore()
                if self.with_grads:
                    backward = any(p.grad is not None for p in self.params)
                    for slot, p in zip(grads, self.params):
                        slot.append(_grad_of(p, backward))
        out = stack_losses(losses, population[0].device)
        if not self.with_grads:
            return out
        return out, [torch.stack(slot) for slot in grads]


def _grad_of(p: Tensor, backward: bool) -> Tensor:
    """A copy of ``p.grad``, or zero or NaN (unknown) without one.

    Zero if the closure called ``backward`` (so the loss does not depend on ``p``) or ``p``
    takes no gradients; NaN if ``p`` takes gradients and no ``backward`` ran.
    """
    if p.grad is not None:
        return p.grad.detach().to(p.dtype).clone()
    return torch.full_like(p, torch.nan) if p.requires_grad and not backward else (
        torch.zeros_like(p))


def closure_over(batches: Iterable[Any], loss_of: Callable[[Any], Tensor], *,
                 backward: bool | Callable[[Tensor], Any] = False,
                 optimizer: torch.optim.Optimizer | None = None) -> Callable[[], float | Tensor]:
    """A closure that scores the model on every batch of a window: their mean loss.

    Gradient accumulation with a population optimizer: every candidate of a step must be
    scored on the same batches. A closure that draws its batches from a loader (as the
    integration guide's does) ranks each candidate on different data; here the batches are
    read once, when the closure is made.

    Args:
        batches: the window's batches (read into a list now).
        loss_of: ``loss_of(batch) -> loss`` for the model as it stands (float or
            one-element tensor, as a closure's; a tensor with its graph for ``backward``).
        backward: call ``backward`` on each batch's share of the mean (HybridBFO reads the
            accumulated gradient); a callable (``accelerator.backward``) is called instead.
        optimizer: zero its gradients at the start of each call.

    Examples:
        >>> import torch
        >>> from functional_bfo.adapters import closure_over
        >>> w = torch.zeros(2, requires_grad=True)
        >>> closure = closure_over([torch.ones(2), 3 * torch.ones(2)], lambda b: (w - b).sum())
        >>> float(closure())
        -4.0
    """
    window = list(batches)
    if not window:
        raise ValueError("closure_over needs at least one batch.")
    if not callable(loss_of):
        raise TypeError(f"loss_of must be a callable batch -> loss; got {loss_of!r}.")

    def closure() -> float | Tensor:
        if optimizer is not None:
            optimizer.zero_grad()
        total = None  # in float64, on the loss's device
        for batch in window:
            loss = loss_of(batch)
            value = as_loss(loss, "closure_over's loss_of")
            if backward and not isinstance(loss, Tensor):
                raise TypeError(f"closure_over(backward=...) calls backward on loss_of's loss, "
                                f"so loss_of must return a tensor; it returned {loss!r:.60}. "
                                "Return the loss tensor, not loss.item().")
            if callable(backward):
                backward(loss / len(window))
            elif backward:
                (loss / len(window)).backward()
            total = value if total is None else total + value
        return total / len(window)

    return closure
