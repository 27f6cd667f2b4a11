"""Tests for functional_bfo.random: known answers, statistics, purity, vmap, torch.compile."""

from __future__ import annotations

import math

import numpy as np
import optree
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import functional_bfo as fb

R = fb.random
M32 = 0xFFFFFFFF
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FLOAT_IDS = ("float16", "bfloat16", "float32", "float64")
HYP = settings(max_examples=25, deadline=None)

seeds = st.integers(0, 2**64 - 1)
words = st.integers(0, M32)


# --------------------------------------------------------------------------- reference


def _ref_rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & M32


def ref_threefry2x32(k0: int, k1: int, x0: int, x1: int) -> tuple[int, int]:
    """Threefry-2x32-20 on Python ints, written from the Random123 spec (not from random.py)."""
    ks = [k0, k1, k0 ^ k1 ^ 0x1BD11BDA]
    rot = [13, 15, 26, 6, 17, 29, 16, 24]
    x0, x1 = (x0 + ks[0]) & M32, (x1 + ks[1]) & M32
    for rnd in range(20):
        x0 = (x0 + x1) & M32
        x1 = _ref_rotl(x1, rot[rnd % 8]) ^ x0
        if rnd % 4 == 3:
            s = rnd // 4 + 1  # key-schedule injection number
            x0 = (x0 + ks[s % 3]) & M32
            x1 = (x1 + ks[(s + 1) % 3] + s) & M32
    return x0, x1


