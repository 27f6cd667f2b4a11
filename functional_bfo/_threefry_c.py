"""Threefry-2x32 for the CPU as one small C loop, built once with the system C compiler.

On the CPU the block function is the largest cost of an update after the loss itself: numpy
makes ~110 passes over the counter arrays, while one C loop keeps each lane's 20 rounds in
registers and vectorizes (AVX2 where the CPU has it, chosen at load time): about 6x faster than
numpy on an update's lanes, with the same bits (``benchmarks/update_overhead.py``).

The library is compiled on first use (about 0.2 s) into ``$FUNCTIONAL_BFO_CACHE`` (default
``~/.cache/functional_bfo``) under a name that hashes the source, compiler and flags, so
processes share it (a private temporary folder when that is not writable); ``$CC`` picks
the compiler (default: the first of ``cc``, ``gcc``, ``clang`` found). When it cannot be
built a warning says why, once, and the caller falls back to numpy.
``FUNCTIONAL_BFO_NO_C=1`` turns it off without a warning.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

SOURCE = r"""
#include <stdint.h>

#define BLOCK 256
#define ROTL(x, r) (((x) << (r)) | ((x) >> (32 - (r))))
#define ROUND(r) x0 += x1; x1 = ROTL(x1, r) ^ x0;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* The 20 rounds on m <= BLOCK lanes in place: the loop vectorizes. */
static inline void rounds(const uint32_t *A, const uint32_t *B, uint32_t *X0, uint32_t *X1,
                          int64_t m) {
  for (int64_t j = 0; j < m; j++) {
    uint32_t a = A[j], b = B[j], k2 = a ^ b ^ 0x1BD11BDAu;
    uint32_t x0 = X0[j] + a, x1 = X1[j] + b;
    ROUND(13) ROUND(15) ROUND(26) ROUND(6)  x0 += b;  x1 += k2 + 1u;
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += k2; x1 += a + 2u;
    ROUND(13) ROUND(15) ROUND(26) ROUND(6)  x0 += a;  x1 += b + 3u;
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += b;  x1 += k2 + 4u;
    ROUND(13) ROUND(15) ROUND(26) ROUND(6)  x0 += k2; x1 += a + 5u;
    X0[j] = x0;
    X1[j] = x1;
  }
}

/* Threefry-2x32, 20 rounds (Salmon et al. 2011), on n lanes of 32-bit words held in int64.
   Each input is a scalar (stride 0) or a contiguous array of n words (stride 1). Lanes go
   through in blocks gathered into uint32 scratch. */
CLONES
void threefry2x32(const int64_t *k0, const int64_t *k1, const int64_t *c0, const int64_t *c1,
                  int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                  int64_t *y0, int64_t *y1, int64_t n) {
  uint32_t A[BLOCK], B[BLOCK], X0[BLOCK], X1[BLOCK];
  for (int64_t base = 0; base < n; base += BLOCK) {
    int64_t m = n - base < BLOCK ? n - base : BLOCK;
    for (int64_t j = 0; j < m; j++) {
      int64_t i = base + j;
      A[j] = (uint32_t)k0[i * s0];
      B[j] = (uint32_t)k1[i * s1];
      X0[j] = (uint32_t)c0[i * s2];
      X1[j] = (uint32_t)c1[i * s3];
    }
    rounds(A, B, X0, X1, m);
    for (int64_t j = 0; j < m; j++) {
      y0[base + j] = X0[j];
      y1[base + j] = X1[j];
    }
  }
}

/* The inverse normal CDF's inputs x = 2u - 1 of random.normal_rows, every step exact:
   row r of `cols` values takes the words of counters (counter, r * h + j), j < h. A float
   takes 23 bits of one word (value k < h from the first word of lane k, the rest from the
   second words); a double takes 52 bits of two (h = cols: 20 from the first word of lane k,
   32 from its second). u = (m + 0.5) 2^-bits lies in the open interval (0, 1). */
