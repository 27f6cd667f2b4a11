"""Reproduction: the healthiest half splits and replaces the least healthy half (Passino 2002).

Health is the cost accumulated over the chemotactic steps since the last reproduction (lower
is healthier). With an odd population the healthiest ``ceil(P/2)`` survive and the
healthiest ``floor(P/2)`` are copied, so shapes never change.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._eager import plain_cpu


def cycle_flags(step: Tensor, periods: tuple[int, ...]) -> list[Tensor | bool]:
    """``step > 0 and step % period == 0`` for each period: whether a cycle ends now.

    Plainly eager on the CPU (``plain_cpu``) the step is read, which syncs nothing there,
    and a flag that does not hold is Python ``False``, so the update skips the work it
    would mask away. Otherwise each flag is a 0-d bool tensor: no sync, no graph break, and
    the masked work runs; results are the same either way.
    """
    if not plain_cpu(step):
        return [(step > 0) & (step % period == 0) for period in periods]
    now = int(step)
    return [torch.tensor(True) if now > 0 and now % period == 0 else False
            for period in periods]


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
    survivors = active - active // 2
    copy = (slots - survivors).clamp_min(0)
    split = torch.where(slots < survivors, order, order[copy])
    return torch.where(reproduce & inside, split, slots)