def _t(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def ks_statistic(x: torch.Tensor, cdf) -> float:
    """Kolmogorov-Smirnov sup |F_n - F| of the sample ``x`` against the CDF ``cdf``."""
    x = torch.sort(x.to(torch.float64).flatten()).values
    n = x.numel()
    f = cdf(x)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return max((i / n - f).max().item(), (f - (i - 1) / n).max().item())


def ks_critical(n: int, alpha: float = 1e-4) -> float:
    """Asymptotic KS critical value, ``sqrt(-ln(alpha / 2) / (2 n))``."""
    return math.sqrt(-math.log(alpha / 2) / (2 * n))


# --------------------------------------------------------------------------- known answers

KAT = [
    pytest.param((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE), id="zeros"),
    pytest.param((M32, M32), (M32, M32), (0x1CB996FC, 0xBB002BE7), id="ones"),
    pytest.param(
        (0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0), id="pi"
    ),
]


@pytest.mark.parametrize(("k", "ctr", "expected"), KAT)
def test_threefry_known_answer(k, ctr, expected):
    y0, y1 = R.threefry2x32(_t(*k), _t(ctr[0]), _t(ctr[1]))
    assert y0.dtype == y1.dtype == torch.int64
    assert (y0.item(), y1.item()) == expected


@pytest.mark.parametrize(("k", "ctr", "expected"), KAT)
def test_reference_threefry_known_answer(k, ctr, expected):
    # Validates the pure-Python reference used by the property test below.
    assert ref_threefry2x32(*k, *ctr) == expected


def test_threefry_known_answers_batched():
    # All three vectors in one call with broadcast counter tensors, one key at a time.
    for k, ctr, expected in (p.values for p in KAT):
        x0 = torch.tensor([ctr[0], 0, ctr[0]])
        x1 = torch.tensor([ctr[1], 0, ctr[1]])
        y0, y1 = R.threefry2x32(_t(*k), x0, x1)
        assert (y0[0].item(), y1[0].item()) == expected
        assert torch.equal(y0[0], y0[2]) and torch.equal(y1[0], y1[2])


@HYP
@given(k0=words, k1=words, x0=st.lists(words, min_size=1, max_size=8), data=st.data())
def test_threefry_matches_reference(k0, k1, x0, data):
    x1 = data.draw(st.lists(words, min_size=len(x0), max_size=len(x0)))
    y0, y1 = R.threefry2x32(_t(k0, k1), torch.tensor(x0), torch.tensor(x1))
    got = list(zip(y0.tolist(), y1.tolist(), strict=True))
    assert got == [ref_threefry2x32(k0, k1, a, b) for a, b in zip(x0, x1, strict=True)]


needs_c = pytest.mark.skipif(R.CPU_KERNEL != "c", reason="installed without the C kernel")


def _on_cpu(block):
    """A CPU block kernel called as the op is, on words it lays out itself."""
    return lambda *words: block(*R._lanes(torch.device("cpu"), *words))


KERNELS = [_on_cpu(R._numpy_block), R._threefry_op,
           pytest.param(_on_cpu(R._c_block), marks=needs_c, id="c")]


@pytest.mark.parametrize("kernel", KERNELS, ids=["numpy", "op", "c"])
@HYP
@given(k0=words, k1=words, rows=st.integers(1, 4), cols=st.integers(1, 300),
       broadcast=st.sampled_from(["none", "x1_row", "key_vector", "transposed"]))
def test_every_cpu_kernel_is_bitwise_the_reference(kernel, k0, k1, rows, cols, broadcast):
    """The CPU kernels (numpy; C when installed; the op picks one) are bitwise the tensor
    reference that every other device runs: broadcasting, strided inputs, and more lanes
    than the C loop's block of 256."""
    x0 = torch.randint(0, 2**32, (rows, cols))
    if broadcast == "transposed":
        x0 = torch.randint(0, 2**32, (cols, rows)).T
    x1 = torch.randint(0, 2**32, (1, cols) if broadcast == "x1_row" else (rows, cols))
    a = torch.tensor(k0) if broadcast != "key_vector" else torch.full((cols,), k0)
    b = torch.tensor(k1)
    for e, g in zip(R._threefry_rounds(a, b, x0, x1), kernel(a, b, x0, x1)):
        assert e.shape == g.shape and g.dtype == torch.int64 and torch.equal(e, g)


@needs_c
@HYP
@given(seed=seeds, counter=st.integers(0, 2**40), rows=st.integers(1, 40),
       cols=st.integers(1, 300), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_the_c_row_kernel_is_bitwise_the_reference(seed, counter, rows, cols, dtype):
    k, c = R.key(seed), torch.tensor(counter)
    expected = R._normal_rows(k, c, rows, cols, dtype)
    assert torch.equal(R._normal_rows_op(k, c, rows, cols, dtype), expected)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or R._cuda_kernels(0) is None,
                                reason="needs CUDA and triton")


@needs_cuda
@HYP
@given(seed=seeds, counter=st.integers(0, 2**40), rows=st.integers(1, 40),
       cols=st.integers(1, 300), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_the_cuda_row_kernel_is_bitwise_the_reference(seed, counter, rows, cols, dtype):
    k, c = R.key(seed, device="cuda"), torch.tensor(counter, device="cuda")
    with pytest.MonkeyPatch.context() as m:  # the tensor reference all the way down
        m.setattr(R, "_cuda_kernels", lambda index: None)
        expected = R._normal_rows_op(k, c, rows, cols, dtype)
    assert torch.equal(R._normal_rows_op(k, c, rows, cols, dtype), expected)
    strided = torch.stack([k, k], dim=1)[:, 0]  # a key that is not contiguous
    assert torch.equal(R._normal_rows_op(strided, c, rows, cols, dtype), expected)


@needs_cuda
@HYP
@given(k0=words, k1=words, rows=st.integers(1, 4), cols=st.integers(1, 3000),
       broadcast=st.sampled_from(["none", "x1_row", "key_vector", "transposed"]))
def test_the_cuda_block_kernel_is_bitwise_the_reference(k0, k1, rows, cols, broadcast):
    """Words outside [0, 2**32) too: both keep their low 32 bits."""
    x0 = torch.randint(-2**40, 2**40, (rows, cols), device="cuda")
    if broadcast == "transposed":
        x0 = torch.randint(0, 2**32, (cols, rows), device="cuda").T
    x1 = torch.randint(0, 2**32, (1, cols) if broadcast == "x1_row" else (rows, cols),
                       device="cuda")
    a = torch.tensor(k0) if broadcast != "key_vector" else torch.full((cols,), k0)
    a, b = a.cuda(), torch.tensor(k1, device="cuda")
    for e, g in zip(R._threefry_rounds(a, b, x0, x1), R._threefry_op(a, b, x0, x1)):
        assert e.shape == g.shape and g.dtype == torch.int64 and torch.equal(e, g)


@needs_cuda
# torch captures an empty graph of its own when the first CUDA graph tree starts, and warns
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty:UserWarning")
def test_cuda_graphs_replay_the_kernel_with_each_calls_counter():
    """The Triton kernel reads key and counter on the device, so a CUDA graph replays it."""
    key = R.key(7, device="cuda")
    draw = torch.compile(lambda k, c: R.normal_rows(k, c, 64, 63), fullgraph=True,
                         mode="reduce-overhead")
    for step in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        counter = torch.tensor(step, device="cuda")
        got = draw(key, counter).clone()
        assert torch.equal(got, R._normal_rows(key, counter, 64, 63, torch.float32))


def test_the_reference_kernel_runs_where_the_cpu_kernel_does_not():
    """Meta tensors (and any device without a kernel of its own) take the tensor reference."""
    x = torch.arange(4)
    y0, _ = R._threefry_op(*_t(1, 2), x.to("meta"), x.to("meta"))
    assert y0.device.type == "meta" and y0.shape == (4,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_normal_rows_rows_are_streams_of_their_own(dtype):
    k = R.key(5)
    few, many = R.normal_rows(k, torch.tensor(3), 2, 7, dtype), R.normal_rows(k, 3, 5, 7, dtype)
    assert few.shape == (2, 7) and few.dtype == dtype
    assert torch.equal(few, many[:2])  # a row does not depend on how many rows are drawn
    other = R.normal_rows(k, 4, 5, 7, dtype)
    assert not torch.equal(many, other)  # the counter gives fresh streams
    assert not torch.equal(many[0], many[1])


@HYP
@given(seed=seeds, counter=st.integers(0, 2**40), rows=st.integers(1, 40),
       cols=st.integers(1, 300), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_normal_rows_is_the_reference_with_counters_past_the_word(seed, counter, rows, cols,
                                                                   dtype):
    """The op draws what its tensor-op kernel draws with the reference block function."""
    k, c = R.key(seed), torch.tensor(counter)
    half = (cols * (2 if dtype == torch.float64 else 1) + 1) // 2
    lanes = torch.arange(rows).unsqueeze(1) * half + torch.arange(half)
    y0, y1 = R._threefry_rounds(k[0], k[1], c & M32, lanes)
    words = torch.cat([y0, y1], dim=-1)[:, : cols * (2 if dtype == torch.float64 else 1)]
    u = R._unit_interval(words, dtype, open_low=True)
    expected = math.sqrt(2.0) * torch.erfinv(2.0 * u - 1.0)
    got = R.normal_rows(k, c, rows, cols, dtype)
    assert got.shape == (rows, cols) and got.dtype == dtype and torch.equal(got, expected)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=("float32", "float64"))
def test_normal_rows_vmaps_over_keys_and_counters_and_compiles(dtype):
    keys, steps = R.split(R.key(7), 3), torch.tensor([0, 5, 2**33])
    draw = lambda k, c: R.normal_rows(k, c, 4, 9, dtype)  # noqa: E731
    for in_dims in ((0, None), (None, 0), (0, 0)):
        args = (keys if in_dims[0] == 0 else keys[1], steps if in_dims[1] == 0 else steps[1])
        loop_args = [a if d == 0 else [a] * 3 for a, d in zip(args, in_dims)]
        assert torch.equal(torch.func.vmap(draw, in_dims)(*args), _loop(draw, *loop_args))
    compiled = torch.compile(draw, fullgraph=True)
    assert torch.equal(compiled(keys[0], steps[2]), draw(keys[0], steps[2]))


def test_normal_rows_is_standard_normal_and_rejects_overflow():
    z = R.normal_rows(R.key(1), 0, 400, 100).flatten().double()
    assert abs(float(z.mean())) < 0.02 and abs(float(z.std()) - 1) < 0.02
    with pytest.raises(ValueError, match="2\\*\\*32"):
        R.normal_rows(R.key(1), 0, 2**21, 2**13)


def test_split_key0_matches_jax():
    expected = torch.tensor([[4146024105, 967050713], [2718843009, 1272950319]])
    out = R.split(R.key(0))
    assert out.dtype == torch.int64
    assert torch.equal(out, expected)


def test_fold_in_matches_jax_scheme():
    # jax: threefry_2x32(key, threefry_seed(data)) = block on counter (0, data).
    k = R.key(1234)
    expected = ref_threefry2x32(*k.tolist(), 0, 7)
    assert tuple(R.fold_in(k, 7).tolist()) == expected


def test_key_words():
    assert R.key(0).tolist() == [0, 0]
    assert R.key(2**32 + 5).tolist() == [1, 5]
    assert R.key(0).dtype == torch.int64 and R.key(0).shape == (2,)
    assert R.key(-1).tolist() == [M32, M32]  # low 64 bits, as jax.random.PRNGKey
    assert R.key(2**64 + 3).tolist() == [0, 3]


# --------------------------------------------------------------------------- statistics

N = 100_000


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_uniform_moments(dtype):
    u = R.uniform(R.key(42), (N,), dtype)
    assert u.dtype == dtype and u.shape == (N,)
    assert u.min().item() >= 0.0
    assert u.max().item() < 1.0
    x = u.to(torch.float64)
    mean_se = math.sqrt(1 / 12 / N)
    var_se = math.sqrt((1 / 80 - 1 / 144) / N)
    assert abs(x.mean().item() - 0.5) < 5 * mean_se
    assert abs(x.var().item() - 1 / 12) < 5 * var_se
    # Uses the whole unit interval, not a sliver of it.
    assert x.min().item() < 1e-3 and x.max().item() > 1 - 1e-2


def test_uniform_ks_float32():
    u = R.uniform(R.key(7), (N,), torch.float32)
    assert ks_statistic(u, lambda x: x.clamp(0, 1)) < ks_critical(N)


def test_uniform_ks_float64():
    u = R.uniform(R.key(8), (N,), torch.float64)
    assert ks_statistic(u, lambda x: x.clamp(0, 1)) < ks_critical(N)


def test_ks_detects_a_wrong_distribution():
    # The KS check is not a tautology: a squashed uniform or a scaled normal fails it.
    u = R.uniform(R.key(7), (N,), torch.float32) ** 1.05
    assert ks_statistic(u, lambda x: x.clamp(0, 1)) > ks_critical(N)
    z = 1.03 * R.normal(R.key(9), (N,))
    assert ks_statistic(z, torch.special.ndtr) > ks_critical(N)


def test_float64_uniform_uses_53_bits():
    u = R.uniform(R.key(3), (1000,), torch.float64)
    # float32-resolution values would all be multiples of 2**-24.
    frac = torch.frac(u * 2.0**24)
    assert (frac != 0).float().mean().item() > 0.9
    assert torch.equal(torch.frac(u * 2.0**53), torch.zeros_like(u))


def test_normal_ks_float32():
    z = R.normal(R.key(9), (N,), torch.float32)
    assert z.dtype == torch.float32
    assert ks_statistic(z, torch.special.ndtr) < ks_critical(N)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_normal_moments(dtype):
    z = R.normal(R.key(11), (N,), dtype)
    assert z.dtype == dtype and z.shape == (N,)
    x = z.to(torch.float64)
    assert torch.isfinite(x).all()
    m = x.mean().item()
    s = x.std().item()
    c = (x - m) / s
    skew = (c**3).mean().item()
    exkurt = (c**4).mean().item() - 3.0
    tol = 0.01 if dtype in (torch.float16, torch.bfloat16) else 0.0  # rounding of the draws
    assert abs(m) < 5 / math.sqrt(N)
    assert abs(s - 1.0) < 5 * math.sqrt(0.5 / N) + tol
    assert abs(skew) < 5 * math.sqrt(6 / N)
    assert abs(exkurt) < 5 * math.sqrt(24 / N) + 4 * tol
    # Tails reach out as far as a standard normal's do in 1e5 draws.
    assert 3.5 < x.abs().max().item() < 6.5


def test_normal_low_precision_rounds_float32():
    k = R.key(5)
    z32 = R.normal(k, (1000,), torch.float32)
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.equal(R.normal(k, (1000,), dtype), z32.to(dtype))


def test_normal_float64_uses_more_than_float32_bits():
    z = R.normal(R.key(5), (1000,), torch.float64)
    assert not torch.equal(z, z.to(torch.float32).to(torch.float64))


def _max_offdiag_corr(streams: torch.Tensor) -> float:
    c = torch.corrcoef(streams.to(torch.float64))
    c = c - torch.diag(torch.diag(c))
    return c.abs().max().item()


def test_split_streams_uncorrelated():
    keys = R.split(R.key(0), 64)
    n = 4096
    streams = torch.stack([R.uniform(k, (n,)) for k in keys])
    assert _max_offdiag_corr(streams) < 5.5 / math.sqrt(n)


def test_fold_in_consecutive_streams_uncorrelated():
    base = R.key(0)
    n = 4096
    streams = torch.stack([R.normal(R.fold_in(base, i), (n,)) for i in range(64)])
    assert _max_offdiag_corr(streams) < 5.5 / math.sqrt(n)
    # A parent stream is uncorrelated with its children's.
    parent = R.normal(base, (n,))
    for child in (R.fold_in(base, 0), R.split(base)[0]):
        r = torch.corrcoef(torch.stack([parent, R.normal(child, (n,))]))[0, 1]
        assert abs(r.item()) < 5 / math.sqrt(n)


def test_within_stream_uncorrelated():
    # Serial correlation, and between the two counter halves that share a Threefry block.
    n = 50_000
    u = R.uniform(R.key(17), (n,), torch.float64)
    for a, b in ((u[:-1], u[1:]), (u[: n // 2], u[n // 2 :])):
        r = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
        assert abs(r) < 5 / math.sqrt(a.numel())


def test_correlation_check_detects_dependence():
    # Guard against a vacuous correlation test: shared keys are perfectly correlated.
    k = R.key(0)
    streams = torch.stack([R.uniform(k, (4096,)), R.uniform(k, (4096,))])
    assert _max_offdiag_corr(streams) > 0.99


def test_many_keys_distinct():
    base = R.key(2024)
    splits = R.split(base, 1000)
    folds = R.fold_in(base, torch.arange(1000))
    for keys in (splits, folds):
        assert keys.shape == (1000, 2)
        assert len({tuple(k) for k in keys.tolist()}) == 1000
        assert tuple(base.tolist()) not in {tuple(k) for k in keys.tolist()}
    # Splitting the children again still gives no repeats.
    grandchildren = torch.cat([R.split(k, 4) for k in splits[:250]])
    everything = torch.cat([splits, folds, grandchildren]).tolist()
    assert len({tuple(k) for k in everything}) == len(everything)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_uniform_low_high(dtype):
    low, high = -3.0, 5.0
    u = R.uniform(R.key(1), (20_000,), dtype, low, high)
    assert u.dtype == dtype
    x = u.to(torch.float64)
    assert x.min().item() >= low and x.max().item() < high
    assert abs(x.mean().item() - 1.0) < 5 * 8 * math.sqrt(1 / 12 / 20_000)
    assert x.min().item() < -2.9 and x.max().item() > 4.9


def test_uniform_scalar_tensor_bounds():
    low, high = torch.tensor(-2.0), torch.tensor(-1.5)
    u = R.uniform(R.key(1), (100, 3), torch.float32, low, high)
    assert u.shape == (100, 3) and u.dtype == torch.float32
    assert (u >= low).all() and (u < high).all()
    assert torch.equal(u, R.uniform(R.key(1), (100, 3), torch.float32, -2.0, -1.5))


def test_uniform_tensor_bounds_broadcast():
    low = torch.tensor([0.0, 10.0, -5.0])
    high = torch.tensor([1.0, 20.0, -4.0])
    u = R.uniform(R.key(1), (1000, 3), torch.float32, low, high)
    assert u.shape == (1000, 3)
    assert (u >= low).all() and (u < high).all()


def test_uniform_is_affine_in_bounds():
    k = R.key(12)
    u = R.uniform(k, (100,), torch.float64)
    assert torch.allclose(R.uniform(k, (100,), torch.float64, 2.0, 6.0), 2.0 + 4.0 * u)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("float16", "bfloat16"))
def test_uniform_low_precision_stays_below_high(dtype):
    u = R.uniform(R.key(0), (100_000,), dtype, 1.0, 2.0)
    assert u.max().item() < 2.0


@pytest.mark.parametrize("dtype, low, high", [
    (torch.float64, -1e308, 1e308), (torch.float32, -3e38, 3e38), (torch.float16, -6e4, 6e4),
    (torch.bfloat16, -1e38, 3e38)], ids=["float64", "float32", "float16", "bfloat16"])
def test_uniform_spans_a_box_wider_than_the_dtype_reaches(dtype, low, high):
    """high - low past the dtype's largest value: the samples still fill [low, high)
    (the width overflowed to inf, and every sample folded onto low)."""
    u = R.uniform(R.key(3), (10_000,), dtype, low, high).double()
    assert torch.isfinite(u).all() and (u >= low).all() and (u < high).all()
    assert (u == low).double().mean() < 0.01 and u.min() < low / 2 and u.max() > high / 2


EXTREME_SEED = 10082300


@pytest.mark.parametrize("dtype", FLOATS[:3], ids=FLOAT_IDS[:3])
def test_normal_finite_at_largest_word(dtype):
    k = R.key(EXTREME_SEED)
    assert torch.isfinite(R.normal(k, (), dtype)).all()


def test_extreme_seed_has_largest_word():
    # Precondition of the test above: a scalar draw from
    # key(EXTREME_SEED) reads a word whose top 24 bits are all ones (found by search).
    assert (R.bits(R.key(EXTREME_SEED), 1).item() >> 8) == 2**24 - 1
    assert R.uniform(R.key(EXTREME_SEED)).item() == 1 - 2**-24


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("fn", ["uniform", "normal"])
def test_output_dtype(fn, dtype):
    out = getattr(R, fn)(R.key(0), (4, 3), dtype)
    assert out.dtype == dtype
    assert out.shape == (4, 3)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (5,), (2, 3), (2, 0, 3), (2, 3, 4), [3, 2]])
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=("float32", "float64"))
@pytest.mark.parametrize("fn", ["uniform", "normal"])
def test_shapes(fn, dtype, shape):
    out = getattr(R, fn)(R.key(3), shape, dtype)
    assert out.shape == torch.Size(shape)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()


def test_default_shape_is_scalar():
    assert R.uniform(R.key(0)).shape == ()
    assert R.normal(R.key(0)).shape == ()
    assert R.uniform(R.key(0)).dtype == torch.float32
    assert R.normal(R.key(0)).dtype == torch.float32


def test_scalar_draw_matches_first_element_of_bits_rule():
    # shape () and (1,) consume the same single word.
    k = R.key(99)
    assert torch.equal(R.normal(k, ()), R.normal(k, (1,))[0])
    assert torch.equal(R.uniform(k, (), torch.float64), R.uniform(k, (1,), torch.float64)[0])


def test_bits_odd_count_padding_matches_jax():
    # JAX pads an odd count with a zero counter: word 0 of bits(k, 1) is block(0, 0)[0].
    k = R.key(5)
    k0, k1 = k.tolist()
    assert R.bits(k, 1).tolist() == [ref_threefry2x32(k0, k1, 0, 0)[0]]
    # bits(k, 4) = block(0, 2) and block(1, 3), first words then second words.
    b = [ref_threefry2x32(k0, k1, 0, 2), ref_threefry2x32(k0, k1, 1, 3)]
    assert R.bits(k, 4).tolist() == [b[0][0], b[1][0], b[0][1], b[1][1]]


# --------------------------------------------------------------------------- determinism


def _every_call(k: torch.Tensor) -> list:
    return [
        R.split(k),
        R.split(k, 5),
        R.fold_in(k, 3),
        R.fold_in(k, torch.arange(6).reshape(2, 3)),
        R.bits(k, 7),
        *(R.uniform(k, (9,), dt) for dt in FLOATS),
        R.uniform(k, (4,), torch.float32, -1.0, 2.0),
        *(R.normal(k, (9,), dt) for dt in FLOATS),
        R.threefry2x32(k, torch.arange(4), torch.arange(4, 8)),
        R.tree_normal_like(k, {"a": torch.zeros(3), "b": [torch.ones(2, 2, dtype=torch.float64)]}),
    ]


def test_same_key_bitwise_same():
    a = optree.tree_leaves(_every_call(R.key(77)))
    b = optree.tree_leaves(_every_call(R.key(77)))
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)


def test_different_keys_different_outputs():
    a = optree.tree_leaves(_every_call(R.key(77)))
    b = optree.tree_leaves(_every_call(R.key(78)))
    for x, y in zip(a, b, strict=True):
        assert not torch.equal(x, y)


def test_global_rng_untouched():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    _every_call(R.key(5))
    R.key(6)
    assert torch.equal(torch.get_rng_state(), state)
    # Sanity: the check would notice a call into torch's global generator.
    torch.rand(1)
    assert not torch.equal(torch.get_rng_state(), state)


def test_global_seed_does_not_matter():
    torch.manual_seed(0)
    a = optree.tree_leaves(_every_call(R.key(5)))
    torch.manual_seed(1)
    torch.rand(10)
    b = optree.tree_leaves(_every_call(R.key(5)))
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_input_key_not_mutated():
    k = R.key(31337)
    before = k.clone()
    _every_call(k)
    assert torch.equal(k, before)
    data = torch.arange(5)
    R.fold_in(k, data)
    assert torch.equal(data, torch.arange(5))


# --------------------------------------------------------------------------- properties


@HYP
@given(seed=seeds)
def test_key_property(seed):
    k = R.key(seed)
    assert k.dtype == torch.int64 and k.shape == (2,)
    hi, lo = k.tolist()
    assert 0 <= hi <= M32 and 0 <= lo <= M32
    assert (hi << 32) | lo == seed


@HYP
@given(seed=seeds, num=st.integers(1, 16))
def test_split_property(seed, num):
    out = R.split(R.key(seed), num)
    assert out.dtype == torch.int64 and out.shape == (num, 2)
    assert out.min().item() >= 0 and out.max().item() <= M32


@HYP
@given(seed=seeds, data=words)
def test_fold_in_property(seed, data):
    k = R.key(seed)
    out = R.fold_in(k, data)
    assert out.dtype == torch.int64 and out.shape == (2,)
    assert out.min().item() >= 0 and out.max().item() <= M32
    assert tuple(out.tolist()) == ref_threefry2x32(*k.tolist(), 0, data)
    # Tensor datum (0-d) gives the same key as the int.
    assert torch.equal(R.fold_in(k, torch.tensor(data)), out)


@HYP
@given(seed=seeds, data=st.lists(words, min_size=1, max_size=12), rows=st.sampled_from([1, 0]))
def test_fold_in_tensor_equals_stacked_ints(seed, data, rows):
    k = R.key(seed)
    d = torch.tensor(data)
    expected = torch.stack([R.fold_in(k, i) for i in data])
    assert torch.equal(R.fold_in(k, d), expected)
    if rows and len(data) % 2 == 0:  # a 2-d datum keeps its shape
        out = R.fold_in(k, d.reshape(2, -1))
        assert out.shape == (2, len(data) // 2, 2)
        assert torch.equal(out.reshape(-1, 2), expected)


@HYP
@given(seed=seeds, num=st.integers(1, 65))
def test_bits_range(seed, num):
    out = R.bits(R.key(seed), num)
    assert out.dtype == torch.int64 and out.shape == (num,)
    assert out.min().item() >= 0 and out.max().item() <= M32


@HYP
@given(
    seed=seeds,
    shape=st.lists(st.integers(0, 4), max_size=3).map(tuple),
    dtype=st.sampled_from(FLOATS),
)
def test_uniform_normal_property(seed, shape, dtype):
    k = R.key(seed)
    u = R.uniform(k, shape, dtype)
    z = R.normal(k, shape, dtype)
    assert u.shape == z.shape == shape
    assert u.dtype == z.dtype == dtype
    assert ((u >= 0) & (u < 1)).all()
    assert torch.isfinite(z).all()


# --------------------------------------------------------------------------- vmap


def _loop(fn, *batched):
    return torch.stack([fn(*args) for args in zip(*batched, strict=True)])


def test_vmap_normal_over_keys():
    keys = R.split(R.key(0), 8)
    fn = lambda k: R.normal(k, (3,))  # noqa: E731
    out = torch.func.vmap(fn)(keys)
    assert out.shape == (8, 3)
    assert torch.equal(out, _loop(fn, keys))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=("float32", "float64"))
def test_vmap_uniform_over_keys(dtype):
    keys = R.split(R.key(1), 8)
    fn = lambda k: R.uniform(k, (2, 3), dtype, -1.0, 4.0)  # noqa: E731
    out = torch.func.vmap(fn)(keys)
    assert out.shape == (8, 2, 3) and out.dtype == dtype
    assert torch.equal(out, _loop(fn, keys))


def test_vmap_normal_float64_and_scalar_shape():
    keys = R.split(R.key(2), 8)
    for fn in (
        lambda k: R.normal(k, (), torch.float64),
        lambda k: R.normal(k, (5,), torch.float64),
    ):
        assert torch.equal(torch.func.vmap(fn)(keys), _loop(fn, keys))


def test_vmap_fold_in_over_data():
    k = R.key(3)
    steps = torch.arange(8) * 1000
    fn = lambda d: R.fold_in(k, d)  # noqa: E731
    out = torch.func.vmap(fn)(steps)
    assert out.shape == (8, 2)
    assert torch.equal(out, torch.stack([R.fold_in(k, int(s)) for s in steps]))


def test_vmap_fold_in_over_keys_and_data_then_draw():
    keys = R.split(R.key(4), 8)
    steps = torch.arange(8) + 100

    def fn(kk, d):
        return R.uniform(R.fold_in(kk, d), (4,))

    out = torch.func.vmap(fn)(keys, steps)
    assert torch.equal(out, _loop(fn, keys, steps))
    # Different data for the same key differ.
    same_key = torch.func.vmap(fn, in_dims=(None, 0))(keys[0], steps)
    assert len({tuple(r) for r in same_key.tolist()}) == 8


def test_vmap_split_and_bits():
    keys = R.split(R.key(5), 8)
    for fn in (lambda k: R.split(k, 3), lambda k: R.bits(k, 5)):
        assert torch.equal(torch.func.vmap(fn)(keys), _loop(fn, keys))


def test_nested_vmap():
    keys = R.split(R.key(6), 12).reshape(3, 4, 2)
    fn = lambda k: R.normal(k, (2,))  # noqa: E731
    out = torch.func.vmap(torch.func.vmap(fn))(keys)
    assert out.shape == (3, 4, 2)
    assert torch.equal(out.reshape(12, 2), _loop(fn, keys.reshape(12, 2)))


# --------------------------------------------------------------------------- torch.compile


def _compile_target(k, step):
    kk = R.fold_in(k, step)
    return (
        kk,
        R.uniform(kk, (8,), torch.float32, -2.0, 3.0),
        R.uniform(kk, (2, 3), torch.float64),
        R.normal(kk, (4, 2), torch.float32),
        R.normal(kk, (4,), torch.float64),
    )


STEPS = (0, 1, 123456)

# Inductor imports torch.utils.mkldnn, whose torch.jit.script_method warns on torch 2.13.
IGNORE_JIT_DEPRECATION = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
)


