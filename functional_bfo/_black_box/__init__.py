"""The black box: ``search`` over adaptive_bfo's swarms, a ``walker`` in valleys, ``moves``."""

from .search import BlackBoxResult, BlackBoxState, black_box, black_box_search

__all__ = ["BlackBoxResult", "BlackBoxState", "black_box", "black_box_search"]
