"""Counter-based random numbers in pure tensor ops: Threefry-2x32 (20 rounds), as in JAX.

Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011. A key
is an ``int64`` tensor of shape ``(2,)`` holding two unsigned 32-bit words. Every function
is pure (the global torch RNG is never touched) and works under ``torch.func.vmap`` over
keys; keys, bits and uniforms are bitwise identical on every device, eager or compiled, and
normals eager and compiled on a device (another device's ``erfinv`` may differ by an ulp).
``key``, ``split`` and ``fold_in`` equal JAX's with ``jax_threefry_partitionable=False``.
The block function and an update's noise rows are ``torch.library`` ops: the same program
in every mode, a tensor reference on any device and faster kernels with the same bits on
the CPU (:data:`CPU_KERNEL`) and CUDA (docs/design.md, "Randomness").
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import numbers
import operator
import os
from types import SimpleNamespace
from typing import Any

import numpy as np
import optree
import torch
from torch import Tensor

__all__ = ["CPU_KERNEL", "bits", "fold_in", "key", "normal", "normal_rows", "split", "threefry2x32",
           "tree_normal_like", "uniform"]

_CLIB: Any = None  # the C kernel's functions, called through ctypes on tensors' data pointers
with contextlib.suppress(ImportError):  # built at install where a compiler is found (setup.py)
    if os.environ.get("FUNCTIONAL_BFO_CPU_KERNEL") != "numpy":  # numpy: chosen at run time
        from . import _threefry as _c_module  # type: ignore[attr-defined]  # built C, no stub

        _CLIB = ctypes.CDLL(_c_module.__file__)
        _CLIB.threefry2x32.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4 \
            + [ctypes.c_void_p] * 2 + [ctypes.c_int64]
        _CLIB.unit_rows.argtypes = [ctypes.c_int64] * 6 + [ctypes.c_void_p]
        _CLIB.threefry2x32.restype = _CLIB.unit_rows.restype = None
CPU_KERNEL = "c" if _CLIB is not None else "numpy"
"""Which kernel the CPU runs: ``"c"`` (built at install) or ``"numpy"`` (no compiler then, or
``FUNCTIONAL_BFO_CPU_KERNEL=numpy`` in the environment)."""

_MASK32 = 0xFFFFFFFF
_SQRT2 = math.sqrt(2.0)
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry_rounds(k0: Any, k1: Any, x0: Any, x1: Any, *,
                     wrap: Any = lambda x: x & _MASK32) -> tuple[Any, Any]:
    """The 20 rounds on int64 tensors of 32-bit words, or (``wrap``: none) numpy ``uint32``."""
    ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
    x0, x1 = wrap(x0 + ks[0]), wrap(x1 + ks[1])
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x0 = wrap(x0 + x1)
            x1 = wrap((x1 << r) | (x1 >> (32 - r))) ^ x0
        x0 = wrap(x0 + ks[(block + 1) % 3])
        x1 = wrap(x1 + ks[(block + 2) % 3] + block + 1)
    return x0, x1


def _lanes(device: torch.device, *words: Tensor) -> tuple[tuple[int, ...], list[Tensor], list[int]]:
    """The block function's inputs as int64 words on ``device`` (stride 1, or 0 for one word)."""
    shape = tuple(np.broadcast_shapes(*(t.shape for t in words)))  # torch's: ~200 us
    inputs, strides = [], []
    for t in words:
        t = t.to(device=device, dtype=torch.int64)
        scalar = t.numel() == 1  # any shape of one word
        if not scalar and (t.shape != shape or not t.is_contiguous()):
            t = t.expand(shape).contiguous()
        inputs.append(t)
        strides.append(0 if scalar else 1)
    return shape, inputs, strides


