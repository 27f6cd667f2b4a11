"""Hybrid BFO: adaptive BFO whose tumbles bend toward the negative gradient."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import optree
import torch
from torch import Tensor

from ._adaptive import (
    AdaptiveBFOHyperparams,
    AdaptiveSettings,
    adaptive_fields,
    adaptive_init,
    adaptive_plan,
    swarm_settings,
)
from ._ask_tell import Ask, Plan, Variant, loss_of_row, rank_costs, swim_optimizer
from ._base import Key, LossFn, Optimizer, Params
from ._bounds import LeafBounds
from ._checks import check_float, check_int, check_loss, check_losses
from ._chemotaxis import SwimResult
from ._layout import Layout, layout, ravel, strided, unravel
from ._population import per_run
from .evaluate import batched, check_evaluator


class HybridBFOHyperparams(NamedTuple):
    """AdaptiveBFO's hyperparameters plus the gradient mix, as 0-d tensors."""

    step_size: Tensor
    step_size_min: Tensor
    step_size_max: Tensor
    adaptation_rate: Tensor
    elimination_prob: Tensor
    elimination_prob_max: Tensor
    init_scale: Tensor
    levy_beta: Tensor
    gradient_weight: Tensor  # w: 0 = pure BFO tumble, 1 = pure negative-gradient direction
    momentum: Tensor  # beta of the gradient's exponential average (0 = none)

    RANGES = {  # type: ignore[misc]  # a class constant; mypy's NamedTuple has no ClassVar
              **AdaptiveBFOHyperparams.RANGES,
              "gradient_weight": (0.0, 1.0, False), "momentum": (0.0, 0.999, False)}
    ORDERED = AdaptiveBFOHyperparams.ORDERED  # type: ignore[misc]  # a class constant


class HybridBFOState(NamedTuple):
    """State of :func:`hybrid_bfo`: AdaptiveBFOState's fields plus gradients and telemetry."""

    population: Tensor  # (P, D), as in AdaptiveBFOState
    losses: Tensor
    health: Tensor
    best_params: Params
    best_loss: Tensor
    key: Key
    step: Tensor
    num_evals: Tensor
    box: LeafBounds
    disagreeing_ranks: Tensor
    step_sizes: Tensor
    stall: Tensor
    reference_diversity: Tensor
    active_size: Tensor
    grads: Tensor  # (P, D): (averaged) gradient at each position, zeros if unknown
    grad_known: Tensor  # (P,) bool: a finite gradient is known at the position
    grad_mask: Tensor  # (D,) bool: the coordinates of the leaves that take gradients (dynamic)
    grad_norms: Tensor  # (P,) norm of the masked gradient at each position (NaN if unknown)
    grad_nonfinite: Tensor  # () int64, non-finite gradient entries met in the last update
    grad_vanishing: Tensor  # () int64, positions whose gradient norm < vanishing threshold
    grad_exploding: Tensor  # () int64, positions whose gradient norm > exploding threshold
    hyperparams: HybridBFOHyperparams


