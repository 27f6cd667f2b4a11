"""State utilities: checkpoints, hyperparameter changes and a scored start."""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import secrets
import stat
import time
from typing import IO, Any, TypeVar, cast

import optree
import torch
from torch import Tensor

from ._checks import check_ordered, interval, path_str
from ._layout import layout, ravel, strided

try:  # advisory locks tell a live writer's scratch file from a killed one's
    import fcntl
except ImportError:  # Windows: no flock; killed writes' scratch files are then kept
    fcntl = None  # type: ignore[assignment]

State = TypeVar("State", bound=Any)  # a NamedTuple state of any variant
FORMAT = "functional_bfo.state/1"
PathOrFile = str | os.PathLike | IO[bytes]


def with_hyperparams(state: State, **values: Any) -> State:
    """A copy of ``state`` whose ``state.hyperparams`` fields take the given values.

    Values are cast to the dtype and device of the field they replace, so a compiled
    ``update`` keeps its graph.

    Examples:
        >>> import torch, functional_bfo as fb
        >>> state = fb.bfo(population_size=4).init({"x": torch.zeros(2)}, key=fb.random.key(0))
        >>> float(fb.with_hyperparams(state, step_size=0.05).hyperparams.step_size)
        0.05000000074505806
    """
    hp = getattr(state, "hyperparams", None)
    if hp is None:
        raise TypeError(f"Expected the state returned by init/update (it has .hyperparams), "
                        f"got {type(state).__name__}.")
    if unknown := sorted(set(values) - set(hp._fields)):
        raise ValueError(f"Unknown hyperparameters {unknown}; this state has {list(hp._fields)}.")
    ranges, fields = getattr(type(hp), "RANGES", {}), {}
    for name, value in values.items():
        old = getattr(hp, name)
        try:
            new = torch.as_tensor(value)
            if not isinstance(value, Tensor) and new.is_floating_point():  # not via float32
                new = torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            new = None
        if new is None or new.dtype == torch.bool or new.is_complex():
            raise TypeError(f"Invalid {name}: {value!r}; expected a real number (or one per "
                            "run of a batched state), e.g. with_hyperparams(state, "
                            f"{name}=0.05).")
        new = new.to(dtype=old.dtype, device=old.device)
        try:  # a batched (vmapped) state takes a scalar or one value per run
            new = torch.broadcast_to(new, old.shape)
        except RuntimeError:
            raise ValueError(f"Invalid {name}: shape {tuple(new.shape)} does not fit the state's "
                             f"{tuple(old.shape)}.") from None
        if name in ranges and (box := _outside(new, *ranges[name])):  # read on the host
            raise ValueError(f"Invalid {name}: {value!r}; expected finite values in {box}.")
        fields[name] = new
    new_hp = hp._replace(**fields)
    check_ordered(new_hp._asdict(), getattr(type(hp), "ORDERED", ()))
    return state._replace(hyperparams=new_hp)