@pytest.fixture(scope="module")
def compiled_vs_eager():
    """One inductor compile (the slow part, tens of seconds on CPU) shared by the tests below."""
    torch.compiler.reset()
    compiled = torch.compile(_compile_target, fullgraph=True)
    k = R.key(2024)
    out = {}
    for i, step in enumerate(STEPS):
        s = torch.tensor(step)
        # Later steps must reuse the first graph: the step value is data, not a guard.
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            out[step] = (_compile_target(k, s), compiled(k, s))
    yield out
    torch.compiler.reset()


@pytest.mark.slow
@IGNORE_JIT_DEPRECATION
def test_compile_keys_uniform_and_cpu_normals_bitwise_equal_to_eager(compiled_vs_eager):
    for eager, got in compiled_vs_eager.values():
        for e, g in zip(eager[:3], got[:3], strict=True):
            assert g.dtype == e.dtype and g.shape == e.shape
            assert torch.equal(g, e)
        # On CPU the normals too: erfinv is an opaque op there, eager's own kernel (on GPU
        # inductor's erfinv may round one ulp differently).
        for e, g in zip(eager[3:], got[3:], strict=True):
            assert g.dtype == e.dtype and g.shape == e.shape
            assert torch.equal(g, e)
    # Different steps give different draws (the step is not constant-folded).
    draws = [got[1] for _, got in compiled_vs_eager.values()]
    assert not torch.equal(draws[0], draws[1])