def hybrid_bfo(
    population_size: int = 32,
    *,
    gradient_weight: float = 0.5,
    momentum: float = 0.0,
    grad_mask: Any = None,
    vanishing_threshold: float = 1e-8,
    exploding_threshold: float = 1e3,
    chunk_size: int | None = None,
    evaluator: Callable[..., tuple[Tensor, Params]] | None = None,
    **adaptive_kwargs: Any,
) -> Optimizer:
    r"""Hybrid BFO: the tumble mixes the normalized negative gradient with a random direction.

    For bacterium :math:`i` with random unit tumble :math:`\phi`, split into its part on
    gradient leaves :math:`\phi_g` and the rest :math:`\phi_r`, and gradient :math:`g` on the
    gradient leaves (averaged with ``momentum`` when set):

    .. math::

        d_g = (1 - w)\,\phi_g - w\,\lVert\phi_g\rVert \frac{g}{\lVert g\rVert},\qquad
        \phi \leftarrow \phi_r + \lVert\phi_g\rVert \frac{d_g}{\lVert d_g\rVert}

    so the direction stays a unit vector, gradient-free leaves move by pure BFO, ``w = 0``
    is AdaptiveBFO and ``w = 1`` follows the negative gradient with BFO's step control
    (adaptive step sizes, greedy swim). A bacterium with no finite gradient tumbles purely.

    Args:
        population_size: number of bacteria.
        gradient_weight: ``w`` above, in [0, 1].
        momentum: exponential average of each bacterium's gradient along its path, in
            [0, 0.999]; 0 uses the gradient where it stands.
        grad_mask: which leaves take gradients: None derives it from each leaf's
            ``requires_grad`` at ``init`` (at least one must require grad: detached
            params, such as :func:`functional_bfo.module_loss`'s, need a mask); a bool for
            all leaves; or a pytree like params of bools. It lives in the state, so it may
            change between updates (:func:`functional_bfo.with_grad_mask`).
        vanishing_threshold: gradient norms below this count as vanishing in telemetry.
        exploding_threshold: gradient norms above this count as exploding in telemetry.
        chunk_size: evaluate at most this many bacteria at once.
        evaluator: None evaluates losses and gradients with ``torch.func.grad_and_value`` under
            ``vmap``; else ``evaluator(loss_fn, population, *args) -> (losses, grads)`` with one
            loss per row of ``population`` and ``grads`` like it (NaN where a gradient is unknown),
            for losses that cannot be vmapped (the ``torch.optim`` adapter calls a closure per
            bacterium). ``loss_fn`` there is already restricted to the marked leaves.
        **adaptive_kwargs: every other argument of :func:`functional_bfo.adaptive_bfo`
            (step sizes, swim_length, bounds, maximize, ...), except its ``evaluator``.

    Returns:
        An :class:`~functional_bfo.Optimizer`; its ``update(state, loss_fn, *args,
        grad=None)`` takes an optional gradient pytree (like params) computed by the caller,
        e.g. at the best params with an ordinary ``backward()``: then every bacterium uses
        it and no per-bacterium gradient is computed.

    Raises:
        ValueError: a hyperparameter is invalid; at ``init``, ``grad_mask=None`` and no leaf that
            requires grad; at ``update``, a loss whose output carries no gradient from the params.

    Examples:
        >>> import torch, functional_bfo as fb
        >>> opt = fb.hybrid_bfo(population_size=8, gradient_weight=0.9, grad_mask=True)
        >>> state = opt.init({"x": torch.ones(3)}, key=fb.random.key(0))
        >>> state = fb.run(opt, state, lambda p: p["x"].square().sum(), max_steps=50)
        >>> bool(state.best_loss < 1e-3)  # adaptive_bfo at the same budget: 2.6e-3
        True
    """
    if evaluator is not None:
        check_evaluator(evaluator, "evaluator(loss_fn, population, *args) -> (losses, grads)")
    if evaluator is not None and chunk_size is not None:
        raise ValueError("Pass chunk_size or evaluator, not both: chunk_size only applies to "
                         "the default vmap evaluation.")
    mix = dict(gradient_weight=check_float("gradient_weight", gradient_weight, 0.0, 1.0),
               momentum=check_float("momentum", momentum, 0.0, 0.999))
    check_float("vanishing_threshold", vanishing_threshold, 0.0)
    check_float("exploding_threshold", exploding_threshold, 0.0, low_open=True)
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, 1)
    if grad_mask is not None and not all(isinstance(m, bool)
                                         for m in optree.tree_leaves(grad_mask)):
        raise ValueError(f"Invalid grad_mask: {grad_mask!r}; expected None, a bool, or a pytree "
                         "like params of bools.")
    if "metric_rate" in adaptive_kwargs:
        raise TypeError("hybrid_bfo got metric_rate=: its tumbles follow the gradients, not a "
                        "learned metric. For a learned metric use fb.adaptive_bfo.")
    base = swarm_settings(population_size, **adaptive_kwargs)  # validates the rest
    gradient = GradientSettings(mix, (vanishing_threshold, exploding_threshold), grad_mask,
                                chunk_size)
    return swim_optimizer(HYBRID, base._replace(evaluator=evaluator, gradient=gradient))


