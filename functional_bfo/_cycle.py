"""When a cycle ends: reproduction every ``N_c`` updates, elimination–dispersal every ``N_c N_re``.

An event happens on a few updates only, but an update is one tensor program in every mode
(eager, compiled, vmapped, on any device): each event runs on every update, masked by its
0-d bool flag, so no value is read on the host and no mode needs a branch of its own.
"""

from __future__ import annotations

from torch import Tensor


def cycle_ends(step: Tensor, period: int) -> Tensor:
    """``step > 0 and step % period == 0`` as a 0-d bool tensor: whether a cycle ends now."""
    return (step > 0) & (step % period == 0)
