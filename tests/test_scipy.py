"""functional_bfo.adapters.scipy.minimize: the black box in scipy's calling convention."""

import numpy as np
import pytest
import torch
from scipy.optimize import Bounds, OptimizeResult

import functional_bfo as fb
from functional_bfo.adapters.scipy import minimize

BOX = [(-2.0, 2.0), (-1.0, 3.0), (-2.0, 2.0)]


def shifted(x, offset=10.0):
    """A rotated-free ellipsoid plus ``offset``, in numpy: the user's kind of function."""
    return float(np.sum(np.arange(1, 4) * (x - 0.4) ** 2)) + offset


def columns(X):
    """``shifted`` of each column of ``X`` (D, S), as a vectorized fun takes its points."""
    return np.array([shifted(X[:, j]) for j in range(X.shape[1])])


def test_it_is_the_black_box_run_of_the_same_key_bit_for_bit():
    res = minimize(shifted, np.zeros(3), BOX, maxfev=1500, seed=3)
    out = fb.black_box(lambda p: torch.tensor(shifted(p["x"].numpy()), dtype=torch.float64),
                       {"x": torch.zeros(3, dtype=torch.float64)},
                       (torch.tensor([b[0] for b in BOX]), torch.tensor([b[1] for b in BOX])),
                       max_evals=1500, key=fb.random.key(3), evaluator=fb.evaluate.loop())
    assert isinstance(res, OptimizeResult) and res.status == 0 and res.success
    assert res.fun == float(out.loss) and res.nfev == out.num_evals <= 1500
    assert np.array_equal(res.x, out.params["x"].numpy()) and res.nit == len(out.history)
    assert res.fun - 10.0 < 1e-6


def test_bounds_vectorized_and_workers_change_nothing_but_how_fun_is_called():
    plain = minimize(shifted, np.zeros(3), BOX, maxfev=600, seed=1)
    lows, highs = zip(*BOX)
    for other in (minimize(shifted, np.zeros(3), Bounds(lows, highs), maxfev=600, seed=1),
                  minimize(columns, np.zeros(3), BOX, maxfev=600, seed=1, vectorized=True),
                  minimize(shifted, np.zeros(3), BOX, maxfev=600, seed=1, workers=map),
                  minimize(shifted, np.zeros(3), BOX, maxfev=600, seed=1, workers=2)):
        assert other.fun == plain.fun and np.array_equal(other.x, plain.x)
        assert other.nfev == plain.nfev


@pytest.mark.parametrize("bounds", [[(-1.0, 2.0)], Bounds(-1.0, 2.0), Bounds([-np.inf], [2.0])],
                         ids=["pairs", "Bounds", "Bounds open below"])
def test_one_coordinate_is_minimized(bounds):
    """A 1-D box taken as numpy views (stride 2) hashed as other boxes are."""
    res = minimize(lambda x: float((x[0] - 0.4) ** 2) + 3.0, np.zeros(1), bounds, seed=0)
    assert res.success and res.x.shape == (1,) and res.nfev <= 2000 and res.fun - 3.0 < 1e-6


def test_args_reach_fun_and_the_default_budget_is_2000_per_coordinate():
    res = minimize(shifted, np.zeros(3), BOX, args=(-5.0,), seed=0)
    assert res.nfev <= 6000 and res.fun + 5.0 < 1e-8


def test_fun_errors_keep_their_type():
    def broken(x):
        raise KeyError("simulator down")

    with pytest.raises(KeyError, match="simulator down"):
        minimize(broken, np.zeros(3), BOX, maxfev=100, seed=0)


def test_nan_is_the_worst_and_none_finite_is_status_2():
    def half_nan(x):
        return np.nan if x[0] < 0 else shifted(x)

    res = minimize(half_nan, np.ones(3), BOX, maxfev=1500, seed=0)
    assert res.x[0] >= 0 and np.isfinite(res.fun) and res.fun - 10.0 < 1e-3
    none = minimize(lambda x: np.nan, np.zeros(3), BOX, maxfev=100, seed=0)
    assert none.status == 2 and not none.success and "NaN" in none.message


def test_a_callback_sees_every_round_and_stops_the_run():
    seen = []

    def callback(intermediate_result):
        seen.append(intermediate_result.nfev)
        if len(seen) == 5:
            raise StopIteration

    res = minimize(shifted, np.zeros(3), BOX, maxfev=1500, seed=0, callback=callback)
    assert res.status == 1 and res.success and res.nit == 5 and res.nfev == seen[-1]
    assert seen == sorted(seen)


def test_a_callback_not_named_intermediate_result_gets_the_best_x_as_scipy_gives_it():
    """scipy's rule: only ``callback(intermediate_result)`` gets the OptimizeResult; any
    other callback gets a copy of the best x so far (the legacy ``callback(xk)``)."""
    results, xs = [], []
    minimize(shifted, np.zeros(3), BOX, maxfev=300, seed=0,
             callback=lambda intermediate_result: results.append(intermediate_result))
    minimize(shifted, np.zeros(3), BOX, maxfev=300, seed=0, callback=xs.append)
    assert len(xs) == len(results) > 1 and all(isinstance(x, np.ndarray) for x in xs)
    assert all(np.array_equal(x, r.x) for x, r in zip(xs, results))


def test_the_forms_scipy_takes_run_as_their_plain_ones():
    """None for an open side, a scalar x0, a fun returning a one-element array, a numpy int
    seed; a Generator seed gives the same run twice."""
    def fun(x):
        return float((x[0] - 0.4) ** 2) + 3.0

    def run(f=fun, x0=(0.0,), bounds=((-np.inf, 2.0),), seed=3):
        return minimize(f, np.asarray(x0), bounds, maxfev=200, seed=seed)

    plain = run()
    for other in (run(bounds=[(None, 2.0)]), run(x0=0.0), run(f=lambda x: np.array([fun(x)])),
                  run(seed=np.int64(3))):
        assert np.array_equal(other.x, plain.x) and other.fun == plain.fun
    drawn = [run(seed=np.random.default_rng(7)) for _ in range(2)]
    assert np.array_equal(drawn[0].x, drawn[1].x) and drawn[0].nfev <= 200


@pytest.mark.parametrize("bounds, match", [
    (None, "needs bounds"), ([(-1, 1)] * 2, "expected 3 pairs"), ([-1, 1], "expected 3 pairs")])
def test_bad_bounds_are_named(bounds, match):
    with pytest.raises(ValueError, match=match):
        minimize(shifted, np.zeros(3), bounds)


def test_bad_workers_x0_and_fun_are_named():
    with pytest.raises(ValueError, match="Invalid workers"):
        minimize(shifted, np.zeros(3), BOX, workers=0)
    with pytest.raises(ValueError, match="Invalid x0"):
        minimize(shifted, np.zeros((3, 1)), BOX)
    with pytest.raises(TypeError, match="Invalid fun"):
        minimize("f", np.zeros(3), BOX)
    with pytest.raises(ValueError, match="vectorized fun returned shape"):
        minimize(lambda X: np.zeros(2), np.zeros(3), BOX, maxfev=100, vectorized=True)