class GradientSettings(NamedTuple):
    """What :func:`hybrid_bfo` adds to the adaptive settings."""

    mix: dict[str, float]  # gradient_weight and momentum's initial values
    limits: tuple[float, float]  # vanishing and exploding thresholds of the gradient norm
    grad_mask: Any  # as given: None (requires_grad), a bool, or a pytree of bools
    chunk_size: int | None  # the default evaluation's


def hybrid_init(static: AdaptiveSettings, params: Params, *, key: Key) -> HybridBFOState:
    """The adaptive start, no gradient known yet, the mask from ``grad_mask``."""
    state = adaptive_init(static, params, key=key)
    size, device, dtype = static.size, state.losses.device, state.losses.dtype
    zero = torch.zeros((), dtype=torch.int64, device=device)
    hp = HybridBFOHyperparams(**state.hyperparams._asdict(), **{
        k: torch.tensor(v, dtype=dtype, device=device) for k, v in static.gradient.mix.items()})
    return per_run(HybridBFOState(
        **{k: v for k, v in state._asdict().items() if k not in ("hyperparams", "metric")},
        grads=torch.zeros_like(state.population),
        grad_known=torch.zeros(size, dtype=torch.bool, device=device),
        grad_mask=_mask_row(params, static.gradient.grad_mask),
        grad_norms=torch.full((size,), torch.nan, dtype=dtype, device=device),
        grad_nonfinite=zero, grad_vanishing=zero, grad_exploding=zero,  # per_run copies them
        hyperparams=hp,
    ))


def hybrid_plan(static: AdaptiveSettings, state: HybridBFOState, cycles: bool,
                grad: Params | None = None) -> Plan:
    """The adaptive plan, its tumbles bent toward each bacterium's gradient (or ``grad``)."""
    hp, given = state.hyperparams, None
    if grad is not None:  # the caller's, at the best params: every bacterium follows it
        given = ravel(layout(state.best_params), optree.tree_map(lambda g: strided(g.detach()),
                                                                 grad))

    def steer(direction: Tensor, source: Tensor, known: Tensor) -> Tensor:
        if given is not None:
            g, usable = given.expand_as(direction), torch.ones_like(known)
        else:
            g = state.grads.index_select(0, source)
            usable = state.grad_known.index_select(0, source) & known
        return _mix(direction, g, usable, state.grad_mask, hp.gradient_weight, static.sign)

    def start_aux(source: Tensor, known: Tensor):  # NaN where unknown: one that stays
        if given is not None:  # keeps its gradient unknown (telemetry, steering)
            return None
        usable = state.grad_known.index_select(0, source) & known
        return torch.where(usable[:, None], state.grads.index_select(0, source), torch.nan)

    return adaptive_plan(static, state, cycles, steer, start_aux)._replace(given=given)


def hybrid_finish(static: AdaptiveSettings, state: HybridBFOState, plan: Plan,
                  result: SwimResult) -> dict:
    """The adaptive fields, each bacterium's gradient where it ends (averaged), telemetry."""
    hp, mask, source = state.hyperparams, state.grad_mask, plan.keep.source
    if plan.given is not None:  # the caller's gradient: the state's are kept
        seen, grads, finite = plan.given.expand_as(state.grads), state.grads, state.grad_known
    else:  # gradients at the final positions (sign: of the loss as given)
        seen, new = result.aux, torch.nan_to_num(result.aux, 0.0, 0.0, 0.0)
        finite = torch.isfinite(result.aux).all(dim=1)
        averaged = hp.momentum * state.grads.index_select(0, source) + (1 - hp.momentum) * new
        known = state.grad_known.index_select(0, source) & plan.keep.known
        grads = torch.where(known[:, None], averaged, new)
    masked = torch.where(mask, seen.to(state.losses.dtype), 0.0)  # telemetry, no host sync
    norms = torch.linalg.vector_norm(masked, dim=1)
    vanishing, exploding = static.gradient.limits
    met = ~torch.isfinite(masked) & result.moved[:, None]  # one that stayed met no gradient
    return dict(**adaptive_fields(static, state, plan, result), grads=grads, grad_known=finite,
                grad_mask=mask, grad_norms=norms, grad_nonfinite=met.sum(),
                grad_vanishing=(norms < vanishing).sum(), grad_exploding=(norms > exploding).sum())


