"""BFO, AdaptiveBFO and HybridBFO as ``torch.optim`` optimizers; see ``docs/adapters.md``."""

from ._candidates import evaluating_candidates
from .optimizers import BFO, AdaptiveBFO, HybridBFO, SwarmOptimizer

__all__ = ["AdaptiveBFO", "BFO", "HybridBFO", "SwarmOptimizer", "evaluating_candidates"]