CLONES
void unit_rows(int64_t k0, int64_t k1, int64_t counter, int64_t rows, int64_t cols,
               int64_t wide, void *out) {
  uint32_t A[BLOCK], B[BLOCK], X0[BLOCK], X1[BLOCK];
  int64_t h = wide ? cols : (cols + 1) / 2, n = rows * h;
  for (int64_t j = 0; j < BLOCK; j++) {
    A[j] = (uint32_t)k0;
    B[j] = (uint32_t)k1;
  }
  int64_t r = 0, k = 0; /* the row and place in it of the next lane written out */
  for (int64_t base = 0; base < n; base += BLOCK) {
    int64_t m = n - base < BLOCK ? n - base : BLOCK;
    for (int64_t j = 0; j < m; j++) {
      X0[j] = (uint32_t)counter;
      X1[j] = (uint32_t)(base + j);
    }
    rounds(A, B, X0, X1, m);
    for (int64_t j = 0; j < m; j++) {
      if (wide) {
        uint64_t bits = ((uint64_t)(X0[j] >> 12) << 32) | X1[j];
        ((double *)out)[r * cols + k] = 2.0 * (((double)bits + 0.5) * 0x1p-52) - 1.0;
      } else {
        float *row = (float *)out + r * cols;
        row[k] = 2.0f * (((float)(X0[j] >> 9) + 0.5f) * 0x1p-23f) - 1.0f;
        if (h + k < cols) row[h + k] = 2.0f * (((float)(X1[j] >> 9) + 0.5f) * 0x1p-23f) - 1.0f;
      }
      if (++k == h) {
        k = 0;
        r++;
      }
    }
  }
}
"""

FLAGS = ("-O3", "-shared", "-fPIC")
_build_lock = threading.Lock()


def cache_dir() -> Path:
    """Where built kernels live: ``$FUNCTIONAL_BFO_CACHE``, else the user's cache folder."""
    if os.environ.get("FUNCTIONAL_BFO_CACHE"):
        return Path(os.environ["FUNCTIONAL_BFO_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "functional_bfo"


def compiler() -> str:
    """``$CC``, else the first of ``cc``, ``gcc``, ``clang`` on the path."""
    found = (name for name in ("cc", "gcc", "clang") if shutil.which(name))
    return os.environ.get("CC") or next(found, "cc")


def build(cc: str, directory: Path) -> Path:
    """Compile ``SOURCE`` with the command ``cc`` into a library in ``directory``, or reuse it.

    Raises:
        RuntimeError: the compiler is missing or fails; the message carries its output.
    """
    command = [*shlex.split(cc), *FLAGS]
    tag = "\0".join([SOURCE, *command, platform.machine(), sys.platform])
    path = directory / f"threefry2x32-{hashlib.sha256(tag.encode()).hexdigest()[:16]}.so"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        source, built = Path(scratch) / "threefry2x32.c", Path(scratch) / "threefry2x32.so"
        source.write_text(SOURCE)
        try:
            done = subprocess.run([*command, str(source), "-o", str(built)],
                                  capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as error:
            raise RuntimeError(f"{command[0]!r} did not run: {error}") from error
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
        os.replace(built, path)  # atomic: a process racing us loads either copy
    return path


class Kernels(NamedTuple):
    """The library's two functions, as ctypes functions with their argument types set."""

    threefry2x32: Callable[..., None]  # the block function on broadcast lanes
    unit_rows: Callable[..., None]  # random.normal_rows' uniforms, mapped to (-1, 1)


def load(path: Path) -> Kernels:
    """The functions of a built library."""
    library = ctypes.CDLL(str(path))
    block, rows = library.threefry2x32, library.unit_rows
    block.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 2 \
        + [ctypes.c_int64]
    rows.argtypes = [ctypes.c_int64] * 6 + [ctypes.c_void_p]
    block.restype = rows.restype = None
    return Kernels(block, rows)


@functools.cache
def kernel() -> Kernels | None:
    """The process's kernels, built on first call; None (with one warning) if they cannot be."""
    if os.environ.get("FUNCTIONAL_BFO_NO_C", "") not in ("", "0"):
        return None
    with _build_lock:
        try:
            try:
                path = build(compiler(), cache_dir())
            except OSError:  # an unwritable cache: build in a private folder of this process
                path = build(compiler(), Path(tempfile.mkdtemp(prefix="functional_bfo-")))
            return load(path)
        except (RuntimeError, OSError) as error:
            warnings.warn(
                f"functional_bfo: could not build the C Threefry kernel ({error}); random "
                "numbers on the CPU are drawn with numpy (or tensor ops) instead: the same "
                "bits, 3-10x slower. Install a C compiler (or point $CC at one), or set "
                "FUNCTIONAL_BFO_NO_C=1 to silence this.", RuntimeWarning, stacklevel=2)
            return None


def _broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy broadcasting of shapes, in Python (``torch.broadcast_shapes`` costs ~200 us)."""
    rank = max(len(s) for s in shapes)
    out = []
    for sizes in zip(*[(1,) * (rank - len(s)) + tuple(s) for s in shapes]):
        other = {d for d in sizes if d != 1}
        if len(other) > 1:
            raise ValueError(f"threefry2x32: shapes {shapes} do not broadcast.")
        out.append(other.pop() if other else 1)
    return tuple(out)


def threefry2x32(kernels: Kernels, k0: Tensor, k1: Tensor, x0: Tensor, x1: Tensor
                 ) -> tuple[Tensor, Tensor]:
    """The block function on CPU int64 words, broadcasting as numpy."""
    shape = _broadcast_shape(k0.shape, k1.shape, x0.shape, x1.shape)
    inputs, strides = [], []
    for t in (k0, k1, x0, x1):
        if t.dtype != torch.int64:
            t = t.to(torch.int64)
        scalar = t.numel() == 1  # any shape of one word: read in place, stride 0
        if not scalar and (t.shape != shape or not t.is_contiguous()):
            t = t.expand(shape).contiguous()
        inputs.append(t)
        strides.append(0 if scalar else 1)
    y0 = torch.empty(shape, dtype=torch.int64)
    y1 = torch.empty(shape, dtype=torch.int64)
    kernels.threefry2x32(*(t.data_ptr() for t in inputs), *strides, y0.data_ptr(),
                         y1.data_ptr(), y0.numel())
    return y0, y1


def unit_rows(kernels: Kernels, key: Tensor, counter: int, rows: int, cols: int,
              dtype: torch.dtype) -> Tensor:
    """``2u - 1`` for the open-interval uniforms ``u`` of ``random.normal_rows`` (CPU).

    ``dtype`` is float32 (23 bits of one word per value) or float64 (52 bits of two).
    """
    out = torch.empty((rows, cols), dtype=dtype)
    k0, k1 = key.tolist()
    kernels.unit_rows(k0, k1, counter, rows, cols, dtype == torch.float64, out.data_ptr())
    return out
