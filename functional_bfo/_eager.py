"""When an update may take eager-only shortcuts: read a 0-d tensor, skip an opaque op.

Compiled, exported, traced, vmapped or on a GPU, an update must stay a pure tensor program
(no host reads, no graph breaks, no data baked into a trace); plainly eager on the CPU, a
host read syncs nothing and each skipped small op saves its dispatch (docs/design.md).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

_is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def plain_cpu(*tensors: Tensor) -> bool:
    """Whether ``tensors`` are ordinary CPU tensors in plain eager execution.

    False while compiling or exporting, under a dispatch mode (fake tensors, tracing),
    inside ``torch.func`` transforms (wrapped tensors), and for tensor subclasses or other
    devices.
    """
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return False
    return all(type(t) is Tensor and t.device.type == "cpu" and not _is_wrapped(t)
               for t in tensors)
