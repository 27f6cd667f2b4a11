"""The black box's walker (``_black_box/walker.py``): CMA-ES's recombination, a learned metric."""

import math

import optree
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import functional_bfo as fb
from functional_bfo._black_box import walker
from functional_bfo._bounds import check_bounds, flat_box
from functional_bfo._layout import layout
from functional_bfo._metric import condition, isotropic

LAM, RATE, SIGMAS = 16, 2.0, (1e-12, 1.0)
COV = torch.tensor([[1.5, 0.4, 0.2], [0.4, 1.0, -0.3], [0.2, -0.3, 0.5]], dtype=torch.float64)


def fresh(n: int, step: float = 0.1, mean: float = 0.0, key: int = 0) -> walker.Walker:
    """A walker at ``mean`` in each coordinate, isotropic, unit widths."""
    x = torch.full((n,), mean, dtype=torch.float64)
    return walker.start(x, torch.tensor(step, dtype=torch.float64),
                        isotropic(torch.ones(n, dtype=torch.float64)),
                        torch.tensor(math.inf, dtype=torch.float64), fb.random.key(key),
                        torch.tensor(0))


def walk(w: walker.Walker, f, rounds: int, box=None) -> walker.Walker:
    for _ in range(rounds):
        z, rows = walker.draw(w, LAM, box, "reflect")
        w = walker.told(w, z, torch.stack([f(x) for x in rows]), 1.0, RATE, SIGMAS, box, "reflect")
    return w


def rotated_ellipsoid(n: int, conditioning: float):
    q = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(1),
                                    dtype=torch.float64))[0]
    scales = conditioning ** (torch.arange(n, dtype=torch.float64) / (n - 1))
    return q, lambda x: (scales * (q @ (x - 0.5)).square()).sum()


def test_the_walker_learns_a_rotated_valley_and_reaches_its_bottom():
    """From an isotropic metric on a rotated ellipsoid of condition 1e4: the metric
    stretches along the valley's flat axis and the walker reaches the 1e-10 floor."""
    q, f = rotated_ellipsoid(5, 1e4)
    w = walk(fresh(5), f, 250)
    assert float(f(w.mean)) < 1e-10 and float(w.best_loss) < 1e-10
    assert condition(w.metric) > 1e3
    flat = q[0]  # the axis of the smallest curvature
    top = torch.linalg.eigh(w.metric.cov).eigenvectors[:, -1]
    assert abs(float(top @ flat)) > 0.99


def test_the_step_size_grows_on_a_slope_and_shrinks_around_an_optimum():
    """Cumulative step-size adaptation: successive moves that point the same way lengthen
    the step; moves that cancel out shorten it."""
    slope = walk(fresh(4, step=1e-3), lambda x: x.sum(), 30)
    assert float(slope.sigma) > 10 * 1e-3 / 2
    bowl = walk(fresh(4, step=0.5), lambda x: x.square().sum(), 30)
    assert float(bowl.sigma) < 0.5 / 2 / 10


def test_a_walker_on_a_plateau_grows_its_step_to_see_past_it():
    """pycma's flat-fitness rule: rounds whose best ranks tie grow the step (on a flat loss
    every round does), where the path alone would let it shrink."""
    step = walk(fresh(4, step=1e-3), lambda x: x.sum() * 0, 10)
    assert float(step.sigma) > 10 * 1e-3 / 2


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=LAM, max_size=LAM),
       st.floats(1e-3, 1e3), st.floats(-1e6, 1e6))
def test_a_round_reads_only_the_ranks_of_its_costs(costs, scale, offset):
    """``a f + c`` moves the walker exactly as ``f`` does wherever rounding keeps the order;
    only the best loss it reports changes."""
    w = fresh(3)
    c, (z, _) = torch.tensor(costs, dtype=torch.float64), walker.draw(w, LAM, None, "reflect")
    assume(torch.equal(c.sort(stable=True).indices, (c * scale + offset).sort(stable=True).indices))
    plain = walker.told(w, z, c, 1.0, RATE, SIGMAS, None, "reflect")
    moved = walker.told(w, z, c * scale + offset, 1.0, RATE, SIGMAS, None, "reflect")
    same = [torch.equal(a, b) for a, b in zip(optree.tree_leaves(plain._replace(
        best_loss=moved.best_loss)), optree.tree_leaves(moved))]
    assert all(same)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 7))
def test_the_metric_stays_a_metric_whatever_the_costs(seed, n):
    """Random costs for 40 rounds, some never finite: C stays symmetric, trace n, with a
    factor that reproduces it; the step size stays in its range; nothing turns NaN."""
    w, g = fresh(n, key=seed), torch.Generator().manual_seed(seed)
    for _ in range(40):
        costs = torch.randn(LAM, generator=g, dtype=torch.float64)
        costs[torch.rand(LAM, generator=g) < 0.2] = math.inf
        w = walker.told(w, walker.draw(w, LAM, None, "reflect")[0], costs, 1.0, RATE, SIGMAS,
                        None, "reflect")
    cov = w.metric.cov
    assert torch.equal(cov, cov.T) and math.isclose(float(torch.trace(cov)), n, rel_tol=1e-9)
    assert torch.allclose(w.metric.factor @ w.metric.factor.T, cov, atol=1e-9)
    assert SIGMAS[0] / n**0.5 <= float(w.sigma) <= SIGMAS[1] / n**0.5
    assert all(bool(torch.isfinite(x).all()) for x in (w.mean, w.sigma_path, w.metric.path))


