"""The black box: a recipe over adaptive_bfo's swarms (restarts, a walker, face moves, a polish).

``search`` holds the search, its state and its rules; ``walker`` the CMA-ES-like walk a
swarm in a valley goes on as; ``moves`` the explorer's kicks and the polish's face moves.
"""

from .search import BlackBoxResult, BlackBoxState, black_box, black_box_search

__all__ = ["BlackBoxResult", "BlackBoxState", "black_box", "black_box_search"]
