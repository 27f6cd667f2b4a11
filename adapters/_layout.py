"""The adapters' ``state_dict``: torch.optim's layout, and the previous format read into it.

A group's swarm lies with its parameters: fields with one leaf per parameter (population,
best params, the hybrid's gradients and mask) in each parameter's entry, the swarm's shared
fields under ``"swarm"`` in the entry of the group's first parameter.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections.abc import Callable
from typing import Any

from torch import Tensor

from functional_bfo._state import from_dict
from functional_bfo._stopping import Stopping

FORMAT = "functional_bfo.adapters/2"
PREVIOUS = "functional_bfo.adapters/1"
STOPPING = ("best_cost", "stalled", "steps", "per_update", "reason")
REASONS = ("max_fe", "target_loss", "patience")  # a stop_reason the shell's Stopping sets
NOT_OURS = ("Not a functional_bfo adapter state dict (format {formats}); write one with "
            "{name}.state_dict().")


@dataclasses.dataclass
class Saved:
    """A state dict, read and checked: the group settings, and a way to build each swarm."""

    groups: list[dict[str, Any]]
    states: list[Callable[[Any], Any] | None]  # like -> the group's state (None: not stepped)
    seed: int
    best: float | None
    settle_evals: int
    stopping: dict[str, Any]


def pack(state: Any, first: int) -> dict[int, dict[str, Any]]:
    """``state`` as state-dict entries for the parameters ``first, first + 1, ...``."""
    out: dict[int, dict[str, Any]] = {first: {}}
    shared: dict[str, Any] = {}
    for name, value in zip(state._fields, state):
        if isinstance(value, list):  # one leaf per parameter
            for j, leaf in enumerate(value):
                out.setdefault(first + j, {})[name] = leaf.detach()
        elif hasattr(value, "_asdict"):  # the hyperparameters
            shared[name] = {k: v.detach() for k, v in value._asdict().items()}
        else:
            shared[name] = value.detach()
    out[first]["swarm"] = shared
    return out


def unpack(entries: dict[int, Any], indices: list[int], like: Any) -> Any:
    """The state :func:`pack` wrote for parameters ``indices``, checked against ``like``."""
    shared = entries[indices[0]]["swarm"]
    fields = {}
    for name, ref in zip(like._fields, like):
        if isinstance(ref, list):
            fields[name] = [_leaf(_get(entries.get(i), name), r, f"state[{i}][{name!r}]")
                            for i, r in zip(indices, ref)]
        elif hasattr(ref, "_asdict"):
            saved = _get(shared, name)
            fields[name] = type(ref)(**{
                k: _leaf(_get(saved, k), getattr(ref, k),
                         f"state[{indices[0]}]['swarm'][{name!r}][{k!r}]") for k in ref._fields})
        else:
            fields[name] = _leaf(_get(shared, name), ref,
                                 f"state[{indices[0]}]['swarm'][{name!r}]")
    return type(like)(**fields)


def read(state_dict: Any, name: str, sizes: list[int]) -> Saved:
    """Check a state dict of either format against an optimizer of class ``name``."""
    try:
        return _read(state_dict, name, sizes)
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(NOT_OURS.format(formats=f"{FORMAT} or {PREVIOUS}", name=name)
                         + f" ({type(e).__name__}: {e})") from None


def _read(state_dict: Any, name: str, sizes: list[int]) -> Saved:
    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("state"), dict):
        raise ValueError(NOT_OURS.format(formats=FORMAT, name=name))
    entries = state_dict["state"]
    previous = state_dict.get("adapter")
    meta = previous if isinstance(previous, dict) else _get(entries.get(0), "optimizer")
    wanted = PREVIOUS if isinstance(previous, dict) else FORMAT
    if not isinstance(meta, dict) or meta.get("format") != wanted:
        raise ValueError(NOT_OURS.format(formats=FORMAT, name=name))
    if meta["class"] != name:
        raise ValueError(f"This state dict is from {meta['class']}, not {name}; load it into "
                         f"a {meta['class']}.")
    _check_counters(meta, "state[0]['optimizer']" if wanted == FORMAT else "['adapter']")
    groups = state_dict["param_groups"]
    if [len(g["params"]) for g in groups] != sizes:
        raise ValueError(f"The state dict has param groups of "
                         f"{[len(g['params']) for g in groups]} parameters, this optimizer "
                         f"{sizes}; build the optimizer over the same parameters.")
    if wanted == PREVIOUS:  # one to_dict per group index, the counters in "adapter"
        states = [None if entries.get(g) is None else functools.partial(
            _from_previous, entries[g]) for g in range(len(groups))]
        stopping = dict(zip(STOPPING, (meta["best_seen"], meta["stalled"],
                                       meta.get("steps", 0), meta["per_update"],
                                       meta["stop_reason"])))
        return Saved(groups, states, meta["seed"], meta["best"], 0, stopping)
    states = [functools.partial(unpack, entries, g["params"])
              if g["params"] and "swarm" in entries.get(g["params"][0], {}) else None
              for g in groups]
    return Saved(groups, states, meta["seed"], meta["best"], meta["settle_evals"],
                 {k: meta[k] for k in STOPPING})


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _reason(x: Any) -> bool:
    return x is None or (isinstance(x, str) and x in REASONS)


COUNTERS = {  # the optimizer's own entries (both formats' names): what state_dict writes
    "seed": (_count, "an int >= 0"),
    "settle_evals": (_count, "an int >= 0"),
    "stalled": (_count, "an int >= 0"),
    "steps": (_count, "an int >= 0"),
    "best": (lambda x: x is None or _real(x), "a float or None"),
    "best_cost": (_real, "a float"),
    "best_seen": (_real, "a float"),
    "per_update": (lambda x: x is None or (_real(x) and x >= 0), "a number >= 0 or None"),
    "reason": (_reason, f"None or one of {list(REASONS)}"),
    "stop_reason": (_reason, f"None or one of {list(REASONS)}"),
}


def _check_counters(meta: dict[str, Any], where: str) -> None:
    for key, (valid, what) in COUNTERS.items():
        if key in meta and not valid(meta[key]):
            raise ValueError(f"The state dict's {where}[{key!r}] is {meta[key]!r:.60} but "
                             f"should be {what}; it was not written by state_dict() of this "
                             "optimizer.")


def _from_previous(data: dict[str, Any], like: Any) -> Any:
    return from_dict({k: v for k, v in data.items() if k != "updates"}, like)


def stopping_fields(stopping: Stopping) -> dict[str, Any]:
    return {k: getattr(stopping, k) for k in STOPPING}


def set_stopping(stopping: Stopping, fields: dict[str, Any]) -> None:
    for k in STOPPING:
        setattr(stopping, k, fields[k])


def _get(entry: Any, key: str) -> Any:
    return entry.get(key) if isinstance(entry, dict) else None


def _leaf(x: Any, ref: Tensor, where: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"The state dict lacks {where} (a tensor); it was not written by "
                         "state_dict() of this optimizer.")
    if x.shape != ref.shape or x.dtype != ref.dtype:
        raise ValueError(f"{where} is {x.dtype} {tuple(x.shape)} but this optimizer's is "
                         f"{ref.dtype} {tuple(ref.shape)}; the population size or the "
                         "parameters differ.")
    return x.to(ref.device)
