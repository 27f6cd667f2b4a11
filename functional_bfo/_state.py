"""State utilities: checkpoints and hyperparameter changes.

Checkpoints load with ``torch.load(weights_only=True)``; hyperparameter changes keep dtype and
device, so a compiled update does not recompile.
"""

from __future__ import annotations

import math
import os
import pickle
from typing import IO, Any, TypeVar

import optree
import torch

from ._checks import path_str

State = TypeVar("State")
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
    unknown = sorted(set(values) - set(hp._fields))
    if unknown:
        raise ValueError(f"Unknown hyperparameters {unknown}; this state has {list(hp._fields)}.")
    ranges = getattr(type(hp), "RANGES", {})
    cast = {}
    for name, value in values.items():
        old = getattr(hp, name)
        try:
            new = torch.as_tensor(value)
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
        if name in ranges:  # read on the host: call it between updates, not inside one
            low, high, low_open = ranges[name]
            above = new > low if low_open else new >= low
            if not bool((torch.isfinite(new) & above & (new <= high)).all()):
                left, right = "(" if low_open else "[", ")" if math.isinf(high) else "]"
                raise ValueError(f"Invalid {name}: {value!r}; expected finite values in "
                                 f"{left}{low}, {high}{right}.")
        cast[name] = new
    return state._replace(hyperparams=hp._replace(**cast))


def save(state: Any, f: PathOrFile) -> None:
    """Write ``state`` to ``f`` as plain tensors, loadable with ``torch.load(weights_only=True)``.

    The pytree structure is not stored (a custom NamedTuple is not on torch's allow-list);
    :func:`load` rebuilds it from a template state.
    """
    torch.save(to_dict(state), f)


def to_dict(state: Any) -> dict[str, Any]:
    """``state`` as a dict of plain values and tensors (what :func:`save` writes)."""
    paths, leaves, _ = optree.tree_flatten_with_path(state)
    return {"format": FORMAT, "type": type(state).__name__,
            "paths": [_state_path(state, p) for p in paths], "leaves": leaves}


def _state_path(state: Any, path: tuple) -> str:
    """A state leaf's path as ``state.population['b'][0]`` (optree names fields by index)."""
    return f"state.{state._fields[path[0]]}" + path_str(path[1:], root="")


def load(f: PathOrFile, like: State, map_location: Any = None) -> State:
    """Read a state written by :func:`save`, with the structure of ``like``.

    ``like`` is any state of the same optimizer and params structure, e.g. a fresh
    ``opt.init(params, key=...)``. A run resumed from the loaded state continues bitwise
    identically to one that never stopped.

    Raises:
        ValueError: the file is not a saved state, or does not match ``like``.
    """
    try:
        data = torch.load(f, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        raise ValueError(f"Not a functional_bfo state checkpoint ({type(e).__name__}); write "
                         "one with functional_bfo.save(state, path).") from e
    return from_dict(data, like)


def from_dict(data: Any, like: State) -> State:
    """The state that :func:`to_dict` made ``data`` from, checked against ``like``.

    Leaves move to the device of ``like``'s leaves.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"Not a functional_bfo state checkpoint (expected format {FORMAT}); "
                         "write one with functional_bfo.save(state, path).")
    paths, leaves, spec = optree.tree_flatten_with_path(like)
    names = [_state_path(like, p) for p in paths]
    if data["type"] != type(like).__name__ or data["paths"] != names:
        raise ValueError(f"Checkpoint holds a {data['type']} with leaves {data['paths']}, but "
                         f"like is a {type(like).__name__} with leaves {names}; pass a state of "
                         "the same optimizer and params structure.")
    for name, saved, ref in zip(names, data["leaves"], leaves):
        if saved.shape != ref.shape or saved.dtype != ref.dtype:
            raise ValueError(f"Checkpoint leaf {name} is {saved.dtype} "
                             f"{tuple(saved.shape)} but like has {ref.dtype} {tuple(ref.shape)}; "
                             "the optimizer (population size) or params differ.")
    return spec.unflatten([x.to(ref.device) for x, ref in zip(data["leaves"], leaves)])
