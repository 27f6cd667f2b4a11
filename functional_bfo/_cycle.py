"""Cycle events (reproduction, elimination–dispersal): when they happen, and how they run.

An event happens on a few updates only (reproduction every ``N_c``), but an update must stay
one tensor program. So each event is a function ``event(flag, inputs, context) -> inputs``
that leaves ``inputs`` unchanged where its 0-d bool ``flag`` is false (it masks), and
:func:`run_event` picks the cheapest of three ways to run it, bitwise the same:

- plainly eager on the CPU the step is read: a flag known to be false skips the event;
- compiled for the CPU it runs under ``torch.cond``, so its work (a sort, gathers, the
  dispersal draws' use) is done only on the updates where it happens;
- everywhere else (vmap, GPU and CUDA graphs, traces) it runs masked on every update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import torch
from torch import Tensor

from ._eager import plain_cpu

_is_batched = torch._C._functorch.is_batchedtensor

Event = Callable[[Tensor, Any, Any], Any]


def cycle_flags(step: Tensor, periods: tuple[int, ...]) -> list[Tensor | bool]:
    """``step > 0 and step % period == 0`` for each period: whether a cycle ends now.

    Plainly eager on the CPU (``plain_cpu``) the step is read, which syncs nothing there,
    and a flag that does not hold is Python ``False``. Otherwise each flag is a 0-d bool
    tensor: no sync, no graph break.
    """
    if not plain_cpu(step):
        return [(step > 0) & (step % period == 0) for period in periods]
    now = int(step)
    return [torch.tensor(True) if now > 0 and now % period == 0 else False
            for period in periods]


def run_event(flag: Tensor | bool, event: Event, inputs: Any, context: Any = None, *,
              branch: bool = True) -> Any:
    """``event(flag, inputs, context)``: the new ``inputs``, or ``inputs`` where ``flag`` fails.

    ``inputs`` and ``context`` are pytrees of tensors (``context``: what the event reads,
    passed explicitly so that ``torch.cond`` sees every operand); ``event`` returns a
    pytree like ``inputs``.
    """
    if flag is False:
        return inputs
    leaves, spec = optree.tree_flatten(inputs)
    context_leaves, context_spec = optree.tree_flatten(context)
    operands = (flag, *leaves, *context_leaves)
    branch = (branch and torch.compiler.is_compiling()
              and all(x.device.type == "cpu" for x in operands)
              and not any(_is_batched(x) for x in operands))  # cond does not batch closures
    if not branch:
        return event(flag, inputs, context)

    device = flag.device

    def happens(*xs: Tensor) -> tuple[Tensor, ...]:
        ins, ctx = xs[: len(leaves)], xs[len(leaves):]
        out = event(torch.ones((), dtype=torch.bool, device=device),
                    spec.unflatten(ins), context_spec.unflatten(ctx))
        return tuple(y.clone() if any(y is x for x in xs) else y  # outputs may not alias
                     for y in optree.tree_leaves(out))

    def keeps(*xs: Tensor) -> tuple[Tensor, ...]:
        return tuple(x.clone() for x in xs[: len(leaves)])

    return spec.unflatten(torch.cond(flag, happens, keeps, _unaliased(operands[1:])))


def _unaliased(tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """``tensors``, with copies of views and of repeats: cond's operands may not alias.

    The uses of an update's noise are views of one draw. Repeats are found with ``is``, not
    ``id``: dynamo guards an input's ``id`` (a recompile per call), not its identity.
    """
    return tuple(x.clone() if x._base is not None or any(x is y for y in tensors[:i]) else x
                 for i, x in enumerate(tensors))
