"""Population evaluators: how ``loss_fn`` is applied to every bacterium of a population.

An evaluator returns one loss per row of ``population``, shape ``(N,)``: ``N = P`` candidates,
or ``swim_batch * P`` when the optimizer stacks several swim points of each bacterium into one
call. :func:`vmap` (the default) batches the rows into calls of ``loss_fn``; :func:`loop`
calls it once per bacterium. A distributed evaluator implements the same protocol (it may
shard the population across processes), which is why bacterium randomness never depends on
how the population is split.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import optree
import torch
from torch import Tensor

from ._base import LossFn, Params
from ._checks import LOSS_TYPE_MSG, check_int, check_loss, check_losses

__all__ = ["Evaluator", "loop", "vmap"]


def batched(fn: Any, population: Params, args: tuple, chunk_size: int | None = None) -> Any:
    """``torch.func.vmap(fn)`` over the rows, ``args`` closed over (cheaper than ``in_dims``).

    Exceptions keep their type; where vmap is the cause a note says what to do.
    """
    try:
        return torch.func.vmap(lambda rows: fn(rows, *args), chunk_size=chunk_size)(population)
    except ValueError as e:
        if "must only return Tensors" not in str(e):
            raise
        raise TypeError(LOSS_TYPE_MSG.format(what="a value that is not a tensor")) from e
    except RuntimeError as e:
        message = str(e)  # not read in a generator: dynamo cannot trace a captured ``e``
        if any(marker in message for marker in (  # torch.func.vmap's own failures
                "vmap", "Batching rule", "data pointer of Tensor that doesn't have storage",
                "doesn't match the broadcast shape")):
            e.add_note(
                "functional_bfo: loss_fn could not be batched by torch.func.vmap over the "
                "population. Losses that call .item(), .tolist() or .numpy(), branch in Python "
                "on tensor values, update captured tensors in place, or index with boolean "
                "masks cannot be batched: build the optimizer with "
                "evaluator=functional_bfo.evaluate.loop() (slower, calls loss_fn once per "
                "bacterium), or rewrite the branch with torch.where.")
        raise


class Evaluator(Protocol):
    """``evaluator(loss_fn, population, *args) -> losses`` of shape ``(N,)``, one per row.

    ``population`` has a leading bacterium axis on every leaf; ``args`` go to ``loss_fn``
    unbatched. Must be pure and sync-free to keep ``update`` compilable. An evaluator whose
    class has ``takes_rows = True`` (this module's) treats ``population`` as any pytree: it
    is handed the population's rows, one ``(N, D)`` tensor, and a ``loss_fn`` of a row, so
    that ``vmap`` batches one tensor rather than every leaf of the params. One with a
    ``with_disagreement`` method (:mod:`functional_bfo.distributed`'s) is called by it, which
    also returns the mask of ranks whose candidates were not rank 0's (kept in
    ``state.disagreeing_ranks``).
    """

    def __call__(self, loss_fn: LossFn, population: Params, *args: Any) -> Tensor:
        """Losses of every candidate, shape (N,)."""
        ...


def check_evaluator(evaluator: Any,
                    form: str = "evaluator(loss_fn, population, *args) -> losses") -> Evaluator:
    """The default ``vmap()`` for None, else ``evaluator``, refusing an uncalled factory."""
    if evaluator is None:
        return vmap()
    if not callable(evaluator):
        raise TypeError(f"Invalid evaluator: {evaluator!r}; expected a callable {form}, such "
                        "as functional_bfo.evaluate.vmap(chunk_size=64).")
    try:
        kinds = [p.kind for p in inspect.signature(evaluator).parameters.values()]
    except (TypeError, ValueError):  # no signature to read (a builtin): trust it
        return evaluator
    positional = sum(k in (inspect.Parameter.POSITIONAL_ONLY,
                           inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds)
    if positional < 2 and inspect.Parameter.VAR_POSITIONAL not in kinds:
        name = getattr(evaluator, "__qualname__", repr(evaluator))
        raise TypeError(f"Invalid evaluator: {name} takes fewer than the two positional "
                        f"arguments of {form}. If it makes evaluators, call it: "
                        f"evaluator={name}().")
    return evaluator


def vmap(chunk_size: int | None = None) -> Evaluator:
    """Evaluate the population with ``torch.func.vmap(loss_fn)``.

    Args:
        chunk_size: evaluate at most this many bacteria at once (bounds peak memory of large
            models); None evaluates the whole population in one batch. Results do not depend on it,
            beyond the last bits of losses whose kernels round by batch shape (matrix products).
    """
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, 1)
    return _Local(chunk_size)


def loop() -> Evaluator:
    """Evaluate the population with one ``loss_fn`` call per bacterium, in a Python loop.

    For losses that ``vmap`` cannot batch. Under ``torch.compile`` the loop is unrolled, so
    prefer small populations there.
    """
    return _Local(0)


class _Local:
    """:func:`vmap`'s evaluator, or :func:`loop`'s (``chunk_size`` 0)."""

    takes_rows = True  # see Evaluator

    def __init__(self, chunk_size: int | None) -> None:
        self.chunk_size = chunk_size

    def __call__(self, loss_fn: LossFn, population: Params, *args: Any) -> Tensor:
        size = optree.tree_leaves(population)[0].shape[0]
        if self.chunk_size == 0:  # loop()
            rows = [optree.tree_map(lambda x, i=i: x[i], population) for i in range(size)]
            losses = torch.stack([check_loss(loss_fn(row, *args)) for row in rows])
        else:
            losses = batched(loss_fn, population, args, self.chunk_size)
        return check_losses(losses, size)
