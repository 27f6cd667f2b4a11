"""BFO, AdaptiveBFO and HybridBFO in ``torch.optim.Optimizer`` form, for ordinary loops.

Thin shells over :func:`functional_bfo.bfo`, :func:`functional_bfo.adaptive_bfo` and
:func:`functional_bfo.hybrid_bfo`. Each declares its settings with the core's names and
defaults, but for torch's ``lr``, the largest step, so every ``torch.optim.lr_scheduler`` and
framework schedule drives it; ``lr = 0`` (a schedule's end, a warmup's start) pauses the
group. The shared arguments (seed, compile, module, evaluator, budgets) are
:class:`SwarmOptimizer`'s.
"""

from __future__ import annotations

from typing import Any, ClassVar

import functional_bfo as fb

from ._base import SwarmOptimizer


class BFO(SwarmOptimizer):
    """Canonical BFO (Passino 2002) in torch.optim form, over :func:`functional_bfo.bfo`.

    ``lr`` is the core's ``step_size``, the one step length of every bacterium.

    Examples:
        >>> import torch
        >>> from functional_bfo.adapters import BFO
        >>> w = torch.nn.Parameter(torch.zeros(3))
        >>> opt = BFO([w], population_size=8, lr=0.2, seed=0)
        >>> loss = opt.step(lambda: float((w - 1).square().sum()))
        >>> loss < 3.0 and opt.num_evals == 8 * 5 + 2
        True
    """

    factory = staticmethod(fb.bfo)
    State, Hyperparams, LR = fb.BFOState, fb.BFOHyperparams, "step_size"
    DEFAULTS: ClassVar[dict[str, Any]] = dict(
        lr=0.1, population_size=50, swim_length=4, swim_batch=1, chemotaxis_steps=100,
        reproduction_steps=4, elimination_prob=0.25, swarming=False, d_attract=0.1,
        w_attract=0.2, h_repel=0.1, w_repel=10.0, tumble="gaussian", levy_beta=1.5,
        bounds=None, boundary="reflect", init_scale=1.0, maximize=False, chunk_size=None)


class AdaptiveBFO(SwarmOptimizer):
    """Adaptive BFO in torch.optim form, over :func:`functional_bfo.adaptive_bfo`.

    Per-bacterium step sizes by the 1/5th success rule, and dispersal that grows with
    stagnation. ``lr`` is the core's ``step_size_max``, the ceiling of every step size: it
    wins over ``step_size`` (the initial step) and ``step_size_min``, so ``lr=1e-3`` caps
    every step at 1e-3 and a schedule lowers them all.
    """

    factory = staticmethod(fb.adaptive_bfo)
    State, Hyperparams, LR = fb.AdaptiveBFOState, fb.AdaptiveBFOHyperparams, "step_size_max"
    DEFAULTS: ClassVar[dict[str, Any]] = dict(
        lr=1.0, population_size=32, step_size=0.1, step_size_min=1e-7, adaptation_rate=0.3,
        swim_length=4, swim_batch=1, chemotaxis_steps=10, elimination_prob=0.02,
        elimination_prob_max=0.25, stagnation_steps=20, min_population_size=None,
        tumble="gaussian", levy_beta=1.5, bounds=None, boundary="reflect",
        relative_steps=False, init_scale=1.0, maximize=False, chunk_size=None)


class HybridBFO(SwarmOptimizer):
    """Hybrid BFO in torch.optim form, over :func:`functional_bfo.hybrid_bfo`.

    Parameters with ``requires_grad=True`` (read at every step, so it may change) bend the
    tumble toward their negative gradient, read from ``.grad`` after the closure's
    ``backward`` (cleared before each candidate) or computed by ``torch.func`` on the fast
    path; the others move by pure BFO. A closure without ``backward`` is fine: that
    candidate's gradient is unknown and it tumbles purely. ``lr`` is ``step_size_max``, as
    in :class:`AdaptiveBFO`.
    """

    factory = staticmethod(fb.hybrid_bfo)
    State, Hyperparams, LR = fb.HybridBFOState, fb.HybridBFOHyperparams, "step_size_max"
    DEFAULTS: ClassVar[dict[str, Any]] = dict(
        AdaptiveBFO.DEFAULTS, gradient_weight=0.5, momentum=0.0, vanishing_threshold=1e-8,
        exploding_threshold=1e3)
    uses_grads = True
