"""AdaptiveBFO's own rules: step-size adaptation, elitist dispersal, stagnation counter."""

import math
import statistics

import pytest
import torch
from helpers import population
from hypothesis import given
from hypothesis import strategies as st

import functional_bfo as fb
from functional_bfo._population import reproduction_index


def sq(p):
    return (p["x"] - 0.3).square().sum()


def test_step_sizes_follow_the_one_fifth_rule():
    """Success multiplies a bacterium's step by e^a, failure by e^(-a/4), within the clip."""
    opt = fb.adaptive_bfo(population_size=6, adaptation_rate=0.4, step_size=0.1,
                          step_size_max=0.12, chemotaxis_steps=100)
    state = opt.update(opt.init({"x": torch.zeros(3)}, key=fb.random.key(0)), sq)
    before = state.step_sizes.clone()
    new = opt.update(state, sq)
    improved = new.losses < state.losses
    up = (before * torch.exp(torch.tensor(0.4))).clamp(max=0.12)
    down = before * torch.exp(torch.tensor(-0.1))
    torch.testing.assert_close(new.step_sizes, torch.where(improved, up, down))
    assert improved.any() and (~improved).any()


def test_on_a_plateau_bacteria_drift_and_their_steps_grow():
    """An equal loss is a move and a success (a (1+1)-ES accepting ties): on a flat region
    the steps grow until the bacteria see past it, instead of shrinking to the floor."""
    opt = fb.adaptive_bfo(population_size=6, adaptation_rate=0.4, step_size=0.01,
                          chemotaxis_steps=100)
    flat = lambda p: p["x"].sum() * 0.0  # noqa: E731
    state = opt.update(opt.init({"x": torch.zeros(3)}, key=fb.random.key(0)), flat)
    new = opt.update(state, flat)
    torch.testing.assert_close(new.step_sizes, state.step_sizes * torch.exp(torch.tensor(0.4)))
    moved = population(new)["x"] != population(state)["x"]
    assert bool(moved.any(dim=1).all())


def test_a_step_function_is_crossed_from_a_plateau_wider_than_the_step():
    """floor() is flat on unit cells; a swarm started inside one, with steps of 1e-3,
    reaches the lowest cell of the box only by drifting on the plateaus it crosses."""
    opt = fb.adaptive_bfo(population_size=4, step_size=1e-3, bounds=(-3.5, 3.5),
                          chemotaxis_steps=1000, elimination_prob=0.0,
                          elimination_prob_max=0.0)
    state = opt.init({"x": torch.full((2,), 2.5, dtype=torch.float64)}, key=fb.random.key(3))
    state = fb.run(opt, state, lambda p: p["x"].floor().sum(), max_steps=300)
    assert float(state.best_loss) == -8.0  # floor(-3.5) * 2


def test_first_update_keeps_initial_step_sizes():
    """Nothing was known before the first evaluation, so no success or failure is counted."""
    opt = fb.adaptive_bfo(population_size=4, step_size=0.05)
    state = opt.update(opt.init({"x": torch.zeros(2)}, key=fb.random.key(1)), sq)
    assert torch.equal(state.step_sizes, torch.full((4,), 0.05))


def test_greedy_swim_never_loses_a_bacteriums_position():
    opt = fb.adaptive_bfo(population_size=8, chemotaxis_steps=1000)
    state = opt.update(opt.init({"x": torch.zeros(4)}, key=fb.random.key(2)), sq)
    for _ in range(5):
        new = opt.update(state, sq)
        assert (new.losses <= state.losses).all()
        state = new


def test_dispersal_spares_the_leader_and_resets_step_sizes():
    opt = fb.adaptive_bfo(population_size=10, chemotaxis_steps=2, elimination_prob=1.0,
                          elimination_prob_max=1.0, step_size=0.2)
    state = opt.init({"x": torch.zeros(3)}, key=fb.random.key(3))
    state = opt.update(opt.update(state, sq), sq)  # step 2 is a reproduction boundary
    new = opt.update(state, sq)
    # Everyone but the leader was dispersed: they restart at step 0.2 and, having no known
    # loss to compare with, are not adapted; only the leader's step changed.
    assert int((new.step_sizes != 0.2).sum()) == 1
    assert torch.isfinite(new.losses).all()
    assert float(new.losses.min()) <= float(state.losses.min())


