"""Evaluators on ``torch.distributed``: a population sharded across ranks, or the data.

Both keep the state identical on every rank: each rank runs the same ``update`` with the
same key, and only the losses (and the hybrid's gradients) cross processes. Bacterium noise
depends only on (key, step, bacterium), so with :func:`sharded` any world size gives the
one-process trajectory: bit for bit where a candidate's loss does not depend on how many
are scored together, to float rounding where it does (matrix products, whose kernels round
by batch shape). :func:`data_parallel` splits the data instead.

Launch with ``torchrun`` (gloo on CPU, NCCL on GPU) and call ``init_process_group`` first,
with a ``timeout`` of minutes rather than torch's default 30: a rank that dies makes the
others raise at once, one that hangs within that timeout. The collectives are torch's own,
so ``torch.compile(update, fullgraph=True)`` captures them (as functional collectives).
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
from typing import Any

import optree
import torch
import torch.distributed as dist
from torch import Tensor

if dist.is_available():  # before any group exists: imported after init_process_group (by
    # torch.func's first gradient), it keeps the default group alive past its destruction,
    # and the group's gloo threads then race the interpreter's exit.
    import torch.distributed.nn  # noqa: F401

from ._base import LossFn, Params
from ._checks import check_bool, check_float, check_int, check_losses
from .evaluate import Evaluator, batched

__all__ = ["DataParallel", "Sharded", "check_agreement", "check_replicas", "data_parallel",
           "disagreeing", "sharded"]

LAST_BIT = 52  # a rank >= 52 sets this bit: the mask stays exact as a float64 (materialize)


def sharded(group: Any = None, *, grads: bool = False, chunk_size: int | None = None,
            inner: Evaluator | None = None) -> Sharded:
    """Each rank scores its slice of the candidates; the losses are all-gathered.

    Rank ``r`` of ``W`` takes rows ``[r N / W, (r + 1) N / W)`` of the ``N`` candidates (as
    ``torch.tensor_split`` cuts them; uneven slices are fine, empty ones too) and evaluates
    them with ``torch.func.vmap``. Every rank gets every loss, so the state stays identical.

    Args:
        group: the process group (None: the default one).
        grads: also return each candidate's gradient, ``(losses, grads)``, as ``hybrid_bfo``
            needs (each rank differentiates its own slice).
        chunk_size: as :func:`functional_bfo.evaluate.vmap`, for the local slice.
        inner: how a rank scores its slice (default: ``vmap``, with ``grad_and_value`` for
            ``grads``); with ``grads`` it returns ``(losses, grads)``.

    Examples:
        >>> import functional_bfo as fb
        >>> opt = fb.bfo(population_size=8, evaluator=fb.distributed.sharded())
    """
    return Sharded(group, grads, chunk_size, inner)


def data_parallel(group: Any = None, *, weight: float = 1.0, grads: bool = False,
                  chunk_size: int | None = None, inner: Evaluator | None = None) -> DataParallel:
    """Each rank scores every candidate on its own data; the losses are all-reduced.

    The loss of a candidate is ``sum_r weight_r * loss_r / sum_r weight_r``: with each rank's
    ``weight`` its number of samples and ``loss_fn`` a mean over them, that is the mean over
    all the data (to float rounding: the sum runs in float64, so it matches one process on
    the concatenated data to about 1e-6 relative in float32). Gradients are averaged alike.

    Args:
        group: the process group (None: the default one).
        weight: this rank's weight, e.g. the size of its data shard.
        grads: also all-reduce each candidate's gradient, ``(losses, grads)``, as
            ``hybrid_bfo`` needs.
        chunk_size: as :func:`functional_bfo.evaluate.vmap`.
        inner: how a rank scores the candidates on its data (as for :func:`sharded`).

    Examples:
        >>> import functional_bfo as fb
        >>> opt = fb.bfo(population_size=8, evaluator=fb.distributed.data_parallel(weight=128))
    """
    return DataParallel(group, grads, chunk_size, inner,
                        check_float("weight", weight, 0.0, low_open=True))


@dataclasses.dataclass(eq=False)
class Sharded:
    """The evaluator :func:`sharded` makes; ``around(inner, grads)`` swaps its local one."""

    group: Any
    grads: bool
    chunk_size: int | None
    inner: Evaluator | None

    def __post_init__(self) -> None:
        check_bool("grads", self.grads)
        if self.chunk_size is not None:
            check_int("chunk_size", self.chunk_size, 1)
        if self.inner is not None and not callable(self.inner):
            raise TypeError(f"inner must be an evaluator (a callable); got {self.inner!r}.")

    def around(self, inner: Evaluator, grads: bool) -> Sharded:
        """The same evaluator, scoring this rank's candidates (or data) with ``inner``.

        ``inner`` returns ``(losses, grads)`` if ``grads``, else the losses.
        """
        return dataclasses.replace(self, inner=inner, grads=grads)

    def local(self, loss_fn: LossFn, population: Params, args: tuple) -> tuple[Tensor, Any]:
        """This rank's losses (and gradients, or None) of ``population``, checked."""
        leaf = optree.tree_leaves(population)[0]
        if leaf.shape[0] == 0:  # more ranks than candidates: nothing to score here
            return leaf.new_empty(0), population if self.grads else None  # grads: the empty rows
        if self.inner is not None:
            out = self.inner(loss_fn, population, *args)
        elif self.grads:  # grad_and_value gives (grads, losses)
            out = batched(torch.func.grad_and_value(loss_fn), population, args,
                          self.chunk_size)[::-1]
        else:
            out = batched(loss_fn, population, args, self.chunk_size)
        losses, grads = out if self.grads else (out, None)
        return check_losses(losses, leaf.shape[0]), grads

    def __call__(self, loss_fn: LossFn, population: Params, *args: Any):
        """Every candidate's loss (and gradient), the same on every rank."""
        return self.with_disagreement(loss_fn, population, *args)[0]

    def with_disagreement(self, loss_fn: LossFn, population: Params, *args: Any
                          ) -> tuple[Any, Tensor]:
        """What ``__call__`` returns, and the ranks whose candidates were not rank 0's.

        A checksum of the candidates rides in the losses' all-gather (no other round trip):
        the optimizers record the ranks in ``state.disagreeing_ranks`` (see
        :func:`disagreeing`).
        """
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        size = optree.tree_leaves(population)[0].shape[0]
        counts = [size // world + (r < size % world) for r in range(world)]  # tensor_split's
        start = sum(counts[:rank])
        local = optree.tree_map(lambda x: x[start:start + counts[rank]], population)
        losses, grads = self.local(loss_fn, local, args)
        mine = torch.cat([losses.to(torch.float64), _checksum(population, losses.device)])
        parts = _gather(mine, [n + 1 for n in counts], self.group, "losses")
        out: Any = torch.cat([part[:-1] for part in parts])
        if self.grads:
            out = out, optree.tree_map(
                lambda g: torch.cat(_gather(g, counts, self.group, "gradients")), grads)
        return out, _differing(torch.stack([part[-1] for part in parts]))


@dataclasses.dataclass(eq=False)
class DataParallel(Sharded):
    """The evaluator :func:`data_parallel` makes; ``around(inner)`` as for :class:`Sharded`."""

    weight: float = 1.0

    def with_disagreement(self, loss_fn: LossFn, population: Params, *args: Any
                          ) -> tuple[Any, Tensor]:
        """As :meth:`Sharded.with_disagreement`; the checksums' slots ride in the all-reduce."""
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        losses, grads = self.local(loss_fn, population, args)
        leaves, spec = optree.tree_flatten(grads)  # None: no leaves
        weighted = torch.cat([losses.to(torch.float64)]
                             + [g.to(torch.float64).reshape(-1) for g in leaves]
                             + [losses.new_ones(1, dtype=torch.float64)]) * self.weight
        slots = torch.zeros(world, dtype=torch.float64, device=losses.device).index_put(
            (torch.tensor([rank], device=losses.device),), _checksum(population, losses.device))
        flat = torch.cat([weighted, slots])
        _collective(lambda: dist.all_reduce(flat, group=self.group), self.group, "losses")
        losses, *rest = (flat[:-world - 1] / flat[-world - 1]).split(
            [losses.numel()] + [g.numel() for g in leaves])
        grads = spec.unflatten([part.reshape(g.shape).to(g.dtype) for part, g in zip(rest, leaves)])
        return ((losses, grads) if self.grads else losses), _differing(flat[-world:])


def check_replicas(state: Any, group: Any = None) -> None:
    """Raise if ``state`` (any pytree) is not the same on every rank.

    Each rank hashes every leaf's bytes (SHA-256, on the host) and the digests are
    all-gathered: one collective of 8 bytes per rank, plus copying the state to the host.
    Replicas drift apart silently when ranks use different keys, or a loss reads rank-local
    data outside :func:`data_parallel`; call this every few updates to catch it.

    Raises:
        RuntimeError: on every rank, naming the ranks that disagree with rank 0.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("check_replicas compares the state across the ranks of a process "
                           "group; call torch.distributed.init_process_group first.")
    digest = hashlib.sha256()
    for leaf in optree.tree_leaves(state, none_is_leaf=True):
        if isinstance(leaf, Tensor):
            data = leaf.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{data.dtype}{tuple(leaf.shape)}".encode())
            digest.update(data.view(torch.uint8).numpy().tobytes())
        else:  # None, numbers: their pickled bytes (repr abbreviates big arrays)
            digest.update(pickle.dumps(leaf))
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend(group) == "nccl" else "cpu"
    mine = torch.tensor([int.from_bytes(digest.digest()[:8], "little", signed=True)],
                        dtype=torch.int64, device=device)
    values = [int(part) for part in _gather(mine, [1] * dist.get_world_size(group), group,
                                            "state checksums")]
    _refuse("the state differs", [r for r, value in enumerate(values) if value != values[0]])


def check_agreement(state: Any) -> None:
    """Raise if a sharded or data-parallel evaluation of ``state``'s run saw ranks disagree.

    Reads ``state.disagreeing_ranks`` on the host (one transfer, no collective): call it in
    your own loop every few updates; :func:`functional_bfo.run` and the adapters do.

    Raises:
        RuntimeError: naming the ranks whose candidates differed from rank 0's.
    """
    from .telemetry import disagreeing_ranks  # a core module that imports this one's package

    if (mask := disagreeing_ranks(state)) is not None:
        refuse_disagreement(int(mask))


def refuse_disagreement(mask: int) -> None:
    """A RuntimeError naming the ranks in ``mask``, a ``disagreeing_ranks`` read on the host."""
    _refuse("the candidates differ", disagreeing(mask),
            ", so the ranks scored other points and their states have drifted apart")


def disagreeing(mask: int) -> list[int]:
    """The ranks a ``disagreeing_ranks`` mask names: bit ``r`` is rank ``r`` (52: 52 or above)."""
    return [r for r in range(LAST_BIT + 1) if mask >> r & 1]


def _refuse(what: str, ranks: list[int], why: str = "") -> None:
    if ranks:
        raise RuntimeError(
            f"functional_bfo.distributed: {what} across ranks (ranks {ranks} disagree with rank "
            f"0){why}. Every rank must run the same key and see the same losses: build the key "
            "from one seed on every rank, evaluate with sharded() or data_parallel(), and keep "
            "rank-local data out of the loss unless it goes through data_parallel().")


def _checksum(population: Params, device: torch.device) -> Tensor:
    """(1,) float64: a digest of the candidates' bits, an integer below 2**52 (exact).

    The digest's top 12 bits are folded into the rest: a float64's sign and exponent move
    only those.
    """
    from ._ask_tell import state_digest

    digest = state_digest(optree.tree_map(lambda x: x.detach(), population))
    folded = torch.remainder(digest ^ (digest >> 52), 2**52)
    return folded.to(device=device, dtype=torch.float64).reshape(1)


def _differing(checks: Tensor) -> Tensor:
    """() int64: bit ``r`` set where rank ``r``'s checksum is not rank 0's."""
    differ = checks != checks[0]
    ranks = torch.arange(len(checks), device=checks.device).clamp_max(LAST_BIT)
    low = (differ[:LAST_BIT] * torch.pow(2, ranks[:LAST_BIT])).sum()
    return low | (differ[LAST_BIT:].any().to(torch.int64) << LAST_BIT)


def _gather(local: Tensor, counts: list[int], group: Any, what: str) -> list[Tensor]:
    """Every rank's rows of ``local``, ``counts[r]`` of rank ``r``'s, in rank order."""
    padded = local.new_zeros((max(counts),) + local.shape[1:])  # one size for the collective
    padded[:local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in counts]
    _collective(lambda: dist.all_gather(parts, padded, group=group), group, what)
    return [part[:n] for part, n in zip(parts, counts)]


def _collective(run: Any, group: Any, what: str) -> None:
    """Run a collective; a failure says what it means here (its type kept)."""
    try:
        run()
    except RuntimeError as e:
        if "Batching rule" in str(e):
            e.add_note("functional_bfo.distributed evaluators cannot run under torch.func.vmap "
                       "over runs: collectives have no batching rule. Run one optimizer per "
                       "process, or loop over the runs.")
        else:
            e.add_note(f"functional_bfo.distributed: rank {dist.get_rank(group)} of "
                       f"{dist.get_world_size(group)} could not get the other ranks' {what}: "
                       "the collective failed, or waited the process group's whole timeout "
                       "(init_process_group(timeout=...); torch's default is 30 minutes). "
                       "Another rank raised, was killed, or is still evaluating: look for the "
                       "first error in the other ranks' logs.")
        raise
