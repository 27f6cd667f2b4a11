"""Scoring candidates on the model: the only place an optimizer step touches the model.

The closure path writes each candidate into the parameters and calls the user's closure; the
fast path batches ``loss_fn`` with ``torch.func.vmap``. Either way a candidate leaves no
trace (:class:`Trace`), and :func:`evaluating_candidates` tells the model's code (logging,
metrics) that a forward pass scores a candidate.
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.nn.modules.module import register_module_forward_pre_hook

from functional_bfo.evaluate import batched

CLOSURE_RETURN_MSG = (
    "{who} must return the loss as a float or a one-element floating tensor; it returned "
    "{what}. End it with `return loss` (or `return loss.item()`)."
)

_SCORING = contextvars.ContextVar("functional_bfo_scoring_candidates", default=False)


def evaluating_candidates() -> bool:
    """True while an optimizer step scores candidates: skip logging and metrics then.

    The pass that ends a step at the best parameters is not a candidate.

    Examples:
        >>> from functional_bfo.adapters import evaluating_candidates
        >>> evaluating_candidates()
        False
    """
    return _SCORING.get()


class Trace:
    """The modules candidates run, and their buffers as they were before the step.

    While candidates are scored, torch's global forward pre-hook shows each module before it
    runs: its buffers are saved the first time (and put back after every candidate), and a
    train-mode normalization layer normalizes by batch statistics without writing running
    ones (what ``torch.func.replace_all_batch_norm_modules_`` does, for candidates only:
    ``vmap`` cannot update them in place). The vmapped update itself runs without the hook,
    so that it compiles as one graph; the layers seen so far (or ``module``'s) are set then.
    """

    def __init__(self, module: torch.nn.Module | None) -> None:
        if module is not None and not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be the torch.nn.Module being optimized; got "
                            f"{type(module).__name__}.")
        while isinstance(module, (torch.nn.DataParallel,
                                  torch.nn.parallel.DistributedDataParallel)):
            module = module.module
        self.module = module
        self.known: weakref.WeakSet = weakref.WeakSet(() if module is None else module.modules())
        self.saved: dict[int, tuple[Tensor, Tensor]] = {}
        self.flipped: list[torch.nn.Module] = []

    def begin(self) -> None:
        """A new step: ``module``'s buffers are saved now, the others when they first run."""
        self.saved = {}
        if self.module is not None:
            self._save(self.module)

    def restore(self) -> None:
        with torch.no_grad():
            for buffer, copy in self.saved.values():
                buffer.copy_(copy)

    def train_buffers(self) -> bool:
        """Whether a module seen in train mode has buffers (a step then ends at the best)."""
        return any(m.training and next(m.buffers(recurse=False), None) is not None
                   for m in list(self.known))

    @contextlib.contextmanager
    def scoring(self, hook: bool) -> Iterator[None]:
        """Candidates are scored: watched through the hook, or the known layers set."""
        token = _SCORING.set(True)
        handle = register_module_forward_pre_hook(self._seen) if hook else None
        if not hook:
            for m in list(self.known):
                self._batch_statistics(m)
        try:
            yield
        finally:
            if handle is not None:
                handle.remove()
            for m in self.flipped:
                m.track_running_stats = True
            self.flipped = []
            _SCORING.reset(token)

    def _seen(self, module: torch.nn.Module, args: Any) -> None:
        self.known.add(module)
        self._save(module)
        self._batch_statistics(module)

    def _save(self, module: torch.nn.Module) -> None:
        for b in module.buffers():
            if id(b) not in self.saved:
                self.saved[id(b)] = (b, b.detach().clone())

    def _batch_statistics(self, m: torch.nn.Module) -> None:
        if m.training and getattr(m, "track_running_stats", False):
            m.track_running_stats = False
            self.flipped.append(m)


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


def write(params: list[Tensor], values: list[Tensor]) -> None:
    """Copy ``values`` into the parameters in place (the model sees them)."""
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)


class CandidateEvaluator:
    """The core evaluator of one param group: the closure per candidate, or ``loss_fn`` vmapped.

    With ``closure`` set, each bacterium is written into ``params`` and the closure is called
    with gradients enabled; with ``with_grads`` each ``.grad`` is read too (cleared before
    the call, so candidates never share gradients; one the closure did not produce is NaN,
    i.e. unknown, if no ``backward`` ran, else zero). Without a closure, ``loss_fn`` is
    batched with ``torch.func.vmap`` (with ``grad_and_value`` for the hybrid).
    """

    def __init__(self, params: list[Tensor], trace: Trace, with_grads: bool) -> None:
        self.params, self.trace, self.with_grads = params, trace, with_grads
        self.closure: Callable[[], Any] | None = None
        self.chunk_size: int | None = None

    def __call__(self, loss_fn: Any, population: list[Tensor], *args: Any) -> Any:
        if self.closure is None:
            if not self.with_grads:
                return batched(loss_fn, population, args, self.chunk_size)
            grads, losses = batched(torch.func.grad_and_value(loss_fn), population, args,
                                    self.chunk_size)
            return losses, grads
        losses: list[float | Tensor] = []
        grads: list[list[Tensor]] = [[] for _ in self.params]
        with torch.enable_grad(), self.trace.scoring(hook=True):
            for i in range(population[0].shape[0]):
                write(self.params, [x[i] for x in population])
                for p in self.params if self.with_grads else ():
                    p.grad = None
                try:
                    losses.append(as_loss(self.closure()))
                finally:
                    self.trace.restore()
                backward = any(p.grad is not None for p in self.params)
                for slot, p in zip(grads if self.with_grads else (), self.params):
                    slot.append(p.grad.detach().to(p.dtype).clone() if p.grad is not None
                                else torch.full_like(p, torch.nan)
                                if p.requires_grad and not backward else torch.zeros_like(p))
        device = population[0].device
        out = (torch.tensor(losses, dtype=torch.float64, device=device)
               if all(isinstance(v, float) for v in losses) else
               torch.stack([torch.as_tensor(v, dtype=torch.float64).to(device) for v in losses]))
        return (out, [torch.stack(slot) for slot in grads]) if self.with_grads else out


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
        total: Any = 0.0
        for batch in window:
            loss = loss_of(batch)
            value = as_loss(loss, "closure_over's loss_of")
            if backward and not isinstance(loss, Tensor):
                raise TypeError(f"closure_over(backward=...) calls backward on loss_of's loss, "
                                f"so loss_of must return a tensor; it returned {loss!r:.60}. "
                                "Return the loss tensor, not loss.item().")
            if backward:
                (backward if callable(backward) else Tensor.backward)(loss / len(window))
            total = total + value
        return total / len(window)

    return closure
