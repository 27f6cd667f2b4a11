"""The stateful world: BFO, AdaptiveBFO and HybridBFO as ``torch.optim`` optimizers.

Thin shells over the pure core (``functional_bfo.bfo`` and friends) for ordinary training
loops; see ``docs/adapters.md``.
"""

from ._base import SwarmOptimizer as SwarmOptimizer
from ._candidates import closure_over as closure_over
from ._candidates import evaluating_candidates as evaluating_candidates
from .optimizers import BFO as BFO
from .optimizers import AdaptiveBFO as AdaptiveBFO
from .optimizers import HybridBFO as HybridBFO

__all__ = ["AdaptiveBFO", "BFO", "HybridBFO", "SwarmOptimizer", "closure_over",
           "evaluating_candidates"]