@IGNORE_JIT_DEPRECATION
def test_compile_no_graph_breaks():
    torch.compiler.reset()
    explanation = torch._dynamo.explain(_compile_target)(R.key(1), torch.tensor(3))
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1
    torch.compiler.reset()


# --------------------------------------------------------------------------- pytrees


def _tree():
    return {
        "w": torch.zeros(3, 4),
        "b": (torch.zeros(5, dtype=torch.float64), [torch.zeros((), dtype=torch.float16)]),
        "c": [torch.zeros(2, 2, dtype=torch.bfloat16), torch.zeros(3, 4)],
    }


def test_tree_normal_like_structure():
    tree = _tree()
    out = R.tree_normal_like(R.key(0), tree)
    assert optree.tree_structure(out) == optree.tree_structure(tree)
    assert isinstance(out["b"], tuple) and isinstance(out["c"], list)
    for x, y in zip(optree.tree_leaves(tree), optree.tree_leaves(out), strict=True):
        assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
        assert torch.isfinite(y).all()


def test_tree_normal_like_leaves_differ():
    out = R.tree_normal_like(R.key(0), _tree())
    # "w" and "c"[1] share shape and dtype, yet draw differently.
    assert not torch.equal(out["w"], out["c"][1])
    leaves = optree.tree_leaves(out)
    firsts = [x.flatten()[0].item() for x in leaves]
    assert len(set(firsts)) == len(firsts)


