"""State utilities: checkpoints and hyperparameter changes.

Checkpoints load with ``torch.load(weights_only=True)``; hyperparameter changes keep dtype and
device, so a compiled update does not recompile.
"""

from __future__ import annotations

import os
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
    hp = state.hyperparams
    unknown = sorted(set(values) - set(hp._fields))
    if unknown:
        raise ValueError(f"Unknown hyperparameters {unknown}; this state has {list(hp._fields)}.")
    cast = {k: torch.as_tensor(v).to(dtype=getattr(hp, k).dtype, device=getattr(hp, k).device)
            for k, v in values.items()}
    return state._replace(hyperparams=hp._replace(**cast))


def save(state: Any, f: PathOrFile) -> None:
    """Write ``state`` to ``f`` as plain tensors, loadable with ``torch.load(weights_only=True)``.

    The pytree structure is not stored (a custom NamedTuple is not on torch's allow-list);
    :func:`load` rebuilds it from a template state.
    """
    paths, leaves, _ = optree.tree_flatten_with_path(state)
    torch.save({"format": FORMAT, "type": type(state).__name__,
                "paths": [path_str(p) for p in paths], "leaves": leaves}, f)


def load(f: PathOrFile, like: State, map_location: Any = None) -> State:
    """Read a state written by :func:`save`, with the structure of ``like``.

    ``like`` is any state of the same optimizer and params structure, e.g. a fresh
    ``opt.init(params, key=...)``. A run resumed from the loaded state continues bitwise
    identically to one that never stopped.

    Raises:
        ValueError: the file is not a saved state, or does not match ``like``.
    """
    data = torch.load(f, map_location=map_location, weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"Not a functional_bfo state checkpoint (expected format {FORMAT}); "
                         "write one with functional_bfo.save(state, path).")
    paths, leaves, spec = optree.tree_flatten_with_path(like)
    if data["type"] != type(like).__name__ or data["paths"] != [path_str(p) for p in paths]:
        raise ValueError(f"Checkpoint holds a {data['type']} with leaves {data['paths']}, but "
                         f"like is a {type(like).__name__} with leaves "
                         f"{[path_str(p) for p in paths]}; pass a state of the same optimizer "
                         "and params structure.")
    for path, saved, ref in zip(paths, data["leaves"], leaves):
        if saved.shape != ref.shape or saved.dtype != ref.dtype:
            raise ValueError(f"Checkpoint leaf {path_str(path)} is {saved.dtype} "
                             f"{tuple(saved.shape)} but like has {ref.dtype} {tuple(ref.shape)}; "
                             "the optimizer (population size) or params differ.")
    return spec.unflatten(data["leaves"])
