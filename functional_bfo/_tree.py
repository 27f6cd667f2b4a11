"""Helpers over a population's rows: a choice per bacterium, the spread, the first best.

The core picks rows with ``index_select``, never ``x[index]``: indexing is not traced as a
tensor op when the index is 0-d, which would make ``torch.compile`` read it on the host.
"""

from __future__ import annotations

import optree
import torch
from torch import Tensor

from ._base import PyTree


def where(mask: Tensor, a: PyTree, b: PyTree) -> PyTree:
    """Per bacterium: the rows of ``a``'s leaves where ``mask`` (shape (P,)) holds, else ``b``'s."""
    return optree.tree_map(lambda x, y: torch.where(
        mask if x.dim() == 1 else mask.reshape(mask.shape + (1,) * (x.dim() - 1)), x, y), a, b)


def diversity(population: Tensor, dtype: torch.dtype) -> Tensor:
    """Root-mean-square distance of the bacteria (rows) to their centroid.

    The centroid is a product with a row of ones, not ``mean(dim=0)``: compiled for a GPU,
    inductor fused that column mean into the reproduction's gather and ran it unsplit, a
    quarter of an adaptive update's GPU time at P = 65,536; a product reads the population
    once it is gathered.
    """
    x = population.to(dtype)
    return torch.sqrt((x - x.new_ones(x.shape[0]) @ x / x.shape[0]).square().sum(dim=1).mean())


def first_min(costs: Tensor) -> tuple[Tensor, Tensor]:
    """The least of ``costs`` (P,) and the first index that holds it, shape (1,) each.

    Two plain reductions, not ``argmin``: compiled for a GPU, inductor spreads a plain
    reduction over the chip but runs an argmin in one thread block (at P = 65,536 that was
    40% of a compiled ``bfo`` update on an H100). The value is the element at that index,
    so of tied 0.0 and -0.0 it is the first, as ``min(dim=0)``. Callers pass no NaN (their
    costs come from ``rank_costs``, which makes them +inf).
    """
    slots = torch.arange(costs.shape[0], device=costs.device)
    first = torch.where(costs == costs.min(), slots, costs.shape[0] - 1).amin(0, keepdim=True)
    return costs.index_select(0, first), first  # the element: a tied -0.0 stays -0.0