def test_stall_counts_updates_without_improvement():
    opt = fb.adaptive_bfo(population_size=4)
    state = opt.init({"x": torch.zeros(2)}, key=fb.random.key(4))
    flat = lambda p: p["x"].sum() * 0  # noqa: E731
    for expected in [0, 1, 2, 3]:
        state = opt.update(state, flat)
        assert int(state.stall) == expected


def test_hyperparameter_ranges_apply_to_with_hyperparams():
    state = fb.adaptive_bfo(population_size=4).init({"x": torch.zeros(2)}, key=fb.random.key(5))
    with pytest.raises(ValueError, match="Invalid adaptation_rate"):
        fb.with_hyperparams(state, adaptation_rate=-0.1)


@pytest.mark.slow
def test_defaults_beat_canonical_bfo_at_equal_budget():
    """The full comparison is benchmarks/quality.py (fb.bfo against fb.adaptive_bfo)."""
    def shifted(name):
        shift = torch.linspace(-1.0, 1.5, 5, dtype=torch.float64)
        if name == "sphere":
            return lambda p: (p["x"] - shift).square().sum()
        return lambda p: ((100 * ((p["x"] - shift + 1)[1:] - (p["x"] - shift + 1)[:-1] ** 2) ** 2)
                          + (shift - p["x"])[:-1] ** 2).sum()
    for name in ["sphere", "rosenbrock"]:
        medians = {}
        for factory in (fb.bfo, fb.adaptive_bfo):
            errors = []
            for seed in range(3):
                opt = factory(bounds=(-5.0, 5.0))
                state = opt.init({"x": torch.zeros(5, dtype=torch.float64)},
                                 key=fb.random.key(seed))
                errors.append(float(fb.run(opt, state, shifted(name), max_evals=5000).best_loss))
            medians[factory.__name__] = statistics.median(errors)
        assert medians["adaptive_bfo"] < medians["bfo"], (name, medians)


def test_varying_population_stays_in_range_counts_only_active_and_freezes_inactive():
    opt = fb.adaptive_bfo(population_size=16, min_population_size=4, chemotaxis_steps=2,
                          stagnation_steps=3, swim_length=2)
    state = opt.init({"x": torch.zeros(3)}, key=fb.random.key(6))
    sizes = []
    for _ in range(24):
        new = opt.update(state, sq)
        count = int(new.active_size)
        assert 4 <= count <= 16
        assert int(new.num_evals - state.num_evals) == count * 3
        inactive = torch.arange(16) >= max(count, int(state.active_size))
        assert torch.equal(population(new)["x"][inactive],
                           population(state)["x"][inactive])
        sizes.append(count)
        state = new
    assert min(sizes) < 16  # improving on a sphere shrinks the active population


def test_varying_population_grows_under_stagnation():
    opt = fb.adaptive_bfo(population_size=16, min_population_size=4, chemotaxis_steps=1,
                          stagnation_steps=1)
    state = opt.init({"x": torch.zeros(3)}, key=fb.random.key(7))
    state = fb.run(opt, state, sq, max_steps=12)  # shrinks while improving
    shrunk = int(state.active_size)
    flat = lambda p: p["x"].sum() * 0  # noqa: E731 (nothing ever improves: full pressure)
    state = fb.run(opt, state, flat, max_steps=6)
    assert int(state.active_size) > shrunk or shrunk == 16


def test_fixed_population_by_default():
    opt = fb.adaptive_bfo(population_size=6)
    state = fb.run(opt, opt.init({"x": torch.zeros(2)}, key=fb.random.key(8)), sq, max_steps=5)
    assert int(state.active_size) == 6
    with pytest.raises(ValueError, match="min_population_size"):
        fb.adaptive_bfo(population_size=6, min_population_size=7)


def test_run_never_exceeds_max_evals_with_a_growing_population():
    opt = fb.adaptive_bfo(population_size=16, min_population_size=2, chemotaxis_steps=1,
                          stagnation_steps=1, swim_length=1)
    flat = lambda p: p["x"].sum() * 0  # noqa: E731 (stalls at once: the population grows)
    state = fb.run(opt, opt.init({"x": torch.zeros(2)}, key=fb.random.key(10)), sq,
                   max_steps=8)  # improving shrinks it first
    costs, probe = [], state
    for _ in range(6):
        new = opt.update(probe, flat)
        costs.append(int(new.num_evals - probe.num_evals))
        probe = new
    k = next(i for i in range(5) if costs[i + 1] > costs[i])
    # After k + 1 updates exactly costs[k] evaluations remain, fewer than the next one costs.
    budget = int(state.num_evals) + sum(costs[: k + 1]) + costs[k]
    assert int(fb.run(opt, state, flat, max_evals=budget).num_evals) <= budget


