"""Scoring candidates on the model, the only place a step touches it, leaving no trace."""

from __future__ import annotations

import contextlib
import contextvars
import numbers
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.nn.modules.module import register_module_forward_pre_hook

from functional_bfo.evaluate import batched

_SCORING = contextvars.ContextVar("functional_bfo_scoring_candidates", default=False)


def evaluating_candidates() -> bool:
    """True while a step scores candidates (not at its end, at the best): skip logging then.

    Examples:
        >>> from functional_bfo.adapters import evaluating_candidates
        >>> evaluating_candidates()
        False
    """
    return _SCORING.get()


class Trace:
    """The modules candidates run, and their buffers as they were before the step.

    torch's global forward pre-hook shows each module a candidate runs: its buffers are saved,
    train-mode norm layers stop writing statistics (the vmapped update, one graph, runs
    without it: the modules known so far are set up front).
    """

    def __init__(self, module: torch.nn.Module | None) -> None:
        if module is not None and not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be the model, a torch.nn.Module; got {module!r:.40}.")
        self.known = weakref.WeakSet(() if module is None else module.modules())
        self.saved: dict[int, tuple[Tensor, Tensor]] = {}  # id -> (buffer, its copy)

    def begin(self) -> None:
        """A new step: the known modules' buffers are saved now, the others at first sight."""
        self.saved = {id(b): (b, b.detach().clone()) for m in list(self.known) for b in m.buffers()}

    def restore(self) -> None:
        for buffer, copy in self.saved.values():
            buffer.detach().copy_(copy)  # no autograd: no grad-mode switch per candidate

    def train_buffers(self) -> bool:
        """Whether a known module in train mode has buffers (a step then ends at the best)."""
        return any(m.training and dict(m.named_buffers(recurse=False)) for m in list(self.known))

    @contextlib.contextmanager
    def scoring(self, hook: bool) -> Iterator[Any]:
        """Candidates are scored: watched through the hook, or the known layers set."""
        token, flipped = _SCORING.set(True), list[torch.nn.Module]()
        for m in () if hook else list(self.known):
            self._seen(m, flipped)
        try:
            with (register_module_forward_pre_hook(lambda m, _: self._seen(m, flipped)) if hook
                  else contextlib.nullcontext()) as handle:
                yield handle  # the hook's, to remove it early
        finally:
            for m in flipped:
                m.track_running_stats = True  # type: ignore[assignment]
            _SCORING.reset(token)

    def _seen(self, module: torch.nn.Module, flipped: list[torch.nn.Module]) -> None:
        if module not in self.known:  # else saved at the step's start
            self.known.add(module)
            for b in module.buffers():
                self.saved.setdefault(id(b), (b, b.detach().clone()))
        if module.training and getattr(module, "track_running_stats", False):
            module.track_running_stats = False  # type: ignore[assignment]  # BatchNorm's
            flipped.append(module)


def as_loss(value: Any) -> float | Tensor:
    """A closure's loss as a Python float or a 0-d float64 tensor (no host sync)."""
    if isinstance(value, Tensor) and value.numel() == 1 and value.is_floating_point():
        return value.detach().reshape(()).to(torch.float64)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    what = (f"a {value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor)
            else f"{type(value).__name__} {value!r:.60}")
    raise TypeError(f"The closure must return the loss as a float or a one-element floating "
                    f"tensor; it returned {what}. End it with `return loss`.")


def write(params: list[Tensor], values: list[Tensor]) -> None:
    """Copy ``values`` into the parameters in place (the model sees them)."""
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)


class CandidateEvaluator:
    """A param group's core evaluator: ``closure`` per candidate, or ``loss_fn`` vmapped.

    ``with_grads`` reads each ``.grad`` too: NaN (unknown) if the closure ran no ``backward``.
    """

    takes_rows = property(lambda self: self.closure is None)  # the fast path takes rows

    def __init__(self, params: list[Tensor], trace: Trace, with_grads: bool) -> None:
        self.params, self.trace, self.with_grads, self.chunk_size = params, trace, with_grads, None
        self.closure: Callable[[], Any] | None = None  # set for a step; None: the fast path

    def __call__(self, loss_fn: Any, population: Any, *args: Any) -> Any:
        if self.closure is None:  # the fast path; the hybrid's as (losses, grads)
            f = torch.func.grad_and_value(loss_fn) if self.with_grads else loss_fn
            out = batched(f, population, args, self.chunk_size)
            return out[::-1] if self.with_grads else out
        losses, grads = [], [list[Tensor]() for _ in self.params]
        with torch.enable_grad(), self.trace.scoring(hook=True) as hook:
            for i in range(population[0].shape[0]):
                if i == 1:  # the first candidate showed the modules; hooked calls are slower
                    hook.remove()
                write(self.params, [x[i] for x in population])
                for p in self.params if self.with_grads else ():
                    p.grad = None
                try:
                    losses.append(as_loss(self.closure()))
                finally:
                    self.trace.restore()
                backward = self.with_grads and any(p.grad is not None for p in self.params)
                for slot, p in zip(grads if self.with_grads else (), self.params):
                    slot.append(p.grad.detach().to_dense().to(p.dtype).clone() if p.grad is not None
                                else torch.full_like(p, torch.nan)
                                if p.requires_grad and not backward else torch.zeros_like(p))
        kw: Any = {"dtype": torch.float64, "device": population[0].device}  # one transfer
        out = (torch.tensor(losses, **kw) if all(type(v) is float for v in losses)
               else torch.stack([torch.as_tensor(v, **kw) for v in losses]))
        return (out, [torch.stack(slot) for slot in grads]) if self.with_grads else out
