"""Elimination–dispersal: each bacterium is moved to a random place with probability P_ed.

Inside a finite box the new place is uniform in the box (Passino 2002); on coordinates with
no finite box it is the anchor (the initial params, or the best params so far) plus
``init_scale`` times a standard normal. The same sampler builds the initial population.
"""

from __future__ import annotations

import optree
import torch
from torch import Tensor

from ._base import Params
from ._bounds import LeafBounds, sample_domain


def sample_population(
    z: Params,
    anchor: Params,
    bounds: list[LeafBounds | None],
    scale: Tensor,
    dtype: torch.dtype,
) -> Params:
    """New positions from a population pytree of standard normals ``z``.

    They spread over the search domain around ``anchor`` (unbatched, like params).
    """
    leaves, spec = optree.tree_flatten(anchor)
    out = [
        sample_domain(a.to(dtype), zi, b, scale.to(dtype)).to(a.dtype)
        for a, zi, b in zip(leaves, spec.flatten_up_to(z), bounds)
    ]
    return optree.tree_unflatten(spec, out)


def dispersal_mask(coins: Tensor, elimination_prob: Tensor, disperse: Tensor) -> Tensor:
    """Which bacteria are dispersed this step, shape (P,).

    Each whose uniform ``coin`` falls below ``elimination_prob``, and only when ``disperse``
    (a 0-d bool from the step counter) holds.
    """
    return disperse & (coins < elimination_prob)
