"""Reproduction: the healthiest half splits and replaces the least healthy half (Passino 2002).

Health is the cost accumulated over the chemotactic steps since the last reproduction (lower
is healthier). With an odd population the healthiest ``ceil(P/2)`` survive and the
healthiest ``floor(P/2)`` are copied, so shapes never change.
"""

from __future__ import annotations

import torch
from torch import Tensor


def reproduce(flag: Tensor, population: Tensor, losses: Tensor, health: Tensor
              ) -> tuple[Tensor, Tensor, Tensor]:
    """Where ``flag`` (0-d bool) holds, the healthiest half splits and health restarts at zero."""
    source = reproduction_index(health, flag)
    return (population.index_select(0, source), losses.index_select(0, source),
            torch.where(flag, 0.0, health))


def reproduction_index(health: Tensor, reproduce: Tensor, active: Tensor | None = None) -> Tensor:
    """Source bacterium of each slot after reproduction, shape (P,).

    The identity when ``reproduce`` (a 0-d bool) is false, so one gather serves both cases
    without a branch. With ``active`` (a 0-d count ``n``), only the first ``n`` slots take
    part: the healthiest ``ceil(n/2)`` of them survive into slots ``0..ceil(n/2)``, copies of
    the healthiest ``floor(n/2)`` fill the rest of the window, and slots from ``n`` on keep
    their (inactive) bacteria.
    """
    size = health.shape[0]
    slots = torch.arange(size, device=health.device)
    if active is None:
        order = torch.argsort(health, stable=True)
        survivors = size - size // 2
        split = torch.cat([order[:survivors], order[: size // 2]])
        return torch.where(reproduce, split, slots)
    inside = slots < active
    order = torch.argsort(torch.where(inside, health, torch.inf), stable=True)
    kept = active - active // 2
    copy = (slots - kept).clamp_min(0)
    split = torch.where(slots < kept, order, order[copy])
    return torch.where(reproduce & inside, split, slots)