def save(state: Any, f: PathOrFile) -> None:
    """Write ``state`` to ``f`` as plain tensors, loadable with ``torch.load(weights_only=True)``.

    A path is written atomically (to a locked temporary file beside it, flushed to disk, then
    renamed over it), so a write that fails or is killed leaves the previous checkpoint
    intact, and saves to one path from several threads or processes all succeed, the last
    rename winning; a good write removes the temporary files killed writes left. A symbolic
    link's target is written, the link kept. The structure is not stored (a custom NamedTuple
    is not on torch's allow-list): :func:`load` rebuilds it from a template state, and a
    digest of the tensors lets it refuse a corrupted file.

    Raises:
        TypeError: ``state`` is not an optimizer's state of tensors.
    """
    data = to_dict(state)
    if not isinstance(f, (str, os.PathLike)):  # a file object: the caller owns its fate
        torch.save(data, f)
        return
    path = os.path.realpath(os.fspath(f))  # through a link to the file it names
    folder, name = os.path.split(path)
    started = time.time()
    handle, scratch = _scratch(folder, name)
    try:
        with os.fdopen(handle, "wb") as out:
            if fcntl is not None:  # held until closed, after the rename
                fcntl.flock(out.fileno(), fcntl.LOCK_EX)
            torch.save(data, out)
            out.flush()
            os.fsync(out.fileno())
            if fcntl is not None:
                os.replace(scratch, path)
        if fcntl is None:  # Windows renames no open file
            os.replace(scratch, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(scratch)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where supported
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    # Killed writes' scratch files: .{name}.XXXXXXXX.tmp (mkstemp's 8 random characters),
    # older than this write and unlocked.
    for entry in os.scandir(folder) if fcntl is not None else ():
        if (entry.name.startswith(f".{name}.") and entry.name.endswith(".tmp")
                and len(entry.name) == len(name) + 14 and entry.is_file(follow_symlinks=False)):
            with contextlib.suppress(OSError), open(entry.path, "rb") as held:
                if entry.stat(follow_symlinks=False).st_mtime < started:
                    fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # else in use
                    os.unlink(entry.path)


def _scratch(folder: str, name: str) -> tuple[int, str]:
    """A new scratch file ``.{name}.XXXXXXXX.tmp`` beside ``name``, and its handle.

    Made as open() makes one (the umask applies, not mkstemp's 0600), then given the mode of
    the file it will replace, if there is one.
    """
    while True:
        scratch = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            handle = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                             | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
        with contextlib.suppress(FileNotFoundError):
            os.chmod(scratch, stat.S_IMODE(os.stat(os.path.join(folder, name)).st_mode))
        return handle, scratch


def with_start_loss(state: State, loss: Any, grad: Any = None) -> State:
    """``state`` before its first update, with bacterium 0 (the initial params) scored.

    A driver that has just scored its starting params (as the ``torch.optim`` shell does)
    hands over that loss, and for ``hybrid_bfo`` the gradient there (a pytree like params),
    instead of paying again: the first update swims on from bacterium 0, whose first hybrid
    tumble follows the gradient. The loss counts as one evaluation and becomes the best; a
    non-finite loss (gradient) leaves bacterium 0's loss (gradient) unknown. It reads the
    step on the host, so it takes one unbatched state (a batch of runs: per run).

    Examples:
        >>> import torch, functional_bfo as fb
        >>> opt = fb.hybrid_bfo(population_size=4, gradient_weight=1.0, grad_mask=True)
        >>> state = opt.init({"x": torch.ones(2)}, key=fb.random.key(0))
        >>> state = fb.with_start_loss(state, 2.0, grad={"x": torch.full((2,), 2.0)})
        >>> float(state.best_loss), int(state.num_evals)
        (2.0, 1)
    """
    losses = getattr(state, "losses", None)
    if losses is None or not hasattr(state, "best_params"):
        raise TypeError(f"Expected the state returned by init, got {type(state).__name__}.")
    if int(state.step) != 0:
        raise ValueError(f"with_start_loss scores the params an optimizer started from; this "
                         f"state has made {int(state.step)} updates. Call it right after init.")
    value = loss.detach() if isinstance(loss, Tensor) else torch.as_tensor(
        loss, dtype=losses.dtype)  # a Python number straight to the state's dtype
    if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
        raise ValueError(f"Invalid loss: {loss!r}; expected one real number.")
    value = value.to(losses.dtype).to(losses.device).reshape(())
    finite = torch.isfinite(value)
    first = (torch.tensor(0, device=losses.device),)  # bacterium 0, as index_put takes it
    fields = {"losses": losses.index_put(first, torch.where(finite, value, torch.nan)),
              "best_loss": torch.where(finite, value, state.best_loss),
              "num_evals": state.num_evals + 1}
    if grad is not None:
        if not hasattr(state, "grads"):
            raise TypeError(f"grad= is for hybrid_bfo states; this is a {type(state).__name__}.")
        shape = layout(state.best_params)
        given = [strided(torch.as_tensor(g).detach()) for g in shape.spec.flatten_up_to(grad)]
        for g, want in zip(given, shape.shapes):
            if g.shape != want:
                raise ValueError(f"Invalid grad: a leaf of shape {tuple(g.shape)} where params "
                                 f"has {tuple(want)}; pass a gradient like params.")
        row = ravel(shape, shape.spec.unflatten(given)).to(state.grads.device)
        fields["grads"] = state.grads.index_put(first, torch.nan_to_num(row, 0.0, 0.0, 0.0))
        fields["grad_known"] = state.grad_known.index_put(first, torch.isfinite(row).all() & finite)
    return state._replace(**fields)


def to_dict(state: Any) -> dict[str, Any]:
    """``state`` as a dict of plain values and tensors (what :func:`save` writes)."""
    if not hasattr(state, "_fields"):
        raise TypeError(f"Expected the state returned by init/update, got {type(state).__name__}.")
    leaves, _, names = _flatten(state)
    for name, x in zip(names, leaves):
        if not isinstance(x, Tensor):
            raise TypeError(f"save writes states whose leaves are tensors, but {name} is of "
                            f"type {type(x).__name__}; pass the state returned by init/update.")
    leaves = [x.detach() for x in leaves]
    return {"format": FORMAT, "type": type(state).__name__, "paths": names, "leaves": leaves,
            "digest": _digest(type(state).__name__, names, leaves)}


def _digest(kind: str, names: list[str], leaves: list[Tensor]) -> str:
    """SHA-256 over the state's type, leaf paths, dtypes, shapes and bytes."""
    h = hashlib.sha256(f"{FORMAT}\0{kind}".encode())
    for name, x in zip(names, leaves):
        h.update(f"\0{name}\0{x.dtype}\0{tuple(x.shape)}\0".encode())
        h.update(x.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _flatten(state: Any) -> tuple[list[Any], optree.PyTreeSpec, list[str]]:
    """Leaves, treespec, and leaf paths as ``state.population['b'][0]`` (optree indexes fields)."""
    paths, leaves, spec = optree.tree_flatten_with_path(state)
    return leaves, spec, [f"state.{state._fields[p[0]]}" + path_str(p[1:], root="") for p in paths]


def load(f: PathOrFile, like: State, map_location: Any = None) -> State:
    """Read a state written by :func:`save`, with the structure of ``like``.

    ``like`` is any state of the same optimizer and params structure, e.g. a fresh
    ``opt.init(params, key=...)``; a resumed run continues bitwise as one that never stopped.
    The file's digest catches a truncated or corrupted file, not an edited one (an editor
    can recompute it), so the values are checked too. Load only files you trust:
    ``torch.load`` reads them, with ``weights_only=True`` and ``map_location`` (default:
    ``like``'s device, so a GPU's checkpoint loads on a machine without one); the state
    comes back on ``like``'s device either way.

    Raises:
        ValueError: the file is not a complete, unmodified checkpoint written by
            :func:`save`, does not match ``like``, or holds a state no update makes
            (a hyperparameter out of range, non-finite positions, a negative counter).
            A missing path raises ``FileNotFoundError`` as usual.
    """
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as handle:
            return load(handle, like, map_location)
    if map_location is None:  # onto like's device: a GPU's file loads on a machine without one
        map_location = optree.tree_leaves(like)[0].device
    try:
        data = torch.load(f, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated, not a zip, not torch's, or unsafe to unpickle
        first = (str(e).strip().splitlines() or [""])[0][:120]
        raise ValueError(f"Not a functional_bfo state checkpoint: torch.load could not read it "
                         f"({type(e).__name__}: {first}); write one with "
                         "functional_bfo.save(state, path).") from e
    return from_dict(data, like)


def from_dict(data: Any, like: State, by_losses: bool = True) -> State:
    """The state :func:`to_dict` made ``data`` from, checked against ``like``.

    ``by_losses=False`` skips reading the direction from the best and the losses, for a
    caller that knows it (the torch.optim shell: its best is rescored on each new batch).
    """
    fields = {"format": str, "type": str, "paths": list, "leaves": list, "digest": str}
    if not isinstance(data, dict) or data.get("format") != FORMAT or any(
            not isinstance(data.get(k), t) for k, t in fields.items()):
        raise ValueError(f"Not a functional_bfo state checkpoint (expected format {FORMAT} "
                         f"with {sorted(fields)}); write one with functional_bfo.save(state, "
                         "path).")
    saved = data["leaves"]
    if (len(saved) != len(data["paths"]) or not all(isinstance(x, Tensor) for x in saved)
            or not all(isinstance(x, str) for x in data["paths"])
            or _digest(data["type"], data["paths"], saved) != data["digest"]):
        raise ValueError("The checkpoint's tensors do not match its digest: the file was "
                         "modified or corrupted after it was written. Load an intact copy.")
    leaves, spec, names = _flatten(like)
    if data["type"] != type(like).__name__ or data["paths"] != names:
        saved_only = [p for p in data["paths"] if p not in names]
        like_only = [p for p in names if p not in data["paths"]]
        raise ValueError(f"Checkpoint holds a {data['type']} of {len(saved)} leaves, but like "
                         f"is a {type(like).__name__} of {len(names)}: only in the checkpoint "
                         f"{saved_only[:8]}, only in like {like_only[:8]} (8 at most each); "
                         "pass a state of the same optimizer and params structure.")
    for name, x, ref in zip(names, saved, leaves):
        if x.shape != ref.shape or x.dtype != ref.dtype:
            raise ValueError(f"Checkpoint leaf {name} is {x.dtype} {tuple(x.shape)} but like "
                             f"has {ref.dtype} {tuple(ref.shape)}; the optimizer (population "
                             "size) or params differ.")
    state = cast(State, spec.unflatten([x.to(ref.device) for x, ref in zip(saved, leaves)]))
    _check(state, like)
    if not by_losses:
        return state
    mine, theirs = direction(state), direction(like, "like")
    if mine is not None and theirs is not None and mine != theirs:
        ways = {1.0: "minimizing", -1.0: "maximizing"}
        raise ValueError(f"The checkpoint was written by a {ways[mine]} optimizer, but like "
                         f"is a {ways[theirs]} one's state: a resumed run would hold the "
                         "wrong best. Pass like from an optimizer with the maximize= of the "
                         "run you resume.")
    return state


# The states a black-box search's state holds, checked as states of their own.
HELD_STATES = ("swarm", "explorer", "faces", "walker")
# What every value of these fields passes in any state that init and update make.
VALUE_RULES: tuple[tuple[Any, str, tuple[str, ...]], ...] = (
    (torch.isfinite, "holds NaN or infinite values, which no update makes",
     ("population", "best_params", "best_row", "step_sizes", "grads", "reference_diversity",
      "start", "mean", "sigma_path", "metric")),
    (lambda x: ~torch.isnan(x),  # a best of +-inf: nothing found yet; a health of +inf: a
     "is NaN, which no update makes",  # non-finite loss met since the last reproduction
     ("best_loss", "entry_best", "converged_best", "first", "progress", "health")),
    (lambda x: x >= 0, "is negative ({})",
     ("step_sizes", "reference_diversity", "step", "num_evals", "disagreeing_ranks", "stall",
      "grad_nonfinite", "grad_vanishing", "grad_exploding", "restarts", "failed",
      "found_after", "stalled", "explorer_updates", "room")),
)


def _edited(what: str) -> ValueError:
    return ValueError(f"The checkpoint's {what}: the file was edited or written by other code. "
                      "Load an intact checkpoint.")


def _outside(value: Tensor, low: float, high: float, low_open: bool) -> str:
    """The range, e.g. ``(0, 1]``, if a value is outside it or not finite; else ``""``."""
    above = value > low if low_open else value >= low
    return "" if bool((torch.isfinite(value) & above & (value <= high)).all()) else interval(
        low, high, low_open)


def _check(state: Any, like: Any, where: str = "state") -> None:
    """Refuse values no ``init``, ``update`` or ``with_hyperparams`` makes, or a box not ``like``'s.

    The digest catches corruption, not edits (an editor can recompute it): values are read.
    """
    hp = getattr(state, "hyperparams", None)
    ranges = dict(getattr(type(state), "RANGES", {}))
    if hasattr(state, "active_size"):  # the bacteria a population can have in play
        ranges["active_size"] = (1, state.losses.shape[-1], False)
    for holder, at, table in ((state, where, ranges),
                              (hp, f"{where}.hyperparams", getattr(type(hp), "RANGES", {}))):
        for name, bounds in table.items():
            if box := _outside(value := getattr(holder, name), *bounds):
                raise _edited(f"{at}.{name} is {value.tolist()}, outside {box}, a value no "
                              "init, update or with_hyperparams makes")
    for low, high in getattr(type(hp), "ORDERED", ()):
        if not bool(((a := getattr(hp, low)) <= (b := getattr(hp, high))).all()):
            raise _edited(f"{where}.hyperparams.{low} ({a.tolist()}) is above its {high} "
                          f"({b.tolist()}), which no init or with_hyperparams makes")
    for test, problem, names in VALUE_RULES:
        for name in names:
            for x in optree.tree_leaves(cast(Any, getattr(state, name, None))):
                if not bool(test(x).all()):
                    raise _edited(f"{where}.{name} {problem.format(x.tolist())}")
    if hasattr(like, "box") and not all(map(torch.equal, state.box, like.box)):
        raise ValueError(f"The checkpoint's {where}.box differs from like's: it was written by "
                         "an optimizer with other bounds, which a resumed run would keep. Pass "
                         "like from an optimizer with the bounds of the run you resume.")
    for name in HELD_STATES:
        if hasattr(state, name):
            _check(getattr(state, name), getattr(like, name), f"{where}.{name}")


def direction(state: Any, where: str = "state") -> float | None:
    """1.0 if ``state``'s values say it minimizes, -1.0 maximizes, None if they do not say.

    The best is +inf (-inf when maximizing) before any loss, and then the least (greatest)
    loss ever evaluated: no finite loss lies beyond it, nor the best of a swarm it holds (a
    black-box search's: their losses are restarted swarms', not to be read).
    """
    best = getattr(state, "best_loss", None)
    if best is not None and best.dim() != 0:  # a batch of runs: each says, and all agree
        said = {d for i in range(best.shape[0]) if (d := direction(
            optree.tree_map(lambda x, i=i: x[i], state), f"{where}[{i}]")) is not None}
        if len(said) > 1:
            raise _edited(f"{where}'s runs minimize and maximize, as no batch of one "
                          "optimizer's runs does")
        return said.pop() if said else None
    if best is None or bool(torch.isnan(best)):
        return None
    held = [getattr(state, n).best_loss.to(best.dtype) for n in ("swarm", "explorer")
            if hasattr(state, n)]
    losses = getattr(state, "losses", best.new_empty(0))  # a walker: its best alone
    others = torch.stack(held) if held else losses[torch.isfinite(losses)]
    lower = bool((others < best).any() | (best == -math.inf))
    higher = bool((others > best).any() | (best == math.inf))
    if lower and higher:
        raise _edited(f"{where}.best_loss ({float(best)}) is neither the least nor the "
                      "greatest of the losses it was kept from, as every update keeps it")
    return -1.0 if lower else 1.0 if higher else None