def test_a_walker_that_crosses_a_face_is_mirrored_back_into_the_box():
    """Candidates are reflected into the box. A mean pushed across the high face of
    coordinate 0 comes back mirrored, its metric and paths with it: the walker unbounded,
    reflected at the face (the same loss on either side)."""
    box = flat_box(check_bounds((-1.0, 1.0)), layout({"x": torch.zeros(3)}), torch.device("cpu"),
                   torch.float64)
    w = fresh(3, step=2.0, mean=0.9)
    w = w._replace(metric=w.metric._replace(cov=COV, factor=torch.linalg.cholesky(COV)))
    z, rows = walker.draw(w, LAM, box, "reflect")
    drawn = w.mean + w.sigma * z @ w.metric.factor.T * w.metric.width
    inside = drawn.abs() <= 1.0
    assert not bool(inside.all()) and bool((rows.abs() <= 1.0).all())
    assert torch.allclose(rows[inside], drawn[inside], rtol=0, atol=1e-15)
    costs = -z[:, 0]  # uphill against coordinate 0: over the face
    free = walker.told(w, z, costs, 1.0, RATE, (1e-12, 10.0), None, "reflect")
    boxed = walker.told(w, z, costs, 1.0, RATE, (1e-12, 10.0), box, "reflect")
    assert float(free.mean[0]) > 1.0  # inside, a reflection rounds in the last bit at most:
    assert torch.allclose(boxed.mean[1:], free.mean[1:], rtol=0, atol=1e-15)
    assert math.isclose(float(boxed.mean[0]), 2.0 - float(free.mean[0]), rel_tol=1e-12)
    flip = torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64)
    assert torch.equal(boxed.metric.cov, flip[:, None] * free.metric.cov * flip)
    assert torch.allclose(boxed.metric.factor @ boxed.metric.factor.T, boxed.metric.cov)
    assert torch.equal(boxed.metric.path, flip * free.metric.path)
    assert torch.equal(boxed.sigma_path, flip * free.sigma_path)
    assert torch.equal(boxed.sigma, free.sigma)
    small = fresh(3, step=1e-3)
    inside = walker.told(small, z, costs, 1.0, RATE, SIGMAS, box, "reflect")
    assert torch.equal(inside.metric.cov,
                       walker.told(small, z, costs, 1.0, RATE, SIGMAS, None, "reflect").metric.cov)


def test_the_weights_are_cma_es_defaults_with_an_active_worse_half():
    """Positive weights sum to 1 over the best half, the worse half's are negative, and the
    learning rates are the tutorial's scaled by the rate, within their bounds."""
    r = walker.rates(16, 10, 1.0)
    positive, negative = r.weights[:8], r.weights[8:]
    assert math.isclose(sum(positive), 1.0) and all(w > 0 for w in positive)
    assert all(w <= 0 for w in negative) and sum(negative) < 0
    assert math.isclose(r.c_1, 2 / (11.3**2 + r.mu_eff))
    doubled = walker.rates(16, 10, 2.0)
    assert math.isclose(doubled.c_1, 2 * r.c_1) and doubled.c_1 + doubled.c_mu <= 1
    with pytest.raises(ValueError, match="at least 4 points"):
        walker.rates(3, 10, 2.0)


def test_a_round_with_no_finite_loss_leaves_the_walker_where_it_was():
    """Nothing to rank: the mean, step, paths and metric stay; the round is counted, so
    the next one draws afresh."""
    w = fresh(4)
    z, _ = walker.draw(w, LAM, None, "reflect")
    w = walker.told(w, z, torch.randn(LAM, dtype=torch.float64), 1.0, RATE, SIGMAS, None,
                    "reflect")  # paths that are not 0
    z, _ = walker.draw(w, LAM, None, "reflect")
    failed = walker.told(w, z, torch.full((LAM,), math.inf, dtype=torch.float64), 1.0, RATE,
                         SIGMAS, None, "reflect")
    assert all(torch.equal(a, b) for a, b in zip(optree.tree_leaves(failed._replace(
        step=w.step, num_evals=w.num_evals)), optree.tree_leaves(w)))
    assert failed.step == w.step + 1 and failed.num_evals == w.num_evals + LAM
    assert not torch.equal(walker.draw(failed, LAM, None, "reflect")[0], z)


def test_a_kept_metric_keeps_its_scale():
    """Tied costs teach the metric nothing: C stays, and the step size moves by its path and
    the flat-fitness factor, not by the scale of the C it did not take."""
    w = fresh(4)
    z, _ = walker.draw(w, LAM, None, "reflect")
    tied = walker.told(w, z, torch.ones(LAM, dtype=torch.float64), 1.0, RATE, SIGMAS, None,
                       "reflect")
    r = walker.rates(LAM, 4, RATE)
    by_path = w.sigma * torch.exp(r.c_sigma / r.d_sigma * (tied.sigma_path.norm() / r.chi_n - 1))
    by_path = by_path * math.exp(0.2 + r.c_sigma / r.d_sigma)  # every rank ties: a plateau
    assert torch.equal(tied.metric.cov, w.metric.cov) and torch.equal(tied.sigma, by_path)