def told_aux(static: AdaptiveSettings, state: HybridBFOState, asked: Ask, *,
             grads: Params | None = None) -> Tensor:
    """``tell``'s gradient rows, in the candidates' dtypes: only the marked leaves count."""
    if grads is None:
        raise ValueError("hybrid_bfo.tell needs grads=, the gradient of the loss at each row of "
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
    rows = ravel(layout(state.best_params), spec.unflatten(out))
    return torch.where(state.grad_mask, rows, 0.0)


def hybrid_evaluation(static: AdaptiveSettings, state: HybridBFOState, plan: Plan,
                      loss_fn: LossFn, args: tuple
                      ) -> Callable[[Tensor], tuple[Tensor, Tensor | None, Tensor | None]]:
    """Costs of candidate rows, their gradient rows (None where ``grad=`` serves), the ranks."""
    mask, shape, given = state.grad_mask, plan.layout, plan.given is not None
    evaluator, chunk_size, sign = static.evaluator, static.gradient.chunk_size, static.sign
    report = getattr(evaluator, "with_disagreement", None)  # fb.distributed's: ranks too

    def evaluate(rows: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        differing = None
        if evaluator is not None:
            by_rows = getattr(evaluator, "takes_rows", False)
            if given:
                differentiable = partial(loss_of_row, loss_fn, shape) if by_rows else loss_fn
            else:
                differentiable = _differentiable(loss_fn, mask, shape, by_rows, True)
            population = rows if by_rows else unravel(shape, rows)
            out, differing = (evaluator(differentiable, population, *args), None) if (
                report is None) else report(differentiable, population, *args)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError("hybrid_bfo's evaluator must return (losses, grads); got "
                                f"{type(out).__name__}. The evaluators of "
                                "functional_bfo.evaluate return losses only.")
            losses, grads = out
            grads = None if given else grads if by_rows else ravel(shape, grads)
        elif given:  # the caller's gradient serves everyone: losses only
            with torch.no_grad():
                losses = batched(partial(loss_of_row, loss_fn, shape), rows, args, chunk_size)
            grads = None
        else:  # by the rows: the gradient comes out as rows too
            grads, losses = batched(torch.func.grad_and_value(_differentiable(
                loss_fn, mask, shape)), rows, args, chunk_size)
        # Detached: a loss that touches tensors outside params which require grad (a model's
        # other weights) must not leave their autograd graph in the state.
        losses = check_losses(losses, rows.shape[0]).detach().to(state.losses.dtype)
        return rank_costs(losses, sign), None if grads is None else grads.detach(), differing

    return evaluate


def with_grad_mask(state: HybridBFOState, grad_mask: Any) -> HybridBFOState:
    """A copy of ``state`` whose gradient mask is ``grad_mask`` (a bool or a pytree of bools).

    The mask is a tensor in the state, so a compiled ``update`` does not recompile.
    """
    if not hasattr(state, "grad_mask"):
        raise TypeError(f"Expected a hybrid_bfo state, got {type(state).__name__}.")
    return state._replace(grad_mask=_mask_row(state.best_params, grad_mask))


def _mask_row(params: Params, grad_mask: Any) -> Tensor:
    """The mask as a (D,) bool row (each leaf's ``requires_grad`` if None)."""
    leaves, spec = optree.tree_flatten(params)
    if grad_mask is None:
        flags: list[Any] = [bool(x.requires_grad) for x in leaves]
        if not any(flags):
            raise ValueError(
                "hybrid_bfo(grad_mask=None) takes gradients on the leaves of params that require "
                "grad, and none does (tensors made with .detach() or torch.no_grad() do not), so "
                "it would be adaptive_bfo at the cost of gradients. Set requires_grad on the "
                "leaves that take gradients, or pass grad_mask=True (every leaf) or a pytree like "
                "params of bools (grad_mask=False starts with none, for fb.with_grad_mask to "
                "change later).")
    elif isinstance(grad_mask, bool):
        flags = [grad_mask] * len(leaves)
    else:
        try:
            flags = spec.flatten_up_to(grad_mask)
        except ValueError as e:
            raise ValueError(f"grad_mask does not match the structure of params: {e}") from None
        if not all(isinstance(f, bool) for f in flags):
            raise ValueError(f"Invalid grad_mask: {grad_mask!r}; expected bools at the leaves.")
    sizes, device = [x.numel() for x in leaves], leaves[0].device
    return torch.tensor(flags, device=device).repeat_interleave(
        torch.tensor(sizes, device=device), output_size=sum(sizes))


def _differentiable(loss_fn: LossFn, mask: Tensor, shape: Layout, of_rows: bool = True,
                    by_evaluator: bool = False) -> Callable[..., Tensor]:
    """``loss_fn`` of a row (or of params), differentiated through the ``mask``ed coordinates."""
    masks: list[Any] | None = None if of_rows else shape.spec.flatten_up_to(unravel(shape, mask))

    def loss(x: Any, *args: Any) -> Tensor:
        if masks is None:
            params = unravel(shape, torch.where(mask, x, x.detach()))
        else:
            leaves: list[Any] = shape.spec.flatten_up_to(x)
            params = shape.spec.unflatten([torch.where(m, v, v.detach())
                                           for v, m in zip(leaves, masks)])
        if not check_loss(out := loss_fn(params, *args)).requires_grad:
            raise ValueError(
                "loss_fn is not differentiable with respect to params: its output carries no "
                "gradient from them (.detach(), .item(), integer or boolean ops?). hybrid_bfo "
                "follows the gradient on the leaves marked in grad_mask; for gradient-free "
                "search use adaptive_bfo, or pass update(..., grad=...) computed by other "
                "means." + (" With an evaluator, the evaluator must differentiate loss_fn and "
                            "return (losses, grads): functional_bfo.evaluate's evaluators "
                            "return losses only, and fb.distributed.sharded needs grads=True."
                            if by_evaluator else ""))
        return out

    return loss


def _mix(direction: Tensor, grads: Tensor, usable: Tensor, mask: Tensor, weight: Tensor,
         sign: float) -> Tensor:
    """The tumbles (P, D) bent toward -grad on the ``mask``ed coordinates (see hybrid_bfo).

    ``torch.where``, not a product with the mask, so that NaN cannot leak from elsewhere.
    """
    phi_g = torch.where(mask, direction, 0.0)
    g = torch.where(mask, grads.to(weight.dtype), 0.0)
    g_norm, phi_norm = g.square().sum(1).sqrt(), phi_g.square().sum(1).sqrt()
    usable = usable & torch.isfinite(g_norm) & (g_norm > 0)
    scale = torch.where(usable, phi_norm / g_norm.clamp_min(1e-30), 0.0)
    descent = -sign  # gradients are of the loss as given; maximizing climbs them
    d_g = (1 - weight) * phi_g + weight * descent * scale[:, None] * g
    d_norm = d_g.square().sum(1).sqrt()
    renorm = torch.where(d_norm > 0, phi_norm / d_norm.clamp_min(1e-30), 0.0)
    return torch.where(usable[:, None], direction - phi_g + renorm[:, None] * d_g, direction)


HYBRID = Variant("hybrid_bfo", HybridBFOState, hybrid_init, hybrid_plan, hybrid_evaluation,
                 hybrid_finish, told_aux, "grad", "grads")
