"""functional_bfo.adapters.nevergrad: the black box in nevergrad's registry."""

import math
import warnings

import numpy as np
import pytest
import torch

ng = pytest.importorskip("nevergrad")
import functional_bfo as fb  # noqa: E402
from functional_bfo.adapters import nevergrad as adapter  # noqa: E402  registers BlackBoxBFO


def bowl(x):
    return float(np.sum(np.arange(1, len(x) + 1) * (x - 1.5) ** 2)) + 10  # minimum 10, not 0


def optimizer(param, seed=0, **kwargs):
    param.random_state.seed(seed)
    return ng.optimizers.registry["BlackBoxBFO"](param, **kwargs)


def test_it_is_registered_and_minimizes_within_its_budget():
    calls = []
    opt = optimizer(ng.p.Array(shape=(2,), lower=-5, upper=5), budget=800)
    best = opt.minimize(lambda x: calls.append(x) or bowl(x))
    assert len(calls) == 800 and opt.num_tell == 800
    assert bowl(best.value) - 10 < 1e-8
    assert isinstance(ng.optimizers.registry["BlackBoxBFO"], adapter.BlackBoxBFO)


def test_its_candidates_are_black_box_search_rows_on_the_unit_box_with_the_same_key():
    param = ng.p.Array(shape=(3,), lower=-2, upper=4)  # linear: x = -2 + 6 u
    opt = optimizer(param, seed=7, budget=300)
    told = []
    for _ in range(300):
        candidate = opt.ask()
        told.append(candidate.value.copy())
        opt.tell(candidate, bowl(candidate.value))
    search = fb.black_box_search((torch.zeros(3, dtype=torch.float64),
                                  torch.ones(3, dtype=torch.float64)), max_evals=300)
    key = fb.random.key(int(np.random.RandomState(7).randint(2**31)))
    state = search.init({"x": torch.full((3,), 0.5, dtype=torch.float64)}, key=key)
    rows = []
    while state.phase != "done":
        asked = search.ask(state)
        x = -2 + 6 * asked.params["x"].numpy()
        rows.extend(x[asked.mask.numpy()])
        losses = np.full(len(x), np.nan)
        losses[asked.mask.numpy()] = [bowl(r) for r in x[asked.mask.numpy()]]
        state = search.tell(state, asked, losses)
    np.testing.assert_allclose(told[:len(rows)], rows, rtol=0, atol=1e-12)


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    def run(seed):
        opt = optimizer(ng.p.Array(shape=(2,)), seed=seed, budget=200)
        return opt.minimize(bowl).value

    assert np.array_equal(run(1), run(1)) and not np.array_equal(run(1), run(2))


def test_num_workers_are_served_from_the_open_round_in_batches():
    opt = optimizer(ng.p.Array(shape=(3,), lower=-5, upper=5), budget=2000, num_workers=20)
    for _ in range(30):
        batch = [opt.ask() for _ in range(20)]
        for candidate in batch:
            opt.tell(candidate, bowl(candidate.value))
    assert opt._search is not None and opt.spares <= 2 * 20  # only past a faces round
    assert bowl(opt.recommend().value) - 10 < 1e-2


def away_from_the_left_face(x):
    return x[0] > -4


def test_a_cheap_constraint_is_a_worst_loss_not_a_stalled_round():
    """nevergrad asks again when a candidate breaks a cheap constraint: the rejected row is
    told as the worst, so its round ends and the search goes on (no spare points)."""
    param = ng.p.Array(shape=(2,), lower=-5, upper=5)
    param.register_cheap_constraint(away_from_the_left_face)
    opt = optimizer(param, budget=800)
    best = opt.minimize(bowl)
    assert opt.spares == 0 and bowl(best.value) - 10 < 1e-8 and best.value[0] > -4


def test_bounded_integer_and_unbounded_parameters_keep_their_domains():
    param = ng.p.Instrumentation(ng.p.Array(shape=(2,), lower=0, upper=1),
                                 ng.p.Scalar(lower=1, upper=9).set_integer_casting(),
                                 shift=ng.p.Scalar())
    opt = optimizer(param, budget=600)
    seen = []

    def loss(x, n, shift):
        seen.append((x, n, shift))
        return bowl(x) + (n - 4) ** 2 + (shift - 0.5) ** 2

    best = opt.minimize(loss)
    assert all(0 <= v <= 1 for x, _, _ in seen for v in x)
    assert all(isinstance(n, int) and 1 <= n <= 9 for _, n, _ in seen)
    assert best.args[1] == 4 and abs(best.kwargs["shift"] - 0.5) < 0.1


def test_the_closed_form_unit_map_is_nevergrads_normalizer():
    param = ng.p.Instrumentation(ng.p.Array(shape=(2,), lower=-3, upper=1), ng.p.Scalar(),
                                 rate=ng.p.Log(lower=1e-4, upper=1.0), n=ng.p.Array(shape=(2,)))
    normalizer = ng.p.helpers.Normalizer(param)
    to_data = adapter._unit_to_data(normalizer, param.dimension)
    units = np.random.default_rng(0).uniform(0.01, 0.99, size=(50, param.dimension))
    for unit in units:
        np.testing.assert_allclose(to_data(unit), normalizer.backward(unit), rtol=1e-9, atol=1e-9)


def test_nan_and_infinite_losses_are_the_worst():
    opt = optimizer(ng.p.Array(shape=(2,), lower=-5, upper=5), budget=500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ng.errors.BadLossWarning)
        best = opt.minimize(lambda x: math.nan if x[0] < 0 else (math.inf if x[1] < 0
                                                                else bowl(x)))
    assert bowl(best.value) - 10 < 1e-6


def test_a_budget_below_one_round_runs_that_round():
    opt = optimizer(ng.p.Array(shape=(2,), lower=-5, upper=5), budget=10)
    assert opt.minimize(bowl) is not None and opt.num_tell == 10


def test_a_spare_or_unasked_tell_leaves_the_search_alone():
    opt = optimizer(ng.p.Array(shape=(2,), lower=-5, upper=5), budget=400)
    first = opt.ask()
    opt.tell(opt.parametrization.spawn_child(new_value=np.zeros(2)), 3.0)  # never asked
    opt.tell(first, bowl(first.value))
    assert opt.num_tell == 2 and opt._state.num_evals == 0  # the round is not told yet
