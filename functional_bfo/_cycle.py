"""When a cycle ends; every event runs on every update, masked by this flag (docs/design.md).

A driver that knows the step on the host (``run``, the black box) leaves the masked events
out where none fires: ``_ask_tell.at_step`` picks each variant's twin built without them.
"""

from __future__ import annotations

from torch import Tensor


def cycle_ends(step: Tensor, period: int) -> Tensor:
    """``step > 0 and step % period == 0`` as a 0-d bool tensor: whether a cycle ends now."""
    return (step > 0) & (step % period == 0)
