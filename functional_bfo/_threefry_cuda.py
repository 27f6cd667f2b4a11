"""The CUDA kernels of :mod:`functional_bfo.random`'s ops: Threefry in one Triton program.

Each lane's rounds stay in registers; the bits are the reference's (tests/test_random.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 1024


@triton.jit
def _mix(x0, x1, r: tl.constexpr):
    x0 = x0 + x1
    x1 = ((x1 << r) | (x1 >> (32 - r))) ^ x0
    return x0, x1


@triton.jit
def _four(x0, x1, r0: tl.constexpr, r1: tl.constexpr, r2: tl.constexpr, r3: tl.constexpr):
    x0, x1 = _mix(x0, x1, r0)
    x0, x1 = _mix(x0, x1, r1)
    x0, x1 = _mix(x0, x1, r2)
    return _mix(x0, x1, r3)


@triton.jit
def _rounds(a, b, x0, x1):
    """Threefry-2x32's 20 rounds on uint32 words (``random._threefry_rounds``)."""
    k2 = a ^ b ^ 0x1BD11BDA
    x0, x1 = _four(x0 + a, x1 + b, 13, 15, 26, 6)
    x0, x1 = _four(x0 + b, x1 + k2 + 1, 17, 29, 16, 24)
    x0, x1 = _four(x0 + k2, x1 + a + 2, 13, 15, 26, 6)
    x0, x1 = _four(x0 + a, x1 + b + 3, 17, 29, 16, 24)
    x0, x1 = _four(x0 + b, x1 + k2 + 4, 13, 15, 26, 6)
    return x0 + k2, x1 + a + 5


@triton.jit
def _word(p, i, step: tl.constexpr):
    """Word ``i`` of an input held as int64 (``step`` 0: the one word of a scalar)."""
    return tl.load(p + i * step).to(tl.uint32)


@triton.jit
def _block_kernel(k0, k1, c0, c1, y0, y1, n, s0: tl.constexpr, s1: tl.constexpr,
                  s2: tl.constexpr, s3: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    i = tl.where(live, i, 0)
    x0, x1 = _rounds(_word(k0, i, s0), _word(k1, i, s1), _word(c0, i, s2), _word(c1, i, s3))
    tl.store(y0 + i, x0.to(tl.int64), mask=live)
    tl.store(y1 + i, x1.to(tl.int64), mask=live)


def threefry(shape: tuple[int, ...], inputs: list[Tensor], strides: list[int]
             ) -> tuple[Tensor, Tensor]:
    """The block function on the int64 words ``random._lanes`` lays out on a GPU."""
    y0 = torch.empty(shape, dtype=torch.int64, device=inputs[0].device)
    y1 = torch.empty_like(y0)
    if n := y0.numel():
        _block_kernel[(triton.cdiv(n, BLOCK),)](*inputs, y0, y1, n, *strides, BLOCK=BLOCK)
    return y0, y1


@triton.jit
def _unit(w):
    """``2u - 1`` from 23 bits of a word, u in the open (0, 1): every step exact."""
    return 2.0 * (((w >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07) - 1.0


@triton.jit
def _unit_rows_kernel(key, counter, out, lanes, h, cols, WIDE: tl.constexpr, BLOCK: tl.constexpr):
    """Row ``r`` of ``cols`` values from counters ``(counter, r * h + k)``, as the C kernel."""
    lane = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = lane < lanes
    a = tl.load(key).to(tl.uint32)
    b = tl.load(key + 1).to(tl.uint32)
    c = tl.load(counter).to(tl.uint32)
    x0, x1 = _rounds(a, b, tl.zeros_like(lane).to(tl.uint32) + c, lane.to(tl.uint32))
    row = lane // h
    k = lane - row * h
    at = out + row * cols + k
    if WIDE:
        bits = ((x0 >> 12).to(tl.uint64) << 32) | x1.to(tl.uint64)
        tl.store(at, 2.0 * ((bits.to(tl.float64) + 0.5) * 2.220446049250313e-16) - 1.0, mask=live)
    else:
        tl.store(at, _unit(x0), mask=live)
        tl.store(at + h, _unit(x1), mask=live & (h + k < cols))


def unit_rows(key: Tensor, counter: Tensor, rows: int, cols: int, compute: torch.dtype) -> Tensor:
    """``2u - 1`` of ``random.normal_rows`` for one key and counter, as the C kernel makes it."""
    out = torch.empty((rows, cols), dtype=compute, device=key.device)
    wide = compute == torch.float64
    h = cols if wide else (cols + 1) // 2
    if lanes := rows * h:
        _unit_rows_kernel[(triton.cdiv(lanes, BLOCK),)](
            key.contiguous(), counter.to(key.device, torch.int64), out, lanes, h, cols, WIDE=wide,
            BLOCK=BLOCK)
    return out