def _trajectory(opt, params, loss, steps=12):
    state = opt.init(params, key=fb.random.key(7))
    out = []
    for _ in range(steps):
        state = opt.update(state, loss)
        out.append(state)
    return out


def test_relative_steps_equal_absolute_steps_scaled_by_the_box_width():
    """On a box of width 4, relative steps of 0.1 are absolute steps of 0.4, step for step."""
    sizes = dict(step_size=0.1, step_size_min=1e-3, step_size_max=0.5)
    relative = fb.adaptive_bfo(6, bounds=(-1.0, 3.0), relative_steps=True, **sizes)
    absolute = fb.adaptive_bfo(6, bounds=(-1.0, 3.0), **{k: 4 * v for k, v in sizes.items()})
    params = {"x": torch.zeros(3, dtype=torch.float64)}
    for r, a in zip(_trajectory(relative, params, sq), _trajectory(absolute, params, sq)):
        torch.testing.assert_close(population(r)["x"], population(a)["x"])
        torch.testing.assert_close(4 * r.step_sizes, a.step_sizes)
    assert not torch.equal(population(r)["x"], params["x"])  # it moved


def test_relative_steps_scale_each_leaf_and_coordinate_by_its_own_box():
    """Leaves with wide, narrow and open boxes: each coordinate moves on its own scale."""
    bounds = {"wide": (-600.0, 600.0), "narrow": (torch.tensor([0.0, 0.0]),
                                                  torch.tensor([1e-3, 1.0])),
              "open": (-float("inf"), float("inf"))}
    params = {"wide": torch.zeros(2, dtype=torch.float64),
              "narrow": torch.full((2,), 5e-4, dtype=torch.float64),
              "open": torch.zeros(2, dtype=torch.float64)}
    opt = fb.adaptive_bfo(64, bounds=bounds, relative_steps=True, step_size=0.01,
                          swim_length=1, chemotaxis_steps=1000)
    state = opt.init(params, key=fb.random.key(8))
    start = population(state)
    moved = opt.update(state, lambda p: -sum(x.sum() for x in p.values()))  # always improves
    # A bacterium's move along a coordinate is at most step_size x that coordinate's width.
    for name, width in [("wide", torch.tensor([1200.0, 1200.0])),
                        ("narrow", torch.tensor([1e-3, 1.0])), ("open", torch.ones(2))]:
        # bacterium 0 may be clipped
        step = (population(moved)[name] - start[name]).abs()[1:]
        limit = 0.01 * width.double() * 2  # the swim may take two steps of 0.01 x width
        assert (step <= limit * (1 + 1e-9)).all(), name
        assert (step.amax(0) > 0.1 * 0.01 * width.double()).all(), name


def test_hybrid_takes_relative_steps():
    opt = fb.hybrid_bfo(4, bounds=(-1.0, 1.0), relative_steps=True, grad_mask=True)
    state = opt.update(opt.init({"x": torch.zeros(2)}, key=fb.random.key(9)), sq)
    assert torch.isfinite(state.best_loss)


def test_the_ceiling_caps_initial_and_restarted_step_sizes():
    """``step_size_max`` wins: lowering it alone caps every step, dispersed ones included."""
    opt = fb.adaptive_bfo(population_size=8, step_size=0.5, step_size_max=0.01,
                          chemotaxis_steps=2, elimination_prob=1.0)
    state = opt.init({"x": torch.zeros(3)}, key=fb.random.key(6))
    assert torch.all(state.step_sizes == torch.tensor(0.01))
    state = fb.with_hyperparams(state, step_size_max=1e-3)
    for _ in range(5):  # two reproductions, every bacterium but the leader dispersed
        state = opt.update(state, lambda p: p["x"].square().sum())
        assert bool((state.step_sizes <= torch.tensor(1e-3)).all())


