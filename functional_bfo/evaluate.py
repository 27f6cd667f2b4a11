"""Population evaluators: how ``loss_fn`` is applied to every bacterium of a population.

An evaluator is any callable ``evaluator(loss_fn, population, *args) -> Tensor`` returning one loss
per row of ``population``, shape ``(N,)``: ``N = P`` candidates, or ``swim_batch * P`` when the
optimizer stacks several swim points of each bacterium into one call. ``vmap`` (the default) batches
the whole population into one call of ``loss_fn`` through ``torch.func.vmap``, optionally in chunks
to bound memory; ``loop`` calls ``loss_fn`` once per bacterium, for losses that cannot be vmapped. A
distributed evaluator implements the same protocol (it may shard the population across processes),
which is why bacterium randomness never depends on how the population is split.
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

VMAP_ADVICE = (
    "functional_bfo: loss_fn could not be batched by torch.func.vmap over the population. "
    "Losses that call .item(), .tolist() or .numpy(), branch in Python on tensor values, "
    "update captured tensors in place, or index with boolean masks cannot be batched: build "
    "the optimizer with evaluator=functional_bfo.evaluate.loop() (slower, calls loss_fn once "
    "per bacterium), or rewrite the branch with torch.where."
)
# What torch.func.vmap's own failures say: only these get the advice above.
VMAP_FAILURES = ("vmap", "Batching rule", "data pointer of Tensor that doesn't have storage",
                 "doesn't match the broadcast shape")


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
        if any(marker in message for marker in VMAP_FAILURES):
            e.add_note(VMAP_ADVICE)
        raise


class Evaluator(Protocol):
    """``evaluator(loss_fn, population, *args) -> losses`` of shape ``(N,)``, one per row.

    ``population`` has a leading bacterium axis on every leaf; ``args`` go to ``loss_fn``
    unbatched. Must be pure and sync-free to keep ``update`` compilable. An evaluator whose
    class has ``takes_rows = True`` (this module's) treats ``population`` as any pytree: it
    is handed the population's rows, one ``(N, D)`` tensor, and a ``loss_fn`` that takes a
    row, so that ``vmap`` batches one tensor rather than every leaf of the params. An evaluator
    with a ``with_disagreement`` method (:mod:`functional_bfo.distributed`'s) is called by
    it, returning also the mask of the ranks whose candidates were not rank 0's, which the
    optimizers keep in ``state.disagreeing_ranks``.
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


def _population_size(population: Params) -> int:
    return optree.tree_leaves(population)[0].shape[0]


def vmap(chunk_size: int | None = None) -> Evaluator:
    """Evaluate the population with ``torch.func.vmap(loss_fn)``.

    Args:
        chunk_size: evaluate at most this many bacteria at once (bounds peak memory of large
            models); None evaluates the whole population in one batch. Results do not depend on it,
            beyond the last bits of losses whose kernels round by batch shape (matrix products).
    """
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, 1)
    return _Vmap(chunk_size)


def loop() -> Evaluator:
    """Evaluate the population with one ``loss_fn`` call per bacterium, in a Python loop.

    For losses that ``vmap`` cannot batch. Under ``torch.compile`` the loop is unrolled, so
    prefer small populations there.
    """
    return _Loop()


class _Vmap:
    """:func:`vmap`'s evaluator."""

    takes_rows = True  # see Evaluator

    def __init__(self, chunk_size: int | None) -> None:
        self.chunk_size = chunk_size

    def __call__(self, loss_fn: LossFn, population: Params, *args: Any) -> Tensor:
        losses = batched(loss_fn, population, args, self.chunk_size)
        return check_losses(losses, _population_size(population))


class _Loop:
    """:func:`loop`'s evaluator."""

    takes_rows = True  # see Evaluator

    def __call__(self, loss_fn: LossFn, population: Params, *args: Any) -> Tensor:
        size = _population_size(population)
        losses = [check_loss(loss_fn(optree.tree_map(lambda x, i=i: x[i], population), *args))
                  for i in range(size)]
        return check_losses(torch.stack(losses), size)