def _numpy_block(shape: tuple[int, ...], inputs: list[Tensor], strides: list[int]
                 ) -> tuple[Tensor, Tensor]:
    """The rounds in numpy ``uint32``, whose arithmetic wraps (1-D arrays: no warnings)."""
    y0, y1 = _threefry_rounds(*(t.numpy().astype(np.uint32).reshape(-1) for t in inputs),
                              wrap=lambda x: x)
    return (torch.from_numpy(y0.astype(np.int64)).reshape(shape),
            torch.from_numpy(y1.astype(np.int64)).reshape(shape))


def _c_block(shape: tuple[int, ...], inputs: list[Tensor], strides: list[int]
             ) -> tuple[Tensor, Tensor]:
    y0, y1 = torch.empty(shape, dtype=torch.int64), torch.empty(shape, dtype=torch.int64)
    _CLIB.threefry2x32(*(t.data_ptr() for t in inputs), *strides, y0.data_ptr(), y1.data_ptr(),
                    y0.numel())
    return y0, y1


def _c_unit_rows(key: Tensor, counter: Tensor, rows: int, cols: int,
                 compute: torch.dtype) -> Tensor:
    out = torch.empty((rows, cols), dtype=compute)
    _CLIB.unit_rows(*key.tolist(), int(counter) & _MASK32, rows, cols, compute == torch.float64,
                 out.data_ptr())
    return out


_CPU = SimpleNamespace(threefry=_numpy_block, unit_rows=None) if _CLIB is None else \
    SimpleNamespace(threefry=_c_block, unit_rows=_c_unit_rows)


@functools.cache
def _cuda_kernels(index: int) -> Any:
    """The Triton kernels for CUDA device ``index``; None without triton or before Volta."""
    try:
        from . import _threefry_cuda
    except ImportError:
        return None
    return _threefry_cuda if torch.cuda.get_device_capability(index) >= (7, 0) else None


def _kernels(device: torch.device) -> Any:
    """``device``'s kernels (``threefry`` on ``_lanes``, ``unit_rows``); None: the reference."""
    if device.type == "cuda":
        return _cuda_kernels(device.index)
    return _CPU if device.type == "cpu" else None


def _threefry(k0: Tensor, k1: Tensor, x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
    device = next((t.device for t in (k0, k1, x0, x1) if t.device.type != "cpu"),
                  k0.device)  # 0-d CPU words may join another device's
    if (kernels := _kernels(device)) is None:
        return _threefry_rounds(k0, k1, x0, x1)
    return kernels.threefry(*_lanes(device, k0, k1, x0, x1))


def _threefry_vmap(info, in_dims, *args: Tensor):
    """Batching rule: the op is elementwise with broadcasting, so align and call it once."""
    rank = max(a.dim() - (d is not None) for a, d in zip(args, in_dims))
    aligned = [a.unsqueeze(0) if d is None else a.movedim(d, 0) for a, d in zip(args, in_dims)]
    y0, y1 = _threefry_op(*(a.reshape(a.shape[0], *([1] * (rank + 1 - a.dim())), *a.shape[1:])
                            for a in aligned))
    shape = (info.batch_size, *y0.shape[1:])
    return (y0.expand(shape), y1.expand(shape)), (0, 0)


# Plain library ops, opaque to compilers, a fake and a vmap rule each (custom_op: +35 us).
_LIB = torch.library.Library("functional_bfo", "FRAGMENT")


def _define(schema: str, impl, reference, vmap):
    """Define ``functional_bfo::<schema>``: one kernel, the reference as fake, a vmap rule."""
    name = schema[: schema.index("(")]
    _LIB.define(schema)
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"functional_bfo::{name}", reference, lib=_LIB)
    torch.library.register_vmap(f"functional_bfo::{name}", vmap, lib=_LIB)
    return getattr(torch.ops.functional_bfo, name).default


# Opaque: inlined, the 20 dependent rounds cost inductor minutes per call site.
_threefry_op = _define(
    "threefry2x32(Tensor k0, Tensor k1, Tensor x0, Tensor x1) -> (Tensor, Tensor)",
    _threefry, _threefry_rounds, _threefry_vmap)


