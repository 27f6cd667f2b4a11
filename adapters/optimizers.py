"""BFO, AdaptiveBFO and HybridBFO in ``torch.optim.Optimizer`` form, for ordinary loops.

Thin shells over :func:`functional_bfo.bfo`, :func:`functional_bfo.adaptive_bfo` and
:func:`functional_bfo.hybrid_bfo`: every hyperparameter keeps the core's name and default,
plus the seed API's aliases (``elim_prob``, and ``lr`` so ``torch.optim.lr_scheduler`` works).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import functional_bfo as fb

from ._base import SwarmOptimizer


class BFO(SwarmOptimizer):
    """Canonical BFO (Passino 2002) in torch.optim form, over :func:`functional_bfo.bfo`.

    Hyperparameters and defaults are ``fb.bfo``'s (population_size=50, step_size=0.1, ...).
    Aliases: ``elim_prob`` = ``elimination_prob``; ``lr`` = ``step_size``. The shared
    arguments (seed, compile, budgets, ...) are :class:`SwarmOptimizer`'s.
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
    step_size_max]``, and dispersal that grows with stagnation. Aliases: ``elim_prob`` =
    ``elimination_prob``; ``lr`` = ``step_size_max`` (an LR schedule caps the step). The
    shared arguments are :class:`SwarmOptimizer`'s.
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