def test_tree_normal_like_is_one_draw_sliced_in_leaf_order():
    k = R.key(9)
    tree = _tree()
    leaves = optree.tree_leaves(tree)
    flat = R.normal(k, (sum(x.numel() for x in leaves),), torch.float64)  # a float64 leaf
    out = optree.tree_leaves(R.tree_normal_like(k, tree))
    offset = 0
    for x, y in zip(leaves, out, strict=True):
        want = flat[offset : offset + x.numel()].reshape(x.shape).to(x.dtype)
        assert torch.equal(y, want)
        offset += x.numel()
    other = R.tree_normal_like(R.key(10), [torch.zeros(4)])[0]
    assert not torch.equal(R.tree_normal_like(k, [torch.zeros(4)])[0], other)


def test_tree_normal_like_dtype_override():
    k = R.key(8)
    tree = _tree()
    out = R.tree_normal_like(k, tree, torch.float64)
    assert optree.tree_structure(out) == optree.tree_structure(tree)
    flat = torch.cat([y.flatten() for y in optree.tree_leaves(out)])
    assert torch.equal(flat, R.normal(k, (flat.numel(),), torch.float64))
    for x, y in zip(optree.tree_leaves(tree), optree.tree_leaves(out), strict=True):
        assert y.dtype == torch.float64 and y.shape == x.shape
    kept = R.tree_normal_like(k, tree, None)
    assert [x.dtype for x in optree.tree_leaves(kept)] == [
        x.dtype for x in optree.tree_leaves(tree)
    ]


