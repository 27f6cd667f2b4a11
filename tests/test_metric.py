"""AdaptiveBFO's learned tumble metric: invariants, no drift without selection, learning."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functional_bfo._bounds import leaf_bounds
from functional_bfo._metric import (
    TumbleMetric,
    condition,
    isotropic,
    learn,
    shape_directions,
    widths,
)


def random_metric(n: int, seed: int, width: float = 1.0) -> TumbleMetric:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    cov = a @ a.T + n * torch.eye(n, dtype=torch.float64)
    cov = 0.5 * (cov + cov.T)
    cov = cov * (n / torch.trace(cov))
    return TumbleMetric(cov, torch.linalg.cholesky(cov),
                        torch.full((n,), width, dtype=torch.float64),
                        torch.zeros(n, dtype=torch.float64))


def ones(n: int) -> torch.Tensor:
    return torch.ones(n, dtype=torch.float64)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 8), count=st.integers(0, 6), seed=st.integers(0, 10**6),
       rate=st.floats(0.0, 50.0), scale=st.floats(1e-6, 1e3))
def test_learn_keeps_a_symmetric_positive_definite_metric_of_trace_n(n, count, seed, rate,
                                                                      scale):
    metric = random_metric(n, seed, width=2.0)
    g = torch.Generator().manual_seed(seed + 1)
    moves = scale * torch.randn(6, n, generator=g, dtype=torch.float64)
    success = torch.arange(6) < count
    out = learn(metric, moves, success, rate, torch.ones(6, dtype=torch.bool))
    assert torch.equal(out.cov, out.cov.T)
    assert math.isclose(float(torch.trace(out.cov)), n, rel_tol=1e-9)
    assert torch.allclose(out.factor @ out.factor.T, out.cov, atol=1e-9)
    if count == 0:
        assert torch.equal(out.cov, metric.cov) and torch.equal(out.factor, metric.factor)
    if rate == 0:
        assert torch.allclose(out.cov, metric.cov, atol=1e-12)
    # Only the successful rows count: the others may be anything, even non-finite.
    junk = torch.where(success[:, None], moves, torch.nan)
    assert torch.equal(learn(metric, junk, success, rate, torch.ones(6, dtype=torch.bool)).cov,
                       out.cov)


def test_tumbles_drawn_from_the_metric_and_not_selected_leave_it_where_it_was():
    """Each move is rescaled to Mahalanobis length sqrt(n): unbiased for any move length."""
    n, metric = 4, random_metric(4, 0)
    g = torch.Generator().manual_seed(1)
    out, total, steps = metric, torch.zeros(n, n, dtype=torch.float64), 3000
    for _ in range(steps):
        z = torch.randn(2, n, generator=g, dtype=torch.float64)
        lengths = torch.rand(2, 1, generator=g, dtype=torch.float64) * 10  # any step length
        every = torch.ones(2, dtype=torch.bool)
        out = learn(out, lengths * (z @ metric.factor.T), every, 1.0, every)
        total += out.cov
    assert torch.allclose(total / steps, metric.cov, atol=0.05)  # wanders, does not drift


def test_successes_along_a_valley_stretch_the_metric_along_it():
    n = 3
    valley = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64) / 2**0.5
    g = torch.Generator().manual_seed(2)
    metric = isotropic(ones(n))
    for _ in range(200):
        signs = torch.randint(0, 2, (2, 1), generator=g).to(torch.float64) * 2 - 1
        noise = 0.05 * torch.randn(2, n, generator=g, dtype=torch.float64)
        every = torch.ones(2, dtype=torch.bool)
        metric = learn(metric, signs * valley + noise, every, 2.0, every)
    values, vectors = torch.linalg.eigh(metric.cov)
    assert float(values[-1] / values[0]) > 100
    assert abs(float(vectors[:, -1] @ valley)) > 0.99


def test_condition_is_the_eigenvalue_ratio_and_infinite_once_one_rounds_to_zero():
    """The valley test reads it: a metric rounded to singular is a valley, never a negative
    condition."""
    q = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(0),
                                    dtype=torch.float64))[0]
    cov = q @ torch.diag(torch.tensor([2.9, 0.05, 0.05], dtype=torch.float64)) @ q.T
    assert math.isclose(condition(TumbleMetric(cov, cov, ones(3), ones(3))), 58.0, rel_tol=1e-9)
    assert condition(isotropic(ones(4))) == 1.0
    for smallest in (0.0, -1e-17):
        flat = torch.diag(torch.tensor([2.0, 1.0, smallest], dtype=torch.float64))
        assert condition(TumbleMetric(flat, flat, ones(3), ones(3))) == math.inf


def test_directions_are_shaped_in_box_widths_and_keep_their_dtype():
    box = leaf_bounds(torch.tensor([-1.0, -1.0, 0.0]), torch.tensor([1.0, 1.0, math.inf]))
    width = widths(box, 3, torch.device("cpu"))
    assert width.tolist() == [2.0, 2.0, 1.0]
    direction = torch.tensor([[0.6, 0.0, 0.8], [0.0, 0.4, 0.3]])  # a row per bacterium
    same = shape_directions(isotropic(width), direction)
    assert torch.allclose(same, direction) and same.dtype == direction.dtype
    swap = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    swapped = shape_directions(TumbleMetric(swap @ swap.T, swap, width, width), direction)
    assert torch.allclose(swapped[:, :2], direction[:, :2].flip(1))  # A u swaps the two
    assert torch.allclose(swapped[:, 2], direction[:, 2])


def lone_walk(signs, known=None):
    """A lone bacterium's metric after successful steps along one axis, each of ``signs``."""
    axis = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    metric, yes = isotropic(ones(4)), torch.ones(1, dtype=torch.bool)
    for i, sign in enumerate(signs):
        kept = yes if known is None else torch.tensor([known[i]])
        metric = learn(metric, sign * axis, yes, 2.0, kept)
    return metric


def test_a_lone_bacteriums_steps_that_keep_their_way_stretch_the_metric_faster():
    """Its evolution path sums successive successes: steps along a valley add up, steps back
    and forth cancel. A swarm's rows count one by one, whatever their signs."""
    onward, back_and_forth = lone_walk([1.0] * 20), lone_walk([1.0, -1.0] * 10)
    assert condition(onward) > 5 * condition(back_and_forth)
    assert onward.path[0] > 3.0 and abs(float(back_and_forth.path[0])) < 2.0
    rows = torch.tensor([[1.0, 0.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    every = torch.ones(2, dtype=torch.bool)
    swarm = learn(isotropic(ones(4)), rows, every, 2.0, every)
    assert torch.equal(swarm.cov, learn(isotropic(ones(4)), rows.abs(), every, 2.0, every).cov)
    assert torch.equal(swarm.path, torch.zeros(4, dtype=torch.float64))  # a swarm has none


def test_a_dispersed_lone_bacterium_starts_a_new_path():
    """``known`` False (it was moved elsewhere): the steps before no longer add up, and the
    path is the new step alone, of Mahalanobis length ``sqrt(c (2 - c) n)``, c = 2 / (n + 2)."""
    before = lone_walk([1.0] * 19)

    def length(path):
        return float(torch.linalg.solve_triangular(before.factor, path[:, None], upper=False)
                     .norm())

    fresh = lone_walk([1.0] * 20, known=[True] * 19 + [False])
    c = 2 / 6
    assert math.isclose(length(fresh.path), (c * (2 - c) * 4) ** 0.5, rel_tol=1e-9)
    assert length(lone_walk([1.0] * 20).path) > 2 * length(fresh.path)
