"""Ask/tell: one update as a round of all ``(N_s + 1) P`` candidates, evaluated by the caller.

Both halves recompute the plan from the state, which neither changes (docs/design.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import optree
import torch
from torch import Tensor

from ._base import LossFn, Optimizer, Params
from ._checks import check_state
from ._chemotaxis import Plan, SwimResult, rank_costs
from ._layout import strided, unravel

# The integer type whose bits a float of each width is read as, for a state's digest.
BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}
MASK_WEIGHT = 1_000_003  # a prime, so that a changed mask moves the digest


class Ask(NamedTuple):
    """The candidates of one update, from ``opt.ask(state)``; answer with ``opt.tell``.

    ``params`` stacks ``(swim_length + 1) * population_size`` candidates point-major: row
    ``k * P + i`` is bacterium ``i``'s point ``k`` on its swim ray. ``mask`` marks those whose
    loss the update reads (bacteria out of play, with ``min_population_size``, have none);
    the losses of the other rows may be anything and are ignored. ``tag`` names the state
    and round asked, so that ``tell`` can refuse an answer to another one.

    Examples:
        >>> import numpy as np, torch, functional_bfo as fb
        >>> opt = fb.bfo(population_size=8, swim_length=3)
        >>> state = opt.init({"x": torch.ones(3)}, key=fb.random.key(0))
        >>> for _ in range(20):
        ...     asked = opt.ask(state)                  # 32 candidates: 4 points of 8 rays
        ...     x = asked.params["x"].numpy()           # evaluated outside torch
        ...     state = opt.tell(state, asked, np.square(x).sum(axis=1))
        >>> tuple(asked.params["x"].shape), int(state.num_evals), bool(state.best_loss < 3)
        ((32, 3), 640, True)
    """

    params: Params  # each leaf (R, *leaf.shape), R = (swim_length + 1) * population_size
    mask: Tensor  # (R,) bool
    tag: Tensor  # (5,) int64: the state's step, num_evals, key and a digest of its losses


def round_tag(state: Any) -> Tensor:
    """The tag of ``state``'s round: counters, key, digest of losses, hyperparams, grad mask."""
    losses = state.losses
    values = torch.cat([losses, torch.stack(tuple(state.hyperparams))])  # one dtype
    bits = values.view(BITS[losses.element_size()]).to(torch.int64)
    digest = (bits * torch.arange(1, values.shape[-1] + 1, device=losses.device)).sum()
    mask = getattr(state, "grad_mask", None)
    if mask is not None:
        place = torch.arange(1, mask.shape[-1] + 1, device=mask.device)
        digest = digest + MASK_WEIGHT * (mask.to(torch.int64) * place).sum()
    return torch.stack([state.step, state.num_evals, state.key[0], state.key[1], digest])


def swim_optimizer(name: str, state_type: type, size: int, sign: float, init: Any,
                   plan: Callable[..., Plan], finish: Callable[[Any, Plan, SwimResult], Any],
                   evaluation: Callable[..., Callable], swim_batch: int,
                   told_aux: Callable[..., Any] | None = None,
                   takes: tuple[str, str] | None = None) -> Optimizer:
    """Every variant's ``update``, ``ask`` and ``tell``, from the variant's own steps.

    ``plan(state, **given)`` is the update before any loss, ``finish(state, plan, result)`` the
    state after its swim, ``evaluation(state, plan, loss_fn, args)`` scores update's rows
    (``rows -> (costs, aux)``) and ``told_aux(state, asked, **given)`` reads what tell is given
    besides losses as the round's aux. ``given`` is the keyword that update and tell take
    beyond the contract, as ``takes`` names them (``hybrid_bfo``'s ``grad=`` and ``grads=``).
    """
    update_takes, tell_takes = takes or (None, None)

    def update(state: Any, loss_fn: LossFn, *args: Any, **given: Any) -> Any:
        check_state(state, size, state_type, name)
        if not callable(loss_fn):
            raise TypeError(f"Invalid loss_fn: {loss_fn!r}; expected a callable "
                            "loss_fn(params, *args) -> 0-d tensor (call update(state, loss_fn)).")
        refuse_keywords(given, update_takes, f"{name}.update")
        steps = plan(state, **given)
        return finish(state, steps, steps.swim(evaluation(state, steps, loss_fn, args), swim_batch))

    def ask(state: Any) -> Ask:
        check_state(state, size, state_type, name)
        steps = plan(state)
        return Ask(unravel(steps.shape, steps.ray.points(steps.ray.distances)), steps.needed(),
                   round_tag(state))

    def tell(state: Any, asked: Ask, losses: Any, *, check: bool = True, **given: Any) -> Any:
        check_state(state, size, state_type, name)
        refuse_keywords(given, tell_takes, f"{name}.tell")
        costs = told_costs(state, asked, losses, sign, name, check)
        aux = None if told_aux is None else told_aux(state, asked, **given)
        steps = plan(state)
        return finish(state, steps, steps.told(costs, aux))

    return Optimizer(init, update, sign < 0, ask, tell)