def test_tree_normal_like_deterministic_and_empty():
    k = R.key(4)
    a = optree.tree_leaves(R.tree_normal_like(k, _tree()))
    b = optree.tree_leaves(R.tree_normal_like(k, _tree()))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert R.tree_normal_like(k, {}) == {}


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("bad", [1.5, True, False, "3", None, torch.tensor(3)])
def test_key_rejects_non_int(bad):
    with pytest.raises(TypeError):
        R.key(bad)


@pytest.mark.parametrize("num", [0, -1, 2.0, True])
def test_split_rejects_bad_num(num):
    with pytest.raises(ValueError):
        R.split(R.key(0), num)


@pytest.mark.parametrize(
    "bad",
    [
        torch.tensor([0.0, 1.0]),
        torch.tensor([0, 1], dtype=torch.int32),
        torch.tensor([0, 1, 2]),
        torch.tensor(3),
        [0, 0],
    ],
    ids=["float", "int32", "len3", "scalar", "list"],
)
@pytest.mark.parametrize(
    "call",
    [
        lambda k: R.split(k),
        lambda k: R.fold_in(k, 1),
        lambda k: R.bits(k, 4),
        lambda k: R.uniform(k, (2,)),
        lambda k: R.normal(k, (2,)),
    ],
    ids=["split", "fold_in", "bits", "uniform", "normal"],
)
def test_bad_key_rejected(call, bad):
    with pytest.raises(TypeError, match="Expected a key"):
        call(bad)


