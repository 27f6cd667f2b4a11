"""Cell-to-cell attraction and repulsion J_cc (Passino 2002, eq. 2).

``J_cc(theta, P) = sum_j [-d_attract exp(-w_attract |theta - theta_j|^2)
                         + h_repel exp(-w_repel |theta - theta_j|^2)]``

Squared distances come from ``|a|^2 + |b|^2 - 2 a.b`` on flattened leaves: a (P, P) matrix,
never the (P, P, D) differences, so memory stays O(P^2 + P D).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class SwarmingWeights(NamedTuple):
    """Passino's constants, each a 0-d tensor."""

    d_attract: Tensor  # depth of the attractant
    w_attract: Tensor  # width of the attractant
    h_repel: Tensor  # height of the repellent
    w_repel: Tensor  # width of the repellent


def pairwise_sq_distances(a: Tensor, b: Tensor, b_sq: Tensor, dtype: torch.dtype) -> Tensor:
    """(P_a, P_b) squared distances between the rows of two populations."""
    a = a.to(dtype)
    cross = torch.einsum("pd,qd->pq", a, b.to(dtype))
    return (a.square().sum(1).unsqueeze(1) + b_sq.unsqueeze(0) - 2 * cross).clamp_min(0)


def cell_to_cell(
    positions: Tensor, swarm: Tensor, swarm_sq: Tensor, w: SwarmingWeights, dtype: torch.dtype
) -> Tensor:
    """J_cc of each bacterium in ``positions`` against the whole ``swarm``, shape (P,)."""
    d2 = pairwise_sq_distances(positions, swarm, swarm_sq, dtype)
    terms = -w.d_attract * torch.exp(-w.w_attract * d2) + w.h_repel * torch.exp(-w.w_repel * d2)
    return terms.sum(dim=1)