def refuse_keywords(given: dict[str, Any], takes: str | None, where: str) -> None:
    """A TypeError, as Python's own, for a keyword ``where`` does not take."""
    if unexpected := sorted(given.keys() - {takes}):
        raise TypeError(f"{where}() got an unexpected keyword argument {unexpected[0]!r}")


def told_costs(state: Any, asked: Any, losses: Any, sign: float, variant: str,
               check: bool = True) -> Tensor:
    """``losses`` answering ``asked`` as costs; ``check`` reads the tags and warns on the host."""
    if not isinstance(asked, Ask):
        raise TypeError(f"{variant}.tell takes the Ask that {variant}.ask(state) returned, "
                        f"got {type(asked).__name__}.")
    rows = asked.mask.shape[-1]
    check_tag(round_tag(state), asked.tag, variant, check)
    if isinstance(losses, Tensor):
        values = losses.detach()
    else:
        try:
            given = np.asarray(losses)
        except (TypeError, ValueError):  # ragged
            given = np.asarray(None)
        if given.dtype.kind not in "fiub":  # None, strings, Python objects
            raise TypeError(f"Invalid losses: {type(losses).__name__} of {given.dtype}; "
                            f"expected a tensor, a numpy array or a list of {rows} numbers, "
                            "one per row of asked.params (NaN, not None, for a loss that "
                            "failed).")
        values = torch.as_tensor(given)
    if values.dtype == torch.bool or values.is_complex():
        raise TypeError(f"Invalid losses: dtype {values.dtype}; expected real numbers.")
    if tuple(values.shape) != (rows,):
        raise ValueError(f"Invalid losses: shape {tuple(values.shape)}; expected ({rows},), one "
                         "per row of asked.params (rows outside asked.mask are ignored: pass "
                         "anything there, e.g. NaN).")
    values = values.to(device=state.losses.device, dtype=state.losses.dtype)
    if check and not bool((torch.isfinite(values) & asked.mask).any()):  # host read: checking
        warnings.warn(f"functional_bfo: every loss told to {variant}.tell this round is NaN or "
                      "infinite (or the round asked for none), so the search has nothing to "
                      "follow; check the losses you compute, the params and the bounds.",
                      RuntimeWarning, stacklevel=3)
    return rank_costs(values, sign)


def told_grads(asked: Ask, grads: Any, variant: str) -> Params:
    """``grads`` (like ``asked.params``) in the candidates' dtypes and devices."""
    if grads is None:
        raise ValueError(f"{variant}.tell needs grads=, the gradient of the loss at each row of "
                         "asked.params (a pytree like it; NaN where unknown): the hybrid's tumbles "
                         "follow them. For a search without gradients use adaptive_bfo.")
    leaves, spec = optree.tree_flatten(asked.params)
    try:
        given = spec.flatten_up_to(grads)
    except (ValueError, TypeError) as e:
        raise ValueError(f"grads does not match the structure of asked.params: {e}") from None
    out = []
    for leaf, x in zip(given, leaves):
        g = strided(leaf.detach()) if isinstance(leaf, Tensor) else torch.as_tensor(
            np.asarray(leaf))
        if tuple(g.shape) != tuple(x.shape):
            raise ValueError(f"Invalid grads: a leaf of shape {tuple(g.shape)} where "
                             f"asked.params has {tuple(x.shape)}.")
        out.append(g.to(device=x.device, dtype=x.dtype))
    return spec.unflatten(out)


def check_tag(expected: Tensor, tag: Tensor, variant: str, check: bool) -> None:
    """Refuse a tag other than ``expected`` (values read only if ``check``)."""
    if tuple(tag.shape) != tuple(expected.shape):
        raise ValueError(f"asked.tag has shape {tuple(tag.shape)}, not {tuple(expected.shape)}: "
                         f"pass the Ask that {variant}.ask(state) returned for this state.")
    if not check or bool((tag == expected).all()):
        return
    if not bool(tag[0] == expected[0]):
        raise ValueError(f"asked answers the round of update {int(tag[0])}, but the state has made "
                         f"{int(expected[0])} updates: call ask on the state you tell, once per "
                         "update (state = tell(state, ask(state), losses)).")
    raise ValueError("asked comes from another state (another run, key, history or "
                     "hyperparameters than the one told: a hyperparameter or gradient mask "
                     "changed between ask and tell?): tell takes the state that ask was called "
                     "on; change hyperparameters before ask or after tell.")