@pytest.mark.parametrize(
    "dtype", [torch.int32, torch.int64, torch.bool], ids=["int32", "int64", "bool"]
)
def test_uniform_rejects_non_float_dtype(dtype):
    with pytest.raises(TypeError, match="floating dtype"):
        R.uniform(R.key(0), (2,), dtype)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize(
    "call",
    [lambda k: R.normal(k, (2,)), lambda k: R.fold_in(k, 1), lambda k: R.split(k)],
    ids=["normal", "fold_in", "split"],
)
def test_batched_key_without_vmap_rejected(call, n):
    with pytest.raises(TypeError, match="Expected a key"):
        call(R.split(R.key(0), n))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_normal_rejects_non_float_dtype(dtype):
    with pytest.raises(TypeError, match="floating dtype"):
        R.normal(R.key(0), (2,), dtype)


def test_fold_in_uses_high_bits_of_data():
    k = R.key(0)
    assert not torch.equal(R.fold_in(k, 2**32 + 5), R.fold_in(k, 5))


@pytest.mark.parametrize("data", [1.5, True, "1", torch.tensor(1.0), torch.tensor([True])],
                         ids=["float", "bool", "str", "float-tensor", "bool-tensor"])
def test_fold_in_rejects_data_that_is_not_an_integer(data):
    with pytest.raises(TypeError, match="fold_in takes an int or an integer tensor"):
        R.fold_in(R.key(0), data)