def threefry2x32(key: Tensor, x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
    """The Threefry-2x32 block function (20 rounds) on counter words ``(x0, x1)``.

    Args:
        key: ``(2,)`` int64 key.
        x0: int64 tensor of 32-bit counter words (any shape, broadcast with ``x1``).
        x1: int64 tensor of 32-bit counter words.

    Returns:
        The two output words, each shaped like ``x0 + x1``.
    """
    check_key(key)
    return _threefry_op(key[0], key[1], x0, x1)


def key(seed: int, *, device: torch.device | str | None = None) -> Tensor:
    """A key from an integer seed (its low 64 bits, as ``jax.random.PRNGKey``).

    Examples:
        >>> import functional_bfo as fb
        >>> fb.random.key(0)
        tensor([0, 0])
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"Invalid seed: {seed!r}; expected a Python int.")
    seed &= (1 << 64) - 1
    return torch.tensor([seed >> 32, seed & _MASK32], dtype=torch.int64, device=device)


def check_key(k: Tensor) -> None:
    if not isinstance(k, Tensor) or k.dtype != torch.int64 or tuple(k.shape) != (2,):
        got = f"{k.dtype} tensor of shape {tuple(k.shape)}" if isinstance(k, Tensor) else repr(k)
        raise TypeError(f"Expected a key (int64 tensor of shape (2,)), got {got}; "
                        "make one with functional_bfo.random.key(seed).")


def bits(key: Tensor, num: int) -> Tensor:
    """``num`` random 32-bit words (as int64 in ``[0, 2**32)``) from counters ``0..num-1``."""
    check_key(key)
    half = (num + 1) // 2
    counters = torch.arange(2 * half, dtype=torch.int64, device=key.device)
    if num % 2:  # JAX pads an odd count with one zero counter
        counters = torch.cat([counters[:-1], counters.new_zeros(1)])
    y0, y1 = threefry2x32(key, counters[:half], counters[half:])
    return torch.cat([y0, y1])[:num]


def split(key: Tensor, num: int = 2) -> Tensor:
    """``num`` independent keys, shape ``(num, 2)``."""
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ValueError(f"Invalid num: {num!r}; expected an int >= 1.")
    return bits(key, 2 * num).reshape(num, 2)


def fold_in(key: Tensor, data: int | Tensor) -> Tensor:
    """A new key that mixes ``data`` (an int or an integer tensor of any shape) into ``key``.

    With tensor ``data`` of shape ``s`` the result has shape ``s + (2,)``; this is how a step
    counter or a bacterium index turns into a stream of its own without a host sync.
    """
    check_key(key)
    if isinstance(data, Tensor) and (data.dtype.is_floating_point or data.dtype.is_complex
                                     or data.dtype == torch.bool):
        raise TypeError(f"Invalid data: a {data.dtype} tensor; fold_in takes an int or an "
                        "integer tensor (a float would be truncated: 1.5 and 1 alike).")
    if not isinstance(data, Tensor) and (isinstance(data, bool)
                                         or not isinstance(data, numbers.Integral)):
        raise TypeError(f"Invalid data: {data!r}; fold_in takes an int or an integer tensor.")
    data = torch.as_tensor(data, dtype=torch.int64, device=key.device)
    y0, y1 = threefry2x32(key, (data >> 32) & _MASK32, data & _MASK32)
    return torch.stack([y0, y1], dim=-1)


def _check_shape(shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of ints >= 0, or a clear error."""
    try:  # an int is not a shape
        dims = None if isinstance(shape, (int, str, bytes)) else tuple(map(operator.index, shape))
    except TypeError:
        dims = None
    if dims is None or any(n < 0 for n in dims):
        raise ValueError(f"Invalid shape: {shape!r}; expected a tuple of ints >= 0, "
                         "e.g. (5,) or ().")
    return dims


def _words(dtype: torch.dtype) -> tuple[torch.dtype, int]:
    """The dtype ``dtype``'s values are drawn in, and the 32-bit words each takes."""
    if not dtype.is_floating_point:
        raise TypeError(f"Invalid dtype: {dtype}; expected a floating dtype.")
    return (torch.float64, 2) if dtype == torch.float64 else (torch.float32, 1)


def _unit_interval(words: Tensor, dtype: torch.dtype, *, open_low: bool) -> Tensor:
    """Floats in ``[0, 1)`` (``(0, 1)`` with ``open_low``) from 32-bit words (last axis).

    float64 takes 53 bits from two words (the halves of the last axis give the high and low
    bits); other dtypes 24 bits in float32, then rounded to ``dtype`` and kept below 1.
    """
    # The open interval uses one bit less, so that m + 0.5 stays exact and below 1.
    bits = (53 if dtype == torch.float64 else 24) - int(open_low)
    if dtype == torch.float64:
        n = words.shape[-1] // 2
        m = ((words[..., :n] >> (64 - bits)) << 32) | words[..., n:]
        return (m.to(torch.float64) + (0.5 if open_low else 0.0)) * 2.0**-bits
    u = ((words >> (32 - bits)).to(torch.float32) + (0.5 if open_low else 0.0)) * 2.0**-bits
    if dtype != torch.float32:
        u = u.to(dtype).clamp(max=1.0 - torch.finfo(dtype).eps / 2)
    return u


def _inverse_normal_cdf(u: Tensor, erfinv=torch.erfinv) -> Tensor:
    """Standard normals from uniforms in the open interval (0, 1), as JAX draws them."""
    return _SQRT2 * erfinv(2.0 * u - 1.0)


# Opaque, so compiled graphs run eager's erfinv (inductor's CPU loop rounds differently).
_erfinv_op: Any = _define("erfinv(Tensor x) -> Tensor", torch.erfinv, torch.erfinv,
                          lambda info, in_dims, x: (_erfinv_op(x), in_dims[0]))


def uniform(key: Tensor, shape: tuple[int, ...] = (), dtype: torch.dtype = torch.float32,
            low: float | Tensor = 0.0, high: float | Tensor = 1.0) -> Tensor:
    """Uniform samples in ``[low, high)`` of the given shape and floating dtype.

    Python number bounds are checked (finite, ``low <= high``); tensor bounds are not,
    since that would read them on the host.
    """
    shape = _check_shape(shape)
    plain = [v for v in (low, high) if type(v) in (int, float)]  # not tensors, not traced
    # Comparisons, not math.isfinite: a float bound that varies is traced symbolically.
    if any(not -math.inf < v < math.inf for v in plain) or (len(plain) == 2 and low > high):
        raise ValueError(f"Invalid low, high: {low!r}, {high!r}; expected finite numbers (or "
                         "tensors) with low <= high.")
    u = _unit_interval(bits(key, math.prod(shape) * _words(dtype)[1]), dtype, open_low=False)
    u = u.reshape(shape)
    out = low + (high - low) * u
    # A width past the dtype's largest value is inf there: mix the bounds instead (the
    # finite samples keep the affine form's bits).
    out = torch.where(torch.isfinite(out), out, low * (1 - u) + high * u)
    # Rounding can reach ``high`` in low precision; fold those (rare) values onto ``low``.
    return torch.where(out < high, out, torch.as_tensor(low, dtype=dtype, device=out.device))


def normal(key: Tensor, shape: tuple[int, ...] = (), dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard normal samples, by the inverse CDF of an open-interval uniform (as JAX).

    Low-precision dtypes are drawn in float32 and rounded, so their tails match float32's.
    """
    shape = _check_shape(shape)
    compute, per_value = _words(dtype)
    u = _unit_interval(bits(key, math.prod(shape) * per_value), compute, open_low=True)
    return _inverse_normal_cdf(u, _erfinv_op).reshape(shape).to(dtype)


def normal_rows(key: Tensor, counter: Tensor | int, rows: int, cols: int,
                dtype: torch.dtype = torch.float32) -> Tensor:
    """``(rows, cols)`` standard normals, every row its own stream, in one block-function call.

    Row ``r`` is made from the words of counters ``(counter, r * h + j)``, ``j < h`` (``h``
    the row's half word count), so rows never share words, a row's numbers do not depend on
    ``rows``, and ``counter`` (a step number, a 0-d integer tensor) gives each call fresh
    streams without a host sync. This is how an update draws every bacterium's noise, in
    one opaque op (words, uniforms and the inverse CDF in one call).

    Raises:
        ValueError: ``rows * h`` does not fit the 32-bit counter word.
    """
    check_key(key)
    compute, per_value = _words(dtype)
    half = (cols * per_value + 1) // 2
    if rows * half > 2**32:
        raise ValueError(f"normal_rows: {rows} rows of {cols} values need {rows * half} "
                         "counters, more than the 2**32 a call can address; draw in parts.")
    counter = torch.as_tensor(counter, device=key.device).to(torch.int64)
    return _normal_rows_op(key, counter, rows, cols, compute).to(dtype)


def _normal_rows(key: Tensor, counter: Tensor, rows: int, cols: int,
                 compute: torch.dtype) -> Tensor:
    """``normal_rows`` in ``compute`` (float32 or float64) from the block function op.

    ``key`` ``(..., 2)`` and ``counter`` ``(...)`` may carry leading batch axes (broadcast).
    """
    per_row = cols * _words(compute)[1]
    half = (per_row + 1) // 2
    index = torch.arange(half, dtype=torch.int64, device=key.device)
    lanes = torch.arange(rows, dtype=torch.int64, device=key.device).unsqueeze(1) * half + index
    y0, y1 = _threefry_op(key[..., 0, None, None], key[..., 1, None, None],
                          (counter & _MASK32)[..., None, None], lanes)
    words = torch.cat([y0, y1], dim=-1)[..., :per_row]
    return _inverse_normal_cdf(_unit_interval(words, compute, open_low=True))


def _normal_rows_kernel(key: Tensor, counter: Tensor, rows: int, cols: int,
                        compute: torch.dtype) -> Tensor:
    """The op: a device's kernel makes ``2u - 1`` (every step exact), then erfinv."""
    unit_rows = getattr(_kernels(key.device), "unit_rows", None)
    if unit_rows is None or key.dim() != 1 or counter.dim() != 0:  # batch axes: the
        return _normal_rows(key, counter, rows, cols, compute)  # reference broadcasts them
    return unit_rows(key, counter, rows, cols, compute).erfinv_().mul_(_SQRT2)


def _normal_rows_vmap(info, in_dims, key, counter, rows, cols, compute):
    """Batching rule: the reference, with the batch axes leading."""
    key, counter = (x if d is None else x.movedim(d, 0) for x, d in zip((key, counter), in_dims))
    return _normal_rows(key, counter, rows, cols, compute), 0


# An update's noise in one opaque op: compiled runs eager's kernels, and their bits.
_normal_rows_op = _define(
    "normal_rows(Tensor key, Tensor counter, int rows, int cols, ScalarType compute) -> Tensor",
    _normal_rows_kernel, _normal_rows, _normal_rows_vmap)


def tree_normal_like(key: Tensor, tree, dtype: torch.dtype | None = None):
    """Standard normals shaped and placed like every leaf of ``tree``, from one draw.

    The leaves take consecutive slices of ``normal(key, (total_size,))`` in optree's flatten
    order; each keeps its dtype unless ``dtype`` is given (draws are made in float64 if any
    leaf is float64, else float32, then rounded).
    """
    leaves, spec = optree.tree_flatten(tree)
    dtypes = [dtype or x.dtype for x in leaves]
    draw_dtype = torch.float64 if torch.float64 in dtypes else torch.float32
    flat = normal(key, (sum(x.numel() for x in leaves),), draw_dtype)
    chunks = torch.split(flat, [x.numel() for x in leaves])
    return spec.unflatten([c.reshape(x.shape).to(dtype=dt, device=x.device)
                           for c, x, dt in zip(chunks, leaves, dtypes)])
