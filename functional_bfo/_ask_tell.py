"""The scaffold: a variant's plan, evaluation and finish as update, ask and tell.

Ask/tell is one update as a round of all ``(N_s + 1) P`` candidates, evaluated by the caller;
both halves recompute the plan from the state, which neither changes (docs/design.md).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import optree
import torch
from torch import Tensor

from ._base import Key, LossFn, Optimizer, Params
from ._bounds import BOUNDARY_MODES, check_bounds, is_closed
from ._checks import check_bool, check_choice, check_float, check_int, check_losses, check_state
from ._chemotaxis import TUMBLES, Ray, SwimCarry, SwimResult, after
from ._layout import Layout, unravel
from .evaluate import check_evaluator

# The integer type whose bits a float of each width is read as, for a state's digest.
BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}
MIX = -7046029254386353131  # 0x9E3779B97F4A7C15 as an int64: spreads each position's weight


class Plan(NamedTuple):
    """One update before any loss: the ray, the swim's start, and what the variant keeps.

    ``active`` (P,) marks the bacteria in play (None: all); the rest are padding scored +inf,
    and keep their losses (``held``, sign-adjusted) and health.
    """

    ray: Ray
    carry: SwimCarry
    active: Tensor | None
    health: Tensor  # (P,) before the swim's costs are added to it
    keep: Any  # the variant's own
    layout: Layout  # the params' structure: rows <-> params
    evaluations: Any  # () int64 tensor or int: what the round adds to num_evals
    given: Any = None  # what the caller gave update beyond the contract (the hybrid's grad)
    held: Any = None  # (P,) with active: the sign-adjusted losses kept out of play

    def padded(self, costs: Tensor) -> Tensor:
        """``costs`` of stacked points, the padding rows at +inf (their aux is never read)."""
        if self.active is None:
            return costs
        return torch.where(self.active, costs.reshape(-1, self.active.shape[0]),
                           torch.inf).reshape(-1)

    def swim(self, evaluate: Callable[[Params], tuple[Tensor, Any, Tensor | None]],
             per_call: int) -> tuple[SwimResult, Tensor | None]:
        """``update``'s swim, ``per_call`` points per ``evaluate``, and the ranks that disagreed."""
        ray, carry = self.ray, self.carry
        raw: Tensor | None = None
        aux: Any = None
        disagreed: Tensor | None = None
        for first in range(0, ray.distances.shape[0], per_call):
            along = ray.distances[first:first + per_call]  # (G, P)
            if ray.built is None and raw is not None:  # after the previous points' outcome
                along = after(along, raw, *optree.tree_leaves(aux))
            candidates = ray.points(along, first)
            raw, aux, differing = evaluate(candidates)
            if differing is not None:
                disagreed = differing if disagreed is None else disagreed | differing
            raw = self.padded(raw)
            carry = ray.take(carry, candidates, raw, aux)
        return ray.finish(carry), disagreed

    def told(self, costs: Tensor, aux: Any) -> SwimResult:
        """``tell``'s swim: every point's cost (and aux) at once, candidates rebuilt."""
        ray = self.ray
        candidates = ray.points(ray.distances) if ray.swarm_cost is not None else None
        return ray.finish(ray.take(self.carry, candidates, self.padded(costs), aux))


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
    tag: Tensor  # (6,) int64: the state's step, num_evals, key, its digest, the settings'


def round_tag(state: Any, settings: int, events: Tensor | bool = False) -> Tensor:
    """``state``'s counters, key, digest of every leaf (an edit moves it) and ``settings``.

    ``events`` (a cycle ends in this round, where the twin's candidates differ) flips the last.
    """
    device = state.key.device
    return torch.stack([state.step, state.num_evals, state.key[0], state.key[1],
                        state_digest(state), torch.tensor(settings, device=device)
                        ^ torch.as_tensor(events, device=device).to(torch.int64)])


def state_digest(state: Any) -> Tensor:
    """A 0-d int64 sum of every leaf's bits weighted by position (wrapping): any edit moves it."""
    words = []
    for x in optree.tree_leaves(state):
        flat = x.reshape(-1)
        words.append(flat.view(BITS[x.element_size()]).to(torch.int64)
                     if x.is_floating_point() else flat.to(torch.int64))
    bits = torch.cat(words)
    # Odd weights: a flipped bit k moves the sum by weight * 2**k, never 0 (an even weight
    # would drop a sign bit's flip). `| 1`, not 2i + 1: inductor folds 2 * MIX, past int64.
    return (bits * ((torch.arange(1, bits.shape[-1] + 1, device=bits.device) * MIX) | 1)).sum(-1)


