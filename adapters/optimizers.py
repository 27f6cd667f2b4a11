"""BFO, AdaptiveBFO and HybridBFO in ``torch.optim.Optimizer`` form, for ordinary loops.

Thin shells over :func:`functional_bfo.bfo`, :func:`functional_bfo.adaptive_bfo` and
:func:`functional_bfo.hybrid_bfo`: every hyperparameter keeps the core's name and default,
plus two aliases that are the same setting (writing one writes both): ``elim_prob`` for
``elimination_prob``, and torch's ``lr`` for the largest step, so every
``torch.optim.lr_scheduler`` and framework schedule drives it. Any ``lr >= 0`` works;
``lr = 0`` (a schedule's end, a warmup's start) pauses the group with one warning.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import functional_bfo as fb

from ._base import SwarmOptimizer


class BFO(SwarmOptimizer):
    """Canonical BFO (Passino 2002) in torch.optim form, over :func:`functional_bfo.bfo`.

    Hyperparameters and defaults are ``fb.bfo``'s (population_size=50, step_size=0.1, ...).
    ``lr`` is ``step_size``, the one step length of every bacterium; ``elim_prob`` is
    ``elimination_prob``. The shared arguments (seed, compile, module, budgets, ...) are
    :class:`SwarmOptimizer`'s.
    """

    factory = staticmethod(fb.bfo)
    core_hyperparams = fb.BFOHyperparams
    aliases = {"elim_prob": "elimination_prob", "lr": "step_size"}

    def __init__(self, params: Iterable[Any], population_size: int = 50,
                 **kwargs: Any) -> None:
        super().__init__(params, population_size=population_size, **kwargs)


class AdaptiveBFO(SwarmOptimizer):
    """Adaptive BFO in torch.optim form, over :func:`functional_bfo.adaptive_bfo`.

    Per-bacterium step sizes by the 1/5th success rule within ``[step_size_min,
    step_size_max]``, and dispersal that grows with stagnation. ``lr`` is ``step_size_max``,
    the ceiling of every step size: it wins over ``step_size`` (the initial and
    post-dispersal step) and ``step_size_min``, so ``lr=1e-3`` caps every step at 1e-3 and
    a schedule lowers them all. ``elim_prob`` is ``elimination_prob``. The shared arguments
    are :class:`SwarmOptimizer`'s.
    """

    factory = staticmethod(fb.adaptive_bfo)
    core_hyperparams = fb.AdaptiveBFOHyperparams
    aliases = {"elim_prob": "elimination_prob", "lr": "step_size_max"}

    def __init__(self, params: Iterable[Any], population_size: int = 32, *,
                 adaptation_rate: float = 0.3, **kwargs: Any) -> None:
        super().__init__(params, population_size=population_size,
                         adaptation_rate=adaptation_rate, **kwargs)


class HybridBFO(SwarmOptimizer):
    """Hybrid BFO in torch.optim form, over :func:`functional_bfo.hybrid_bfo`.

    Parameters with ``requires_grad=True`` (read at every step, so it may change) steer the
    tumble toward their negative gradient, read from ``.grad`` after the closure's
    ``backward`` (cleared before each candidate) or computed by ``torch.func`` on the fast
    path; the others move by pure BFO. A closure without ``backward`` is fine: that
    candidate's gradient is unknown and it tumbles purely. Aliases: ``elim_prob`` =
    ``elimination_prob``; ``lr`` = ``step_size_max``. The shared arguments are
    :class:`SwarmOptimizer`'s.
    """

    factory = staticmethod(fb.hybrid_bfo)
    core_hyperparams = fb.HybridBFOHyperparams
    aliases = {"elim_prob": "elimination_prob", "lr": "step_size_max"}
    uses_grads = True

    def __init__(self, params: Iterable[Any], population_size: int = 32, *,
                 gradient_weight: float = 0.5, adaptation_rate: float = 0.3,
                 **kwargs: Any) -> None:
        super().__init__(params, population_size=population_size,
                         gradient_weight=gradient_weight, adaptation_rate=adaptation_rate,
                         **kwargs)
