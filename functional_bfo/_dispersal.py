"""Elimination–dispersal: each bacterium is moved to a random place with probability P_ed.

Inside a finite box the new place is uniform in the box (Passino 2002); on coordinates with
no finite box it is the anchor (the initial params, or the best params so far) plus
``init_scale`` times a standard normal. The same sampler builds the initial population.
"""

from __future__ import annotations

import optree
import torch
from torch import Tensor

from . import random
from ._base import Params
from ._bounds import LeafBounds, sample_domain


def sample_population(
    keys: Tensor,
    anchor: Params,
    bounds: list[LeafBounds | None],
    scale: Tensor,
    dtype: torch.dtype,
) -> Params:
    """One new position per key (keys (N, 2)), spread over the search domain around ``anchor``."""
    z = torch.func.vmap(lambda k: random.tree_normal_like(k, anchor, dtype=dtype))(keys)
    leaves, spec = optree.tree_flatten(anchor)
    out = [
        sample_domain(a.to(dtype), zi, b, scale.to(dtype)).to(a.dtype)
        for a, zi, b in zip(leaves, spec.flatten_up_to(z), bounds)
    ]
    return optree.tree_unflatten(spec, out)


def dispersal_mask(keys: Tensor, elimination_prob: Tensor, disperse: Tensor) -> Tensor:
    """Which bacteria are dispersed this step, shape (P,).

    Each with probability ``elimination_prob``, and only when ``disperse`` (a 0-d bool from
    the step counter) holds.
    """
    coins = torch.func.vmap(lambda k: random.uniform(k, (), elimination_prob.dtype))(keys)
    return disperse & (coins < elimination_prob)