def settings_digest(settings: Any) -> int:
    """An int64 digest of an optimizer's structural settings, the same in every process."""
    leaves, spec = optree.tree_flatten(settings, none_is_leaf=True)
    h = hashlib.sha256(str(spec).encode())
    for leaf in leaves:
        if isinstance(leaf, (Tensor, np.ndarray)):
            # A copy with unit strides: a one-element view keeps its stride through
            # contiguous() (numpy's bound columns), and view(uint8) refuses it.
            data = torch.as_tensor(leaf).detach().cpu().clone(memory_format=torch.contiguous_format)
            h.update(f"\0{data.dtype}{tuple(data.shape)}".encode())
            h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(f"\0{leaf!r}".encode())
    return int.from_bytes(h.digest()[:8], "little", signed=True)


class Variant(NamedTuple):
    """A variant as the scaffold takes it: its State and steps, each taking settings first.

    ``settings`` (a NamedTuple) has at least ``size``, ``sign``, ``swim_batch`` and
    ``chemotaxis_steps``; ``plan``'s ``cycles`` is False where no cycle ends (:func:`at_step`).
    The scaffold writes the fields every state has; ``finish`` the variant's own.
    """

    name: str
    state_type: type
    init: Callable[..., Any]  # init(settings, params, *, key) -> state
    plan: Callable[..., Plan]  # plan(settings, state, cycles, **given): the update before losses
    evaluation: Callable[..., Callable]  # (settings, state, plan, loss_fn, args) -> rows scorer
    finish: Callable[..., dict] | None = None  # (settings, state, plan, result) -> its own fields
    told_aux: Callable[..., Any] | None = None  # (settings, state, asked, **given): tell's aux
    update_takes: str | None = None  # the keyword update takes beyond the contract
    tell_takes: str | None = None  # and tell (hybrid_bfo's grad= and grads=)


def swim_settings(a: dict[str, Any], ranges: dict[str, tuple]) -> dict[str, Any]:
    """The settings bfo and adaptive_bfo check alike, from their arguments ``a`` by name."""
    size = check_int("population_size", a["population_size"], 1)
    swims = check_int("swim_length", a["swim_length"], 0)
    batch = check_int("swim_batch", a["swim_batch"], 1)
    n_c = check_int("chemotaxis_steps", a["chemotaxis_steps"], 1)
    hyper = {name: check_float(name, a[name], *limits) for name, limits in ranges.items()}
    check_choice("tumble", a["tumble"], TUMBLES)
    check_choice("boundary", a["boundary"], BOUNDARY_MODES)
    check_bool("maximize", a["maximize"])
    bounds = check_bounds(a["bounds"])
    return dict(size=size, swims=swims, chemotaxis_steps=n_c, bounds=bounds, tumble=a["tumble"],
                boundary=a["boundary"], sign=-1.0 if a["maximize"] else 1.0, swim_batch=batch,
                closed=is_closed(bounds), evaluator=check_evaluator(a["evaluator"]), hyper=hyper)


# Settings that leave a round's candidates as they are: an Ask is told across them.
NOT_OF_THE_ROUND = ("swim_batch", "evaluator", "chunk_size", "hyper")


def of_the_round(settings: Any) -> dict[str, Any]:
    """``settings`` without ``NOT_OF_THE_ROUND``, in nested NamedTuples too (the hybrid's)."""
    return {k: of_the_round(v) if isinstance(v, tuple) and hasattr(v, "_asdict") else v
            for k, v in settings._asdict().items() if k not in NOT_OF_THE_ROUND}


def swim_optimizer(variant: Variant, settings: Any) -> Optimizer:
    """The variant's ``init``, ``update``, ``ask`` and ``tell``, and its twin for at_step."""
    fixed = settings_digest((variant.name, of_the_round(settings)))
    opt = _build(variant, settings, fixed, True)
    return opt._replace(twin=_build(variant, settings, fixed, False),
                        period=settings.chemotaxis_steps)


def cycle_ends(step: Tensor, period: int) -> Tensor:
    """Whether a cycle ends at ``step`` (0-d bool): every update runs the events masked by it."""
    return (step > 0) & (step % period == 0)


