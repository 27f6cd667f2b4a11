"""Bacterial Foraging Optimization for PyTorch: pure functions over pytrees.

``opt = bfo(...)`` gives ``opt.init(params, key=...) -> state`` and
``opt.update(state, loss_fn, *args) -> state``; ``run`` drives updates to a budget.
"""

from . import distributed, evaluate, random
from ._adaptive import AdaptiveBFOHyperparams, AdaptiveBFOState, adaptive_bfo
from ._ask_tell import Ask
from ._base import AskFn, InitFn, Key, LossFn, Optimizer, Params, PyTree, TellFn, UpdateFn
from ._bfo import BFOHyperparams, BFOState, bfo
from ._black_box import BlackBoxResult, BlackBoxState, black_box, black_box_search
from ._hybrid import HybridBFOHyperparams, HybridBFOState, hybrid_bfo, with_grad_mask
from ._layout import as_params, module_loss
from ._run import run
from ._state import load, save, with_hyperparams, with_start_loss
from .telemetry import materialize, metrics

__version__ = "0.1.0"

__all__ = [
    "AdaptiveBFOHyperparams", "AdaptiveBFOState", "Ask", "AskFn", "BFOHyperparams", "BFOState",
    "BlackBoxResult", "BlackBoxState", "HybridBFOHyperparams", "HybridBFOState", "InitFn", "Key",
    "LossFn", "Optimizer", "Params", "PyTree", "TellFn", "UpdateFn", "adaptive_bfo", "as_params",
    "bfo", "black_box", "black_box_search", "distributed", "evaluate", "hybrid_bfo", "load",
    "materialize", "metrics", "module_loss", "random", "run", "save", "with_grad_mask",
    "with_hyperparams", "with_start_loss",
]
