"""Eager validation on shapes, dtypes and Python values (no host sync); errors name the fix."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import optree
import torch
from torch import Tensor

LOSS_SHAPE_MSG = (
    "loss_fn must return one floating scalar (a 0-d tensor) per set of parameters; "
    "got {what}. Reduce it, e.g. with .mean() or .sum()."
)
INTEGER_LOSS_MSG = " Integer and boolean losses cannot rank candidates finely; cast to float."
LOSS_TYPE_MSG = (
    "loss_fn must return one floating scalar (a 0-d tensor) per set of parameters; "
    "got {what}. Compute it with tensor ops: a Python number can be neither batched nor compiled."
)


def as_number(value: Any) -> Any:
    """One number as users write it (numpy scalar, 0-d array or tensor) as a Python number."""
    if isinstance(value, (np.generic, np.ndarray, Tensor)) and value.ndim == 0 and (
            value.dtype.kind in "iuf" if not isinstance(value, Tensor) else
            not value.is_complex() and value.dtype != torch.bool):
        return value.item()
    return value


def interval(low: float, high: float, low_open: bool = False) -> str:
    """``[low, high]`` as messages write it: ``(`` where ``low_open``, ``)`` at infinity."""
    return f"{'(' if low_open else '['}{low}, {high}{')' if math.isinf(high) else ']'}"


def _invalid(name: str, shown: Any, expected: str, number: Any = None) -> ValueError:
    """``Invalid name: shown; expected ...``, saying so where ``number`` is not even a number."""
    numeric = number is None or isinstance(number, (int, float)) and not isinstance(number, bool)
    kind = "" if numeric else f" (a {type(number).__name__}, not a number)"
    return ValueError(f"Invalid {name}: {shown!r}{kind}; expected {expected}.")


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` (an int, numpy int or integer 0-d tensor) as an int >= ``minimum``."""
    number = as_number(value)
    if isinstance(number, bool) or not isinstance(number, int) or number < minimum:
        raise _invalid(name, value, f"an int >= {minimum}", number)
    return number


def check_float(name: str, value: Any, low: float, high: float = math.inf,
                low_open: bool = False) -> float:
    """``value`` as a finite float in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    number = as_number(value)
    if isinstance(number, (int, float)) and not isinstance(number, bool):
        number = float(number)
        if math.isfinite(number) and (number > low if low_open else number >= low) and (
                number <= high):
            return number
    shown = number if isinstance(value, (int, float)) else value  # -1 as -1.0
    raise _invalid(name, shown, f"a finite float in {interval(low, high, low_open)}", number)


def check_ordered(values: Any, pairs: tuple[tuple[str, str], ...]) -> None:
    """A ValueError where a pair's first value (of ``values``, by name) lies above its second."""
    for low, high in pairs:
        a, b = (torch.as_tensor(values[k]) for k in (low, high))
        if not bool((a <= b).all()):
            raise ValueError(f"Invalid {low}: {a.tolist()} is above {high}={b.tolist()}; "
                             f"expected {low} <= {high} (a floor cannot lie above its ceiling).")


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a ValueError listing them."""
    if value not in choices:
        raise _invalid(name, value, f"one of {', '.join(choices)}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool, else a ValueError naming it."""
    if not isinstance(value, bool):
        raise _invalid(name, value, "True or False")
    return value


def path_str(path: tuple, root: str = "params") -> str:
    """``('b', 1)`` as ``params['b'][1]``, the way users would index the leaf."""
    return root + "".join(f"[{p!r}]" for p in path)