def at_step(opt: Optimizer, step: int) -> Optimizer:
    """``opt``, or its twin without the cycle events where no cycle ends at ``step``.

    For drivers that know the step on the host: bitwise the same update, fewer ops
    (docs/design.md). Optimizers without a twin: ``opt``.
    """
    if opt.twin is None or step > 0 and step % opt.period == 0:
        return opt
    return opt.twin


def _build(variant: Variant, settings: Any, fixed: int, cycles: bool) -> Optimizer:
    """``update``, ``ask`` and ``tell`` over one plan, with or without the cycle events."""
    name, size, sign = variant.name, settings.size, settings.sign

    def tag(state: Any) -> Tensor:  # the twin's rounds run no events: where a cycle ends,
        ends = cycles and cycle_ends(state.step, settings.chemotaxis_steps)  # not the same
        return round_tag(state, fixed, ends)

    def update(state: Any, loss_fn: LossFn, *args: Any, **given: Any) -> Any:
        check_state(state, size, variant.state_type, name)
        if not callable(loss_fn):
            raise TypeError(f"Invalid loss_fn: {loss_fn!r}; expected a callable "
                            "loss_fn(params, *args) -> 0-d tensor (call update(state, loss_fn)).")
        refuse_keywords(given, variant.update_takes, f"{name}.update")
        steps = variant.plan(settings, state, cycles, **given)
        result, disagreed = steps.swim(variant.evaluation(settings, state, steps, loss_fn, args),
                                       settings.swim_batch)
        return finished(state, steps, result, disagreed)

    def ask(state: Any) -> Ask:
        check_state(state, size, variant.state_type, name)
        steps = variant.plan(settings, state, cycles)
        distances = steps.ray.distances  # the mask below: the rows whose loss the update reads
        mask = torch.ones(distances.numel(), dtype=torch.bool, device=distances.device) if (
            steps.active is None) else steps.active.repeat(distances.shape[0])
        return Ask(unravel(steps.layout, steps.ray.points(distances)), mask, tag(state))

    def tell(state: Any, asked: Ask, losses: Any, *, check: bool = True, **given: Any) -> Any:
        check_state(state, size, variant.state_type, name)
        refuse_keywords(given, variant.tell_takes, f"{name}.tell")
        check_ask(asked, name)
        steps = variant.plan(settings, state, cycles)
        if asked.mask.shape[-1] != (rows := steps.ray.distances.numel()):  # static
            raise ValueError(f"asked has {asked.mask.shape[-1]} rows, but this state's round has "
                             f"{rows}: it was asked of another optimizer (another "
                             "population_size or swim_length). Tell the Ask that "
                             f"{name}.ask(state) returned for this state.")
        if check:
            check_tag(tag(state), asked.tag, name)
        costs = told_costs(state, asked, losses, sign, name, check)
        aux = None if variant.told_aux is None else variant.told_aux(settings, state, asked,
                                                                     **given)
        return finished(state, steps, steps.told(costs, aux))

    def finished(state: Any, plan: Plan, result: SwimResult,
                 disagreed: Tensor | None = None) -> Any:
        raw, cost = result.raw_cost, result.cost
        if plan.active is not None:
            raw, cost = torch.where(plan.active, raw, plan.held), torch.where(plan.active, cost, 0)
        ranks = state.disagreeing_ranks if disagreed is None else (  # None: a local evaluator
            state.disagreeing_ranks | disagreed)
        return variant.state_type(
            **({} if variant.finish is None else variant.finish(settings, state, plan, result)),
            population=result.population, losses=sign * raw, health=plan.health + cost,
            best_params=unravel(plan.layout, result.best_params),
            best_loss=sign * result.best_cost, key=state.key, step=state.step + 1,
            num_evals=state.num_evals + plan.evaluations, box=state.box,
            disagreeing_ranks=ranks, hyperparams=state.hyperparams)

    return Optimizer(taking_key(partial(variant.init, settings), name), update, sign < 0, ask,
                     tell)


def taking_key(init: Callable[..., Any], variant: str) -> Any:
    """``init(params, *, key)``, saying how to pass the key where it is given positionally."""

    def init_fn(params: Params, *given: Any, key: Key | None = None) -> Any:
        if given or key is None:
            raise TypeError(f"{variant}.init takes params and the key by keyword: "
                            f"{variant}.init(params, key=fb.random.key(0)); got "
                            f"{1 + len(given)} positional argument(s)"
                            f"{'' if key is not None else ' and no key='}.")
        return init(params, key=key)

    return init_fn