@pytest.mark.parametrize("low, high", [(1.0, 0.0), (math.nan, 1.0), (0.0, math.inf)],
                         ids=["reversed", "nan", "inf"])
def test_uniform_rejects_bad_number_bounds(low, high):
    with pytest.raises(ValueError, match=r"Invalid low, high: .*low <= high"):
        R.uniform(R.key(0), (3,), low=low, high=high)


def test_number_bounds_and_shapes_stay_compilable_and_numpy_ints_are_ints():
    k = R.key(0)
    draw = torch.compile(lambda key, low: R.uniform(key, (3,), torch.float32, low, 1.0),
                         fullgraph=True, backend="eager")
    for low in (-1.0, -2.0, -3.0):  # a float bound that varies becomes dynamic
        assert torch.equal(draw(k, low), R.uniform(k, (3,), torch.float32, low, 1.0))
    assert R.normal(k, (np.int64(3),)).shape == (3,)
    assert torch.equal(R.fold_in(k, np.int64(3)), R.fold_in(k, 3))


@pytest.mark.parametrize("shape", [5, (-1,), (2.0,), "3"],
                         ids=["int", "negative", "float", "str"])
@pytest.mark.parametrize("draw", [R.uniform, R.normal], ids=["uniform", "normal"])
def test_a_bad_shape_is_named(draw, shape):
    with pytest.raises(ValueError, match=r"Invalid shape: .*expected a tuple of ints >= 0"):
        draw(R.key(0), shape)


def test_the_numpy_kernel_chosen_at_run_time_gives_the_same_run():
    """FUNCTIONAL_BFO_CPU_KERNEL=numpy (read at import) selects the numpy kernel in an
    install that has the C one; an update's noise, hence the whole run, is bit for bit the
    same with either."""
    import os
    import subprocess
    import sys

    script = (
        "import torch, functional_bfo as fb\n"
        "opt = fb.adaptive_bfo(16, chemotaxis_steps=3)\n"
        "s = opt.init({'x': torch.linspace(-1, 1, 40)}, key=fb.random.key(4))\n"
        "for _ in range(7):\n"
        "    s = opt.update(s, lambda p: (p['x'] - 0.2).square().sum())\n"
        "print(fb.random.CPU_KERNEL, s.population.double().sum().item().hex(),\n"
        "      s.best_loss.item().hex(), s.step_sizes.double().sum().item().hex())\n")
    runs = {}
    for choice in ("numpy", ""):
        env = {**os.environ, "FUNCTIONAL_BFO_CPU_KERNEL": choice}
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        kernel, *values = out.stdout.split()
        runs[kernel] = values
    assert "numpy" in runs and runs.keys() <= {"numpy", "c"}
    assert len(set(map(tuple, runs.values()))) == 1