def test_a_learned_metric_runs_along_a_rotated_valley_where_isotropic_tumbles_crawl():
    """A 2-D ellipsoid of condition 1e4, rotated: same budget, same keys."""
    c, s = math.cos(0.6), math.sin(0.6)
    rotation = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    scales = torch.tensor([1.0, 1e4], dtype=torch.float64)

    def valley(p):
        y = rotation @ (p["x"] - 0.3)
        return (scales * y * y).sum() + 5.0

    def errors(metric_rate):
        opt = fb.adaptive_bfo(8, bounds=(-1.0, 1.0), relative_steps=True, swim_length=1,
                              step_size_min=1e-12, metric_rate=metric_rate)
        params = {"x": torch.zeros(2, dtype=torch.float64)}
        return [float(fb.run(opt, opt.init(params, key=fb.random.key(k)), valley,
                             max_evals=3000).best_loss) - 5.0 for k in range(3)]

    assert max(errors(2.0)) < 1e-7 < 1e-5 < min(errors(0.0))


def test_a_lone_bacterium_learns_a_valley_from_its_path_faster_than_a_swarm():
    """A rotated 5-D ellipsoid of condition 1e6: the (1+1)-CMA-ES's evolution path makes a
    lone bacterium's metric fit the valley within the budget; 8 bacteria, each success
    counted alone, are still crawling down it."""
    rotation = torch.linalg.qr(torch.randn(5, 5, generator=torch.Generator().manual_seed(1),
                                           dtype=torch.float64))[0]
    scales = torch.logspace(0, 6, 5, dtype=torch.float64)

    def valley(p):
        y = rotation @ (p["x"] - 0.3)
        return (scales * y * y).sum() + 5.0

    def errors(size):
        opt = fb.adaptive_bfo(size, bounds=(-1.0, 1.0), relative_steps=True, swim_length=1,
                              step_size_min=1e-12, metric_rate=2.0, elimination_prob=0.0,
                              elimination_prob_max=0.0)
        params = {"x": torch.zeros(5, dtype=torch.float64)}
        return [float(fb.run(opt, opt.init(params, key=fb.random.key(k)), valley,
                             max_evals=4000, target_loss=5.0 + 1e-9).best_loss) - 5.0
                for k in range(3)]

    assert max(errors(1)) < 1e-8 and min(errors(8)) > 1e-3


def test_the_metric_is_in_the_state_only_when_learned_and_limited_in_size():
    params = {"x": torch.zeros(3), "y": torch.zeros(2, 2)}
    none = fb.adaptive_bfo(4).init(params, key=fb.random.key(0)).metric  # of no coordinates
    assert none.cov.shape == (0, 0) and none.width.shape == (0,)
    learned = fb.adaptive_bfo(4, metric_rate=1.0, bounds={"x": (-1.0, 1.0), "y": (0.0, 4.0)},
                              relative_steps=True).init(params, key=fb.random.key(0))
    assert learned.metric.cov.shape == (7, 7) and learned.metric.cov.dtype == torch.float64
    assert learned.metric.width.tolist() == [2.0] * 3 + [4.0] * 4  # in box widths
    absolute = fb.adaptive_bfo(4, metric_rate=1.0, bounds=(-1.0, 1.0)).init(
        params, key=fb.random.key(0))
    assert absolute.metric.width.tolist() == [1.0] * 7
    with pytest.raises(ValueError, match="Invalid metric_rate: -1.0"):
        fb.adaptive_bfo(4, metric_rate=-1.0)
    with pytest.raises(ValueError, match="limited to 2000 parameters.*metric_rate=0"):
        fb.adaptive_bfo(4, metric_rate=1.0).init({"x": torch.zeros(2001)}, key=fb.random.key(0))
    with pytest.raises(TypeError, match="hybrid_bfo got metric_rate="):
        fb.hybrid_bfo(4, metric_rate=1.0)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=12), st.data())
def test_reproduction_over_the_active_slots_matches_a_slow_reference(healths, data):
    """The healthiest half of the first n slots survives and is copied onto the rest of them,
    ties by slot; slots past n keep themselves (ints as health, so ties happen)."""
    size = len(healths)
    active = data.draw(st.integers(1, size))
    ranked = sorted(range(active), key=lambda i: (healths[i], i))
    kept = active - active // 2
    want = [ranked[s] if s < kept else ranked[s - kept] if s < active else s
            for s in range(size)]
    health = torch.tensor(healths, dtype=torch.float32)
    got = reproduction_index(health, torch.tensor(True), torch.tensor(active))
    assert got.tolist() == want
    idle = reproduction_index(health, torch.tensor(False), torch.tensor(active))
    assert idle.tolist() == list(range(size))
