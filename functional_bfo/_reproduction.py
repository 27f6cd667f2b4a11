"""Reproduction: the healthiest half splits and replaces the least healthy half (Passino 2002).

Health is the cost accumulated over the chemotactic steps since the last reproduction (lower
is healthier). With an odd population the healthiest ``ceil(P/2)`` survive and the
healthiest ``floor(P/2)`` are copied, so shapes never change.
"""

from __future__ import annotations

import torch
from torch import Tensor


def reproduction_index(health: Tensor, reproduce: Tensor) -> Tensor:
    """Source bacterium of each slot after reproduction, shape (P,).

    The identity when ``reproduce`` (a 0-d bool) is false, so one gather serves both cases
    without a branch.
    """
    size = health.shape[0]
    order = torch.argsort(health, stable=True)
    survivors = size - size // 2
    split = torch.cat([order[:survivors], order[: size // 2]])
    return torch.where(reproduce, split, torch.arange(size, device=health.device))