def refuse_keywords(given: dict[str, Any], takes: str | None, where: str) -> None:
    """A TypeError, as Python's own, for a keyword ``where`` does not take."""
    if unexpected := sorted(given.keys() - {takes}):
        raise TypeError(f"{where}() got an unexpected keyword argument {unexpected[0]!r}")


def check_ask(asked: Any, variant: str) -> None:
    """A TypeError unless ``asked`` is an Ask."""
    if not isinstance(asked, Ask):
        raise TypeError(f"{variant}.tell takes the Ask that {variant}.ask(state) returned, "
                        f"got {type(asked).__name__}.")


def told_costs(state: Any, asked: Ask, losses: Any, sign: float, variant: str,
               check: bool = True) -> Tensor:
    """``losses`` answering ``asked`` as costs; ``check`` warns on the host when none is finite."""
    rows = asked.mask.shape[-1]
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


def check_tag(expected: Tensor, tag: Tensor, variant: str) -> None:
    """Refuse a tag other than ``expected``, naming what differs (reads both on the host)."""
    if tuple(tag.shape) != tuple(expected.shape):
        raise ValueError(f"asked.tag has shape {tuple(tag.shape)}, not {tuple(expected.shape)}: "
                         f"pass the Ask that {variant}.ask(state) returned for this state.")
    tag = tag.to(expected.device)
    try:
        if bool((tag == expected).all()):
            return
    except RuntimeError as e:  # vmap's data-dependent control flow: the only caller that can't
        raise RuntimeError(f"{variant}.tell(check=True) reads asked.tag on the host, which "
                           "torch.func.vmap cannot do: pass check=False under vmap (and "
                           "under torch.compile).") from e
    if not bool(tag[0] == expected[0]):
        raise ValueError(f"asked answers the round of update {int(tag[0])}, but the state has made "
                         f"{int(expected[0])} updates: call ask on the state you tell, once per "
                         "update (state = tell(state, ask(state), losses)).")
    if not bool(tag[-1] == expected[-1]):
        raise ValueError(f"asked comes from another optimizer: one with other settings (bounds, "
                         f"boundary, tumble, swim_length, ...) than the {variant} told. Tell "
                         "an Ask to the optimizer that asked it.")
    raise ValueError("asked comes from another state (another run, start, key, history or "
                     "hyperparameters than the one told, or a state edited between ask and "
                     "tell: a hyperparameter or gradient mask changed?): tell takes the state "
                     "that ask was called on; change hyperparameters before ask or after tell.")


def costs_evaluation(settings: Any, state: Any, plan: Plan, loss_fn, args: tuple) -> Callable:
    """``evaluate(rows) -> (costs, None, ranks)`` by ``settings.evaluator`` (ranks None: local)."""
    evaluator, sign = settings.evaluator, settings.sign
    dtype, shape = state.losses.dtype, plan.layout
    report = getattr(evaluator, "with_disagreement", None)  # fb.distributed's: ranks too
    by_rows = getattr(evaluator, "takes_rows", False)  # rows batched as one tensor
    loss = partial(loss_of_row, loss_fn, shape) if by_rows else loss_fn

    def evaluate(candidates: Tensor) -> tuple[Tensor, None, Tensor | None]:
        with torch.no_grad():
            population = candidates if by_rows else unravel(shape, candidates)
            losses, differing = (evaluator(loss, population, *args), None) if (
                report is None) else report(loss, population, *args)
            losses = check_losses(losses, candidates.shape[0]).to(dtype)
        return rank_costs(losses, sign), None, differing

    return evaluate


def loss_of_row(loss_fn: Callable[..., Tensor], shape: Layout, row: Tensor, *args: Any) -> Tensor:
    """``loss_fn`` of the params that ``row`` holds."""
    return loss_fn(unravel(shape, row), *args)


def rank_costs(losses: Tensor, sign: float) -> Tensor:
    """Losses as costs to minimize; non-finite ones +inf (one ``nan_to_num``: fewer eager ops)."""
    costs = losses if sign == 1 else -losses
    return costs.nan_to_num(nan=torch.inf, posinf=torch.inf, neginf=torch.inf)
