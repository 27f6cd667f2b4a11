"""Bacterial Foraging Optimization for PyTorch: pure functions over pytrees.

``opt = bfo(...)`` gives ``opt.init(params, key=...) -> state`` and
``opt.update(state, loss_fn, *args) -> state``; ``run`` drives updates to a budget.
"""

from . import distributed as distributed
from . import evaluate as evaluate
from . import random as random
from ._adaptive import AdaptiveBFOHyperparams as AdaptiveBFOHyperparams
from ._adaptive import AdaptiveBFOState as AdaptiveBFOState
from ._adaptive import adaptive_bfo as adaptive_bfo
from ._ask_tell import Ask as Ask
from ._base import AskFn as AskFn
from ._base import InitFn as InitFn
from ._base import Key as Key
from ._base import LossFn as LossFn
from ._base import Optimizer as Optimizer
from ._base import Params as Params
from ._base import PyTree as PyTree
from ._base import TellFn as TellFn
from ._base import UpdateFn as UpdateFn
from ._bfo import BFOHyperparams as BFOHyperparams
from ._bfo import BFOState as BFOState
from ._bfo import bfo as bfo
from ._black_box import BlackBoxResult as BlackBoxResult
from ._black_box import BlackBoxState as BlackBoxState
from ._black_box import black_box as black_box
from ._black_box import black_box_search as black_box_search
from ._hybrid import HybridBFOHyperparams as HybridBFOHyperparams
from ._hybrid import HybridBFOState as HybridBFOState
from ._hybrid import hybrid_bfo as hybrid_bfo
from ._hybrid import with_grad_mask as with_grad_mask
from ._layout import as_params as as_params
from ._module import module_loss as module_loss
from ._run import run as run
from ._state import load as load
from ._state import save as save
from ._state import with_hyperparams as with_hyperparams
from ._state import with_start_loss as with_start_loss
from .telemetry import materialize as materialize
from .telemetry import metrics as metrics

__version__ = "0.1.0"

__all__ = [
    "AdaptiveBFOHyperparams",
    "AdaptiveBFOState",
    "Ask",
    "AskFn",
    "BFOHyperparams",
    "BFOState",
    "BlackBoxResult",
    "BlackBoxState",
    "HybridBFOHyperparams",
    "HybridBFOState",
    "InitFn",
    "Key",
    "LossFn",
    "Optimizer",
    "Params",
    "PyTree",
    "TellFn",
    "UpdateFn",
    "adaptive_bfo",
    "as_params",
    "bfo",
    "black_box",
    "black_box_search",
    "distributed",
    "evaluate",
    "hybrid_bfo",
    "load",
    "materialize",
    "metrics",
    "module_loss",
    "random",
    "run",
    "save",
    "with_grad_mask",
    "with_hyperparams",
    "with_start_loss",
]
