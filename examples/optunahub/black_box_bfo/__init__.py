"""OptunaHub's package face: ``optunahub.load_module("samplers/black_box_bfo").BlackBoxSampler``."""

from functional_bfo.adapters.optuna import BlackBoxSampler

__all__ = ["BlackBoxSampler"]