def check_params(params: Any) -> tuple[list[Tensor], optree.PyTreeSpec]:
    """The leaves and treespec of ``params``: non-empty, floating, finite, on one device."""
    paths, leaves, _ = optree.tree_flatten_with_path(params, none_is_leaf=True)
    if not leaves:
        raise ValueError("params is an empty pytree; BFO needs at least one floating tensor "
                         "leaf, e.g. {'w': torch.zeros(3)}.")
    for path, leaf in zip(paths, leaves):
        if not isinstance(leaf, Tensor):
            fix = ("drop the entry, or pass a tensor (torch.zeros(0) for an empty one)" if leaf
                   is None else "convert it with torch.as_tensor(value, dtype=torch.float32)")
            raise TypeError(f"Expected a tensor leaf, got {leaf!r} at {path_str(path)}; {fix}.")
        if not leaf.dtype.is_floating_point:
            raise TypeError(f"Expected a floating tensor leaf, got dtype {leaf.dtype} at "
                            f"{path_str(path)}; BFO moves parameters continuously, so cast it "
                            "with .float() or keep it out of params (pass it through *args).")
    paths, leaves, spec = optree.tree_flatten_with_path(params)
    if len({leaf.device for leaf in leaves}) > 1:
        where = ", ".join(f"{path_str(p)} on {x.device}" for p, x in zip(paths, leaves))
        raise ValueError(f"params leaves are on different devices ({where}); move them to one "
                         "device, e.g. optree.tree_map(lambda x: x.to('cuda'), params).")
    for path, leaf in zip(paths, leaves):  # read once, at init (meta tensors hold no values)
        if leaf.device.type != "meta" and not bool(torch.isfinite(leaf).all()):
            raise ValueError(f"{path_str(path)} holds NaN or infinite values; BFO starts its "
                             "search there, so start from finite params.")
    return leaves, spec


def check_losses(losses: Any, population_size: int) -> Tensor:
    """``losses`` if it holds one floating scalar per bacterium, else a ValueError/TypeError."""
    if not isinstance(losses, Tensor):
        raise TypeError(LOSS_TYPE_MSG.format(what=f"{type(losses).__name__} {losses!r}"))
    if losses.dim() == 0 or losses.shape[0] != population_size:  # an evaluator's own count
        raise ValueError(f"The evaluator returned losses of shape {tuple(losses.shape)} for "
                         f"{population_size} candidates; expected one per candidate. A loss "
                         "called on the whole population reduces every axis but the first.")
    if tuple(losses.shape) != (population_size,):
        per = tuple(losses.shape[1:])
        raise ValueError(LOSS_SHAPE_MSG.format(what=f"shape {per} per bacterium "
                                               f"({tuple(losses.shape)} for the population)"))
    if not losses.dtype.is_floating_point:
        raise TypeError(LOSS_SHAPE_MSG.format(what=f"dtype {losses.dtype}") + INTEGER_LOSS_MSG)
    return losses


def check_loss(loss: Any) -> Tensor:
    """``loss`` if it is one floating scalar (a 0-d tensor), else a TypeError/ValueError."""
    if not isinstance(loss, Tensor):
        raise TypeError(LOSS_TYPE_MSG.format(what=f"{type(loss).__name__} {loss!r:.60}"))
    if loss.dim() != 0:
        raise ValueError(LOSS_SHAPE_MSG.format(what=f"shape {tuple(loss.shape)}"))
    if not loss.dtype.is_floating_point:
        raise TypeError(LOSS_SHAPE_MSG.format(what=f"dtype {loss.dtype}") + INTEGER_LOSS_MSG)
    return loss


def compute_dtype(leaves: list[Tensor]) -> torch.dtype:
    """float64 if any leaf is float64, else float32: losses and step math never go below float32."""
    return torch.float64 if any(x.dtype == torch.float64 for x in leaves) else torch.float32


def check_state(state: Any, size: int, kind: type[Any], variant: str) -> None:
    """Static check that ``state`` was made by ``variant`` (state class ``kind``) of this size."""
    if not hasattr(state, "population") or not hasattr(state, "losses"):
        raise TypeError(f"Expected the state returned by init/update, got {type(state).__name__}.")
    if not isinstance(state, kind):
        raise TypeError(f"{variant}'s update got a {type(state).__name__}, the state of another "
                        f"optimizer; pass the {kind.__name__} that {variant}'s init made.")
    if state.losses.dim() != 1:
        raise ValueError(f"state is batched (losses of shape {tuple(state.losses.shape)}); map "
                         "update over the batch with torch.func.vmap(opt.update, "
                         "in_dims=(0, None)).")
    if tuple(state.losses.shape[-1:]) != (size,):
        raise ValueError(f"state has a population of {tuple(state.losses.shape)} bacteria but "
                         f"this optimizer has population_size={size}; use the optimizer that "
                         "made the state.")
