"""fb.black_box: the black-box setup with restarts, driven to an evaluation budget."""

import functools
import itertools
import math

import numpy as np
import pytest
import torch
from helpers import assert_trees_equal, population
from hypothesis import given
from hypothesis import strategies as st

import functional_bfo as fb
from functional_bfo._black_box import search
from functional_bfo._metric import condition
from functional_bfo._state import to_dict


def shifted_sphere(p):
    return (p["x"] - 0.3).square().sum()


def start(dim=3):
    return {"x": torch.zeros(dim, dtype=torch.float64)}


def flat_loss(p):
    return p["x"].sum() * 0.0


def recording(loss):
    """``loss`` that also keeps every point it is called at, and the list it keeps them in."""
    seen = []

    def recorded(p):
        seen.append(p["x"].detach().clone())
        return loss(p)

    return recorded, seen


@given(budget=st.integers(1, 400), population=st.integers(1, 6), swims=st.integers(0, 2),
       restart_after=st.one_of(st.none(), st.integers(1, 5)),
       explore_after=st.one_of(st.none(), st.integers(1, 2)))
def test_never_exceeds_the_budget_and_counts_what_it_spent(budget, population, swims,
                                                           restart_after, explore_after):
    per_update = population * (swims + 1)
    settings = dict(max_evals=budget, key=fb.random.key(0), population_size=population,
                    swim_length=swims, restart_after=restart_after, explore_after=explore_after)
    if budget < per_update:
        with pytest.raises(ValueError, match=f"one update costs .* = {per_update} evaluations"):
            fb.black_box(shifted_sphere, start(2), (-1.0, 1.0), **settings)
        return
    out = fb.black_box(shifted_sphere, start(2), (-1.0, 1.0), **settings)
    assert out.num_evals <= budget < out.num_evals + per_update  # stops when no update fits
    evals = [0] + [e for e, _ in out.history]
    spent = [b - a for a, b in zip(evals, evals[1:])]
    # One entry per round: a swarm's or the walker's, a wide walker's (per_update << r at
    # restart r, at least 4), and at most two rounds of face moves.
    wide = {max(per_update << r, 4) for r in range(1, 64)}
    assert sum(n != per_update and n not in wide for n in spent) <= 2 and all(n > 0 for n in spent)
    losses = [loss for _, loss in out.history]
    assert losses == sorted(losses, reverse=True)  # the best never gets worse
    assert float(out.loss) == losses[-1] == float(shifted_sphere(out.params))


def test_without_restarts_it_is_fb_run_of_the_black_box_adaptive_bfo():
    key = fb.random.key(3)
    out = fb.black_box(shifted_sphere, start(), (-2.0, 2.0), max_evals=500, key=key,
                       restart_after=None, metric_rate=0.0, polish=0.0)
    opt = fb.adaptive_bfo(8, bounds=(-2.0, 2.0), relative_steps=True, swim_length=1,
                          step_size_min=1e-12)
    state = fb.run(opt, opt.init(start(), key=fb.random.fold_in(key, 0)), shifted_sphere,
                   max_evals=500)
    assert out.restarts == 0 and out.num_evals == int(state.num_evals)
    assert torch.equal(out.loss, state.best_loss)
    assert torch.equal(out.params["x"], state.best_params["x"])


def test_swarm_rounds_between_cycles_leave_the_events_out_with_the_same_states(monkeypatch):
    """Where a swarm's step ends no cycle, its round skips the masked reproduction and
    dispersal (``at_step``): every phase's states are those of the whole update."""
    search = fb.black_box_search((-2.0, 2.0), max_evals=2400, restart_after=3,
                                 explore_after=1).update.__self__
    state, phases, states = search.init(start(), key=fb.random.key(4)), set(), []
    while state.phase != "done":
        phases.add(state.phase)
        states.append(state)
        state = search.update(state, shifted_sphere)
    assert phases == {"converge", "explore", "faces", "polish"}
    monkeypatch.setattr("functional_bfo._black_box.search.at_step", lambda opt, step: opt)
    for before, after in zip(states, states[1:] + [state]):
        assert_trees_equal(search.update(before, shifted_sphere), after)


@pytest.mark.usefixtures("swarms_only")
def test_a_stalled_swarm_restarts_from_a_new_place_in_the_box():
    """Only the start scores 0, so the first swarm holds the best and lasts
    3 * restart_after + 1 updates; every later one is behind it and lasts restart_after + 1."""
    def only_the_start(p):
        return (p["x"].abs().sum() > 0).to(p["x"].dtype)

    scored, seen = recording(only_the_start)
    out = fb.black_box(scored, start(2), (-1.0, 1.0), max_evals=16 * 38, key=fb.random.key(1),
                       restart_after=1, explore_after=None, polish=0.0,
                       evaluator=fb.evaluate.loop())
    assert out.restarts == 1 + (38 - 4) // 2  # updates 1..4, then 5..6, 7..8, ...
    # Bacterium 0 of each swarm's first evaluation: the given start, then new uniform places.
    firsts = [tuple(seen[16 * (4 + 2 * (k - 1) if k else 0)].tolist())
              for k in range(out.restarts)]
    assert firsts[0] == (0.0, 0.0) and len(set(firsts)) == len(firsts)
    assert all(bool((x.abs() <= 1.0).all()) for x in seen)


@pytest.fixture
def swarms_only(monkeypatch):
    """No swarm finds a valley and no restart is a wide walker: a test of the swarms' rules."""
    monkeypatch.setattr(search, "VALLEY_CONDITION", math.inf)
    monkeypatch.setattr(search, "wide_restart", lambda restarts: False)


@pytest.mark.usefixtures("swarms_only")
def test_a_swarm_behind_the_best_stops_after_twice_the_evaluations_the_best_took():
    """An isotropic swarm gains a steady 1% of its way to the best on an ill-conditioned
    valley and would spend the budget catching up; it stops at 2x the best's evaluations."""
    rotation = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(0),
                                           dtype=torch.float64))[0]

    def valley(p):
        return (torch.logspace(0, 6, 8, dtype=torch.float64) * ((p["x"] - 0.3) @ rotation
                                                                ).square()).sum()

    opt = fb.black_box_search((-1.0, 1.0), max_evals=8000, metric_rate=0.0)  # isotropic
    state, ends = opt.init({"x": torch.rand(8, generator=torch.Generator().manual_seed(0),
                                            dtype=torch.float64) * 2 - 1},
                           key=fb.random.key(3)), []
    while state.phase != "done":
        before, state = state, opt.update(state, valley)
        if state.restarts != before.restarts:
            ends.append((before.progress > before.entry_best, int(before.swarm.num_evals),
                         before.found_after, before.stalled))
    per_round, restart_after = 8 * 2, 30  # the defaults: population_size * (swim_length + 1)
    behind = [(spent, found, stalled) for is_behind, spent, found, stalled in ends if is_behind]
    assert behind and all(found < spent <= 2 * found + per_round for spent, found, _ in behind)
    # progressing when it stopped: the stall rule would have waited longer
    assert any(stalled < restart_after * per_round for *_, stalled in behind)


def integer_valued(p):
    """A multimodal loss with integer values: f + c and a * f are exact in float64."""
    x = torch.round(p["x"] * 1024)
    return ((x.square() / 64).round() + (400 * (1 - torch.cos(x / 128))).round()).sum()


@pytest.mark.parametrize("change", [("+", -1000.0), ("+", 37.5), ("+", 1000.0), ("*", 0.25),
                                    ("*", 4.0)], ids=str)
def test_the_loss_offset_or_scale_changes_nothing(change):
    """Every decision compares losses: f, f + c and a * f give the same run, evaluation for
    evaluation (losses where the arithmetic is exact), through restarts, exploration, face
    moves and the polish."""
    op, value = change

    def moved(p):
        return integer_valued(p) + value if op == "+" else integer_valued(p) * value

    def undo(v):
        return v - value if op == "+" else v / value

    settings = dict(max_evals=6000, key=fb.random.key(3), restart_after=8)
    plain = fb.black_box(integer_valued, start(4), (-1.0, 1.0), **settings)
    other = fb.black_box(moved, start(4), (-1.0, 1.0), **settings)
    assert plain.restarts >= 2 and plain.explorer_updates > 0  # every phase is crossed
    assert (other.num_evals, other.restarts, other.explorer_updates) == (
        plain.num_evals, plain.restarts, plain.explorer_updates)
    assert torch.equal(other.params["x"], plain.params["x"])
    assert float(undo(other.loss)) == float(plain.loss)
    assert [(e, undo(v)) for e, v in other.history] == plain.history


ROTATION = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(0),
                                       dtype=torch.float64))[0]


def integer_valued_valley(p):
    """A rotated ellipsoid of condition 1e4 with integer values: its swarms find a valley."""
    x = torch.round((p["x"] - 0.3) * 1024) @ ROTATION
    return ((x.square() * torch.logspace(0, 4, 4, dtype=torch.float64)).sum() / 64).round()


@functools.cache
def valley_rounds(op="+", value=0.0):
    """Every round of a search on ``integer_valued_valley`` ``op`` ``value``, its best loss."""
    def loss_fn(p):
        return integer_valued_valley(p) + value if op == "+" else integer_valued_valley(p) * value

    opt = fb.black_box_search((-1.0, 1.0), max_evals=6000, restart_after=8)
    state, seen = opt.init(start(4), key=fb.random.key(3)), []
    while state.phase != "done":
        state = opt.update(state, loss_fn)
        seen.append((state.num_evals, state.restarts, state.phase, state.valley,
                     state.best_params["x"].tolist()))
    return seen, float(state.best_loss)


@pytest.mark.xdist_group("valley_rounds")  # one worker: the plain run is computed once
@pytest.mark.parametrize("change", [("+", 37.5), ("*", 4.0)], ids=str)
def test_the_loss_offset_or_scale_changes_nothing_in_a_valley(change):
    """A swarm's valley is read from its metric, learned from comparisons only: f + c and
    a * f find the same valleys and the same run."""
    op, value = change
    plain, best = valley_rounds()
    other, other_best = valley_rounds(op, value)
    spent = [int(e) - int(before) for (e, *_), (before, *_) in zip(plain, [(0,)] + plain)]
    assert sum(n for n, (*_, valley, _) in zip(spent, plain) if valley) > 500  # of 6000
    assert other == plain and (other_best - value if op == "+" else other_best / value) == best


@pytest.mark.xdist_group("valley_rounds")
def test_maximizing_minus_f_is_minimizing_f_in_a_valley_too():
    """Every rule reads costs (sign times the losses), the walker's included: maximizing -f
    takes the same rounds as minimizing f, its best loss the negated one."""
    plain, best = valley_rounds()
    opt = fb.black_box_search((-1.0, 1.0), max_evals=6000, restart_after=8, maximize=True)
    state, seen = opt.init(start(4), key=fb.random.key(3)), []
    while state.phase != "done":
        state = opt.update(state, lambda p: -integer_valued_valley(p))
        seen.append((state.num_evals, state.restarts, state.phase, state.valley,
                     state.best_params["x"].tolist()))
    assert seen == plain and -float(state.best_loss) == best


@pytest.mark.xdist_group("valley_rounds")
def test_ask_tell_runs_a_valley_as_update_does():
    """The walker's round asks for a whole swarm's rows (a wide walker's 16 << r at restart r),
    inside the box; told their losses, the pair goes through the valley as ``update`` does."""
    opt = fb.black_box_search((-1.0, 1.0), max_evals=6000, restart_after=8)
    state, seen, rows = opt.init(start(4), key=fb.random.key(3)), [], set()
    while state.phase != "done":
        asked = opt.ask(state)
        if state.valley and state.phase == "converge":  # the walker's round
            rows.add(len(asked.mask))
            assert asked.params["x"].abs().max() <= 1.0
        losses = [integer_valued_valley({"x": x}) for x in asked.params["x"]]
        state = opt.tell(state, asked, torch.stack(losses))
        seen.append((state.num_evals, state.restarts, state.phase, state.valley,
                     state.best_params["x"].tolist()))
    assert rows == {16, 32, 128} and seen == valley_rounds()[0]


def test_float32_params_are_searched_and_scored_in_float64():
    """Losses are compared in float64 whatever the params' dtype (f + 1000 in float32 keeps
    only 6e-5 of f); the loss sees its own dtype, inside the box rounded to it."""
    dtypes = []

    def loss(p):
        dtypes.append(p["x"].dtype)
        assert bool((p["x"].abs() <= 1.1).all())
        return (p["x"] - 0.3).square().sum() + 1000.0

    out = fb.black_box(loss, {"x": torch.zeros(3)}, (-1.1, 1.1), max_evals=3000,
                       key=fb.random.key(0), evaluator=fb.evaluate.loop())
    assert set(dtypes) == {torch.float32} and out.params["x"].dtype == torch.float32
    assert out.loss.dtype == torch.float64 and float(out.loss) - 1000.0 < 1e-7


@pytest.mark.parametrize("evaluator", [None, fb.evaluate.loop()])
def test_the_search_evaluates_a_float32_model_in_float32_inside_the_box(evaluator):
    """black_box_search's update, as fb.black_box, hands the loss its params in their own
    dtypes (a float64 population would not multiply a float32 model's data), inside the box
    rounded inward to them; its state keeps them in float64."""
    model = torch.nn.Linear(3, 1)
    x = torch.linspace(-1, 1, 30).reshape(10, 3)

    def loss(p):
        assert all(v.dtype == torch.float32 for v in p.values())
        if evaluator is not None:  # one bacterium at a time: its values can be read
            assert all(bool((v.abs() <= 1.1).all()) for v in p.values())
        return (torch.func.functional_call(model, p, (x,)) - 0.5 * x.sum(1, True)).square().mean()

    params = {k: v.detach() for k, v in model.named_parameters()}
    opt = fb.black_box_search((-1.1, 1.1), max_evals=1600, evaluator=evaluator)
    state = opt.init(params, key=fb.random.key(0))
    while state.phase != "done":
        state = opt.update(state, loss)
    assert state.best_params["weight"].dtype == torch.float64 and float(state.best_loss) < 1e-3


def test_same_key_same_result_and_maximize():
    a = fb.black_box(shifted_sphere, start(), (-1.0, 1.0), max_evals=300, key=fb.random.key(5))
    b = fb.black_box(shifted_sphere, start(), (-1.0, 1.0), max_evals=300, key=fb.random.key(5))
    assert torch.equal(a.params["x"], b.params["x"]) and a.history == b.history
    up = fb.black_box(lambda p: -shifted_sphere(p), start(), (-1.0, 1.0), max_evals=3000,
                      key=fb.random.key(5), maximize=True)
    assert float(up.loss) > -1e-5 and up.history[-1][1] == float(up.loss)


def test_reaches_the_precision_floor_on_a_shifted_sphere():
    out = fb.black_box(shifted_sphere, start(), (-1.0, 1.0), max_evals=6000,
                       key=fb.random.key(0))
    assert float(out.loss) < 1e-8 and out.num_evals <= 6000


@pytest.mark.parametrize("kwargs,match", [
    (dict(bounds=None), r"black_box needs bounds=\(low, high\)"),
    (dict(max_evals=0), r"Invalid max_evals: 0"),
    (dict(restart_after=0), r"Invalid restart_after: 0"),
    (dict(restart_rtol=-0.1), r"Invalid restart_rtol: -0.1"),
    (dict(population_size=0), r"Invalid population_size: 0"),
    (dict(metric_rate=-1.0), r"Invalid metric_rate: -1.0"),
    (dict(explore_after=0), r"Invalid explore_after: 0"),
    (dict(jitter=0.0), r"Invalid jitter: 0.0"),
    (dict(polish=1.5), r"Invalid polish: 1.5"),
])
def test_bad_settings_raise_clear_errors(kwargs, match):
    settings = dict(bounds=(-1.0, 1.0), max_evals=100, key=fb.random.key(0)) | kwargs
    bounds = settings.pop("bounds")
    with pytest.raises(ValueError, match=match):
        fb.black_box(shifted_sphere, start(), bounds, **settings)


@pytest.mark.parametrize("params,exc,match", [
    ({}, ValueError, r"params is an empty pytree"),
    ({"x": torch.zeros(2, dtype=torch.int64)}, TypeError, r"floating tensor leaf, got dtype"),
    ({"x": [0.0, 0.0]}, TypeError, r"Expected a tensor leaf, got 0\.0 at params\['x'\]\[0\]"),
], ids=["empty", "int64", "list"])
def test_bad_params_get_the_optimizers_errors(params, exc, match):
    with pytest.raises(exc, match=match):
        fb.black_box(shifted_sphere, params, (-1.0, 1.0), max_evals=100, key=fb.random.key(0))


def test_relative_steps_is_the_setups_own():
    with pytest.raises(TypeError, match=r"black_box got relative_steps=, which it sets itself"):
        fb.black_box(shifted_sphere, start(), (-1.0, 1.0), max_evals=100,
                     key=fb.random.key(0), relative_steps=False)


class Crash(Exception):
    pass


def test_a_failing_loss_keeps_its_type_and_hands_back_the_best_found():
    calls = []

    def crashing(p):  # vmapped: one call per batch of points
        calls.append(1)
        if len(calls) > 30:
            raise Crash("the simulator crashed")
        return shifted_sphere(p)
    with pytest.raises(Crash) as info:
        fb.black_box(crashing, start(), (-1.0, 1.0), max_evals=2000, key=fb.random.key(0))
    partial = info.value.partial_result
    assert 0 < partial.num_evals < 2000 and partial.history[-1][0] == partial.num_evals
    assert float(partial.loss) == partial.history[-1][1] < float(shifted_sphere(start()))
    assert float(shifted_sphere(partial.params)) == float(partial.loss)
    assert any(".partial_result" in note for note in info.value.__notes__)


def test_a_loss_that_is_never_finite_warns():
    with pytest.warns(RuntimeWarning, match=r"every loss evaluated \(96\) is NaN or infinite"):
        out = fb.black_box(lambda p: p["x"].sum() * math.nan, start(), (-1.0, 1.0),
                           max_evals=96, key=fb.random.key(0))
    assert math.isinf(float(out.loss))


def test_a_big_problem_needs_isotropic_tumbles():
    big = {"x": torch.zeros(2001, dtype=torch.float64)}
    with pytest.raises(ValueError, match="limited to 2000 parameters.*metric_rate=0"):
        fb.black_box(shifted_sphere, big, (-1.0, 1.0), max_evals=100, key=fb.random.key(0))
    out = fb.black_box(shifted_sphere, big, (-1.0, 1.0), max_evals=32, key=fb.random.key(0),
                       metric_rate=0.0)
    assert out.num_evals == 32


def ellipsoid(p):
    """A 2-D ellipsoid of condition 1e6, rotated by 45 degrees: a narrow diagonal valley."""
    u, v = (p["x"][0] + p["x"][1] - 0.2) / 2**0.5, (p["x"][0] - p["x"][1]) / 2**0.5
    return u.square() + 1e6 * v.square()


def test_the_learned_metric_follows_a_rotated_valley():
    """Isotropic tumbles crawl along the valley; the learned metric stretches along it."""
    def final_losses(**settings):
        opt = fb.black_box_search((-1.0, 1.0), max_evals=8000, explore_after=None, **settings)
        losses = []
        for k in range(3):
            state = opt.init(start(2), key=fb.random.key(k))
            while state.phase != "done" and float(state.best_loss) >= 1e-8:  # ends at 1e-8
                state = opt.update(state, ellipsoid)
            losses.append(float(state.best_loss))
        return losses

    assert max(final_losses()) < 1e-7 and min(final_losses(metric_rate=0.0)) > 1e-4


VALLEY_ROTATION = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(0),
                                               dtype=torch.float64))[0]


def rotated_valley(x):
    """A rotated 4-D ellipsoid of condition 1e6 plus 100, on rows of ``x``: the walker's."""
    y = (torch.as_tensor(x, dtype=torch.float64) - 1.0) @ VALLEY_ROTATION.T
    return ((10.0 ** (2 * torch.arange(4, dtype=torch.float64))) * y * y).sum(-1) + 100.0


def test_a_swarm_in_a_valley_goes_on_as_a_walker_from_its_best_bacterium_and_descends_it():
    """A rotated 4-D ellipsoid of condition 1e6 plus 100: once its metric finds the valley
    the swarm goes on as a walker from its best bacterium, with the metric, a whole swarm's
    evaluations a round, and reaches the bottom before its first restart."""
    def valley(p):
        return rotated_valley(p["x"])

    opt = fb.black_box_search((-5.0, 5.0), max_evals=8000)
    state = opt.init(start(4), key=fb.random.key(0))
    while not state.valley:
        before, state = state, opt.update(state, valley)
    walker = state.walker
    assert not before.valley and state.restarts == 0 and len(set(before.swarm.losses.tolist())) > 1
    # At the swarm's best bacterium (the one swarm so far holds the best), with its metric.
    assert float(walker.best_loss) == float(state.best_loss)
    assert math.isclose(float(valley({"x": walker.mean})), float(walker.best_loss), rel_tol=1e-12)
    assert condition(walker.metric) > search.VALLEY_CONDITION
    assert walker.num_evals == state.num_evals
    assert not walker.metric.path.any() and not walker.sigma_path.any() and walker.step == 0
    # Its progress is measured from its own start: the swarm's descent, its stall count
    # and its last gain (on the scale of the swarm's first updates) are not inherited.
    assert state.first == state.progress == float(walker.best_loss) and state.stalled == 0
    assert state.gain == 0.0 and before.gain > 0.0
    while state.restarts == 0:
        before, state = state, opt.update(state, valley)
        assert state.num_evals - before.num_evals == 16 or state.restarts == 1
    assert float(state.best_loss) - 100.0 < 1e-8
    assert float(state.best_loss) == float(before.walker.best_loss)
    # Never restarted, the walker holds the best when the polish starts: the polishing
    # swarm of 8 goes on with its metric.
    kept = fb.black_box_search((-5.0, 5.0), max_evals=2000, restart_after=None)
    state = kept.init(start(4), key=fb.random.key(0))
    while state.phase != "polish":
        was_walking, walker, state = bool(state.valley), state.walker, kept.update(state, valley)
    assert was_walking and not state.valley and len(set(state.swarm.step_sizes.tolist())) == 8
    assert torch.equal(state.swarm.metric.cov, walker.metric.cov)
    # With a varying population in the swarms, the walker's round is still a whole swarm's.
    varying = fb.black_box_search((-5.0, 5.0), max_evals=8000, min_population_size=4)
    state = varying.init(start(4), key=fb.random.key(0))
    while not state.valley:
        state = varying.update(state, valley)
    assert varying.update(state, valley).num_evals == state.num_evals + 16


@pytest.mark.parametrize("key", [0, 1])  # 1: a swarm finds a valley after a wide walker
@pytest.mark.parametrize("population, swims", [(1, 0), (2, 0), (3, 0)])
def test_a_swarm_whose_rounds_are_too_small_for_a_walker_goes_on_as_it_is(population, swims, key):
    """A walker recombines the best half of at least 4 points (a round of 1 would move it
    whatever it costs, rounds of 2 or 3 teach its metric nothing): a smaller swarm in a
    valley goes on as itself, a single bacterium following its evolution path."""
    def valley(p):
        return rotated_valley(p["x"])

    per_round = population * (swims + 1)
    opt = fb.black_box_search((-5.0, 5.0), max_evals=3000, population_size=population,
                              swim_length=swims)
    state, in_valley = opt.init(start(4), key=fb.random.key(key)), 0
    while state.phase != "done":
        before, state = state, opt.update(state, valley)
        if before.valley and before.phase == "converge" and not search.wide_restart(
                int(before.restarts)):
            in_valley += 1
            assert state.num_evals - before.num_evals == per_round  # no walker stepped
            assert state.walker.step == before.walker.step or state.restarts > before.restarts
    if population == 1:  # as the lone bacterium the black box ran before its walker
        assert in_valley > 100 and float(state.best_loss) - 100.0 < 1e-8


@pytest.mark.usefixtures("swarms_only")
def test_after_failed_restarts_the_exploring_swarm_takes_every_update():
    """On a flat loss no swarm beats the best: two failures in a row hand the budget over."""
    flat, seen = recording(flat_loss)
    settings = dict(key=fb.random.key(1), restart_after=4, evaluator=fb.evaluate.loop())
    out = fb.black_box(flat, start(2), (-1.0, 1.0), max_evals=16 * 100, polish=0.0, **settings)
    # Each swarm ties the best, so holds it, and lasts 3 * 4 + 1 updates. Swarm 1 sets the
    # best; swarm 2 (updates 14..26) fails to beat it, swarm 3 (27..39) too.
    assert out.restarts == 3 and out.explorer_updates == 100 - 39
    assert all(bool((x.abs() <= 1.0).all()) for x in seen)  # kicks are clipped to the box
    again = fb.black_box(flat, start(2), (-1.0, 1.0), max_evals=16 * 100, polish=0.0,
                         **settings)
    assert again.explorer_updates == out.explorer_updates and again.history == out.history
    # Polishing the last 10 updates: the converging swarm that holds the flat best takes
    # all of them; the explorer only had the 51 before.
    polished = fb.black_box(flat, start(2), (-1.0, 1.0), max_evals=16 * 100, polish=0.1,
                            **settings)
    assert polished.explorer_updates == 100 - 39 - 10


@pytest.mark.usefixtures("swarms_only")
def test_the_exploring_swarm_finds_lower_basins_than_restarts_on_rastrigin():
    """Rastrigin's big valley: kicked bacteria hop basins downhill; restarts only sample them."""
    def rastrigin(p):
        z = p["x"] - 1.3
        return 10 * z.numel() + (z.square() - 10 * torch.cos(2 * torch.pi * z)).sum()

    settings = dict(max_evals=2000 * 10, restart_after=30)
    box = (-5.12, 5.12)
    # Both share their first swarms, and with keys 0 and 2 the first swarms' best is the
    # best of both runs (they end equal); keys 1 and 3 are two where the runs part.
    explored = [float(fb.black_box(rastrigin, start(10), box, key=fb.random.key(k),
                                   explore_after=1, **settings).loss) for k in (1, 3)]
    restarted = [float(fb.black_box(rastrigin, start(10), box, key=fb.random.key(k),
                                    explore_after=None, **settings).loss) for k in (1, 3)]
    assert sum(explored) < sum(restarted)


def test_odd_restarts_are_wide_walkers_whose_rounds_double():
    """IPOP-CMA-ES's restart at odd restarts: an isotropic walker at the new uniform place,
    steps of 0.3 box widths a coordinate, rounds of 16 << r points. One that ends behind the
    best is no failure (the next is larger): the explorer waits for failed swarms."""
    def only_the_start(p):  # 0 at the start only: every later search ends behind the first
        return (p["x"].abs().sum() > 0).to(p["x"].dtype)

    opt = fb.black_box_search((-2.0, 2.0), max_evals=16 * 400, restart_after=2,
                              explore_after=3, polish=0.0)
    state, wide, failed = opt.init(start(3), key=fb.random.key(0)), {}, []
    while state.phase == "converge":
        before, state = state, opt.update(state, only_the_start)
        if state.restarts != before.restarts:
            failed.append(int(state.failed))
            if state.valley:
                w = state.walker
                assert torch.equal(w.metric.cov, torch.eye(3, dtype=torch.float64))
                assert torch.equal(w.mean, state.swarm.population[0]) and w.step == 0
                assert float(w.sigma) == 0.3 and bool((w.mean.abs() <= 2.0).all())
                if state.phase == "converge":  # the last one's rounds do not fit the budget
                    wide[int(state.restarts)] = len(opt.ask(state).mask)
    assert wide == {1: 32, 3: 128, 5: 512} and state.phase == "explore"
    assert failed == [0, 0, 1, 1, 2, 2, 3]  # swarms 2, 4 and 6 failed; the walkers did not


@pytest.mark.usefixtures("swarms_only")
def test_pytrees_open_sides_and_float32_go_through_the_metric_and_the_explorer():
    """Two leaves, one with an open side, in float32: every swarm kind keeps shapes and box."""
    params = {"w": torch.zeros(2, 3), "b": torch.zeros(4)}
    bounds = {"w": (-1.0, 1.0), "b": (torch.tensor(-2.0), torch.tensor(float("inf")))}

    def loss(p):
        return (p["w"] - 0.4).square().sum() + (p["b"] - 1.5).square().sum()

    out = fb.black_box(loss, params, bounds, max_evals=16 * 200, key=fb.random.key(0),
                       restart_after=3, explore_after=1)
    assert out.restarts >= 2 and out.explorer_updates > 0  # all three kinds of swarm ran
    assert out.params["w"].shape == (2, 3) and out.params["b"].shape == (4,)
    assert out.params["w"].dtype == out.params["b"].dtype == torch.float32
    assert out.loss.dtype == torch.float64  # losses are compared in float64
    assert bool((out.params["w"].abs() <= 1.0).all()) and bool((out.params["b"] >= -2.0).all())
    assert float(out.loss) < 5e-2


@pytest.mark.usefixtures("swarms_only")
def test_the_polish_goes_on_from_the_converging_swarm_that_holds_the_best():
    """Without restarts the one converging swarm holds the best: the polish goes on from it,
    its metric and counters kept, every bacterium gathered at the best, steps from jitter
    down over four decades, no dispersal."""
    opt = fb.black_box_search((-1.0, 1.0), max_evals=16 * 40, restart_after=None,
                              explore_after=None, polish=0.25)
    state = opt.init(start(2), key=fb.random.key(0))
    while state.phase != "polish":  # the converging swarm, then the face moves
        converging = state.swarm
        state = opt.update(state, shifted_sphere)
    polisher = state.swarm
    assert float(converging.best_loss) == float(state.best_loss)
    assert int(polisher.step) == int(converging.step) == 30 and state.swarm_learns
    assert torch.equal(polisher.metric.cov, converging.metric.cov)
    assert bool((population(polisher)["x"] == state.best_params["x"]).all())
    assert torch.allclose(polisher.step_sizes, 0.01 * torch.logspace(0, -4, 8, dtype=torch.float64))
    assert float(polisher.hyperparams.elimination_prob_max) == 0.0


@pytest.mark.usefixtures("swarms_only")
def test_a_best_the_converging_swarm_lost_is_polished_by_a_new_swarm():
    """A loss that drifts up with every call: no swarm after the first beats its early best,
    so the polish starts a new, isotropic swarm at the best rather than going on from the
    converging swarm, which does not hold it."""
    calls = []

    def drifting(p):
        calls.append(None)
        return shifted_sphere(p) + 1e-3 * len(calls)

    opt = fb.black_box_search((-1.0, 1.0), max_evals=16 * 40, restart_after=4,
                              explore_after=None, polish=0.25, evaluator=fb.evaluate.loop())
    state = opt.init(start(2), key=fb.random.key(0))
    while state.phase != "polish":
        state = opt.update(state, drifting)
    polisher = state.swarm
    assert state.restarts > 1 and int(polisher.step) == 0 and not state.swarm_learns
    assert bool((population(polisher)["x"] == state.best_params["x"]).all())
    assert float(polisher.hyperparams.elimination_prob_max) == 0.0


@pytest.mark.usefixtures("swarms_only")
def test_a_best_no_swarm_holds_is_polished_by_a_swarm_started_there():
    """The face moves put the best exactly on the corner (1, 1), where no swarm is: the last
    quarter polishes from there, each bacterium's first tumble as long as its step."""
    loss, calls = recording(lambda p: (p["x"] - 1.0).square().sum())
    out = fb.black_box(loss, start(2), (-1.0, 1.0), max_evals=16 * 40, key=fb.random.key(0),
                       restart_after=4, explore_after=None, polish=0.25,
                       evaluator=fb.evaluate.loop())
    # 30 updates, 5 face moves (2 coordinates on 2 faces, then the 2 that helped), 9 polishing.
    assert out.num_evals == 16 * 39 + 5 and len(out.history) == 41
    assert torch.equal(out.params["x"], torch.ones(2, dtype=torch.float64))
    tumbles = torch.stack(calls[16 * 30 + 5:16 * 30 + 13])
    steps = 0.01 * torch.logspace(0, -4, 8, dtype=torch.float64) * 2  # box widths (width 2)
    reach = (tumbles - out.params["x"]).norm(dim=1)
    assert torch.allclose(reach, steps, rtol=1e-9)  # a unit tumble, inside the box


def test_an_explorer_kick_moves_even_bacteria_a_little_and_odd_ones_along_one_coordinate():
    from functional_bfo._black_box.moves import kicked
    from functional_bfo._bounds import flat_box
    from functional_bfo._layout import layout

    params = {"w": torch.zeros(3, 2, dtype=torch.float64), "b": torch.zeros(2, dtype=torch.float64)}
    bounds = {"w": (-2.0, 2.0), "b": (torch.tensor(-1.0), torch.tensor(float("inf")))}
    opt = fb.adaptive_bfo(8, bounds=bounds, relative_steps=True)
    box = flat_box(bounds, layout(params), torch.device("cpu"))
    state = opt.init(params, key=fb.random.key(3))
    before = state.population  # a row is b's 2 coordinates, then w's 6
    seen_open_redraw, odd_moves = False, 0
    for updates in range(1, 40):
        out = kicked(state, box, 0.01, fb.random.fold_in(fb.random.key(3), updates))
        after = out.population
        moved = after != before
        # Gaussian kick: every boxed coordinate moves, by a few hundredths of the width.
        assert bool(moved[0::2, 2:].all())
        assert bool(((after - before)[0::2, 2:].abs() <= 6 * 0.01 * 4).all())
        # One coordinate per odd bacterium (none when a kick on "b" is clipped at -1).
        assert bool((moved[1::2].sum(dim=1) <= 1).all())
        odd_moves += int(moved[1::2].any(dim=1).sum())
        assert bool((after[:, 2:].abs() <= 2.0).all()) and bool((after[:, :2] >= -1.0).all())
        # An open-sided coordinate ("b") is kicked, not redrawn: it stays near where it was.
        assert bool(((after - before)[1::2, :2].abs() <= 6 * 0.01).all())
        seen_open_redraw |= bool(moved[1::2, :2].any())
        assert torch.isnan(out.losses).all()
    assert seen_open_redraw  # the open coordinates were picked sometimes
    assert odd_moves >= 0.9 * 39 * 4


def corner_slope(p):
    """A linear slope whose minimum, 0, is the corner (1, -1, 1, -1) of the box [-1, 1]^4."""
    slope = torch.tensor([1.0, -3.0, 10.0, -30.0], dtype=p["x"].dtype)
    return (slope * (slope.sign() - p["x"])).sum()


@pytest.mark.parametrize("boundary", ["reflect", "clip"])
def test_an_optimum_on_the_boundary_is_found_exactly(boundary):
    """Tumbles only hover near a face; when polishing starts, each coordinate of the best
    point is tried on each face, and the moves that helped together: the corner's loss is
    exactly 0."""
    out = fb.black_box(corner_slope, start(4), (-1.0, 1.0), max_evals=16 * 200,
                       key=fb.random.key(0), boundary=boundary)
    assert float(out.loss) == 0.0
    assert out.params["x"].tolist() == [1.0, -1.0, 1.0, -1.0]


def test_the_face_moves_are_evaluated_once_within_the_budget():
    """At most two rounds when polishing starts (the single-coordinate face moves, their
    union), counted in num_evals, a history entry each; before them a swarm's or the
    walker's rounds (16 evaluations), after them the polishing swarm's."""
    loss, seen = recording(corner_slope)
    budget = 16 * 50 + 7
    out = fb.black_box(loss, start(4), (-1.0, 1.0), max_evals=budget, key=fb.random.key(0),
                       evaluator=fb.evaluate.loop())
    assert len(seen) == out.num_evals <= budget
    evals = [0] + [e for e, _ in out.history]
    spent = [b - a for a, b in zip(evals, evals[1:])]
    polish = budget - 16 * int(0.1 * budget / 16)
    k = next(j for j, e in enumerate(evals) if e + 16 > polish)  # when polishing starts
    moves = list(itertools.takewhile(lambda j: spent[j] != 16, range(k, len(spent))))
    assert set(spent[:k]) == {16} and set(spent[k + len(moves):]) == {16}
    assert 1 <= len(moves) <= 2 and sum(spent[j] for j in moves) <= 2 * 4 + 1
    moved = torch.stack(seen[evals[k]:evals[moves[-1] + 1]])
    # Every candidate puts at least one coordinate exactly on a face.
    assert bool((moved.abs() == 1.0).any(dim=1).all())


def test_face_moves_cut_short_by_their_room_have_no_union():
    """With more single moves than a tenth of the polish, the first ones fill the room and
    no union follows: it would combine moves some of which were never tried."""
    def slope(p):
        return (1.0 - p["x"]).sum()  # minimum at the corner of ones

    loss, seen = recording(slope)
    out = fb.black_box(loss, start(30), (-1.0, 1.0), max_evals=16 * 50, key=fb.random.key(0),
                       evaluator=fb.evaluate.loop())
    evals = [0] + [e for e, _ in out.history]
    spent = [b - a for a, b in zip(evals, evals[1:])]
    assert [n for n in spent if n != 16] == [8]  # room: a tenth of the 80 polishing evals
    k = spent.index(8)
    assert evals[k] + 16 > 16 * 45 and out.num_evals == 16 * 50 - 8  # then polish updates
    moved = torch.stack(seen[evals[k]:evals[k] + 8])
    assert bool(((moved.abs() == 1.0).sum(dim=1) >= 1).all())


def test_a_coordinate_on_the_far_face_is_moved_over_and_helping_moves_are_combined():
    """From (1, 1, 1, -0.2) the corner (1, -1, 1, -1) needs coordinate 1 moved across the
    box and coordinate 3 to a face: two single moves and their union do."""
    from functional_bfo._black_box.moves import face_moves, face_union, moved

    x = torch.tensor([1.0, 1.0, 1.0, -0.2], dtype=torch.float64)
    low, high = -torch.ones(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    which = face_moves(x, low, high)  # (face, coordinate): 0 is the low face
    assert which.tolist() == [[0, 0], [0, 1], [0, 2], [0, 3], [1, 3]]
    rows = moved(x, low, high, which)
    assert rows[1].tolist() == [1.0, -1.0, 1.0, -0.2] and rows[4].tolist() == [1, 1, 1, 1]
    costs = torch.full((2, 4), torch.inf, dtype=torch.float64)
    costs[which[:, 0], which[:, 1]] = torch.stack([corner_slope({"x": r}) for r in rows])
    union = face_union(x, low, high, costs, corner_slope({"x": x}))
    assert union.tolist() == [[1.0, -1.0, 1.0, -1.0]] and float(corner_slope({"x": union[0]})) == 0
    none = face_union(x, low, high, costs, torch.tensor(0.0, dtype=torch.float64))
    assert none.shape == (0, 4)  # none helped: no row


def test_no_face_moves_on_open_sides_or_at_an_infinite_best():
    """Open coordinates never move; a best that is not finite is not moved at all."""
    from functional_bfo._black_box.moves import face_moves, moved

    x = torch.tensor([0.0, 0.0, 0.999, 0.0], dtype=torch.float64)
    low = torch.tensor([-torch.inf, -torch.inf, -1.0, -1.0], dtype=torch.float64)
    high = torch.tensor([torch.inf, torch.inf, 1.0, 1.0], dtype=torch.float64)
    which = face_moves(x, low, high)
    rows = moved(x, low, high, which)
    assert which[:, 1].tolist() == [2, 3, 2, 3] and rows[:, :2].eq(0).all()
    with pytest.warns(RuntimeWarning, match="NaN or infinite"):
        out = fb.black_box(lambda p: p["x"].sum() * math.nan, start(), (-1.0, 1.0),
                           max_evals=16 * 20, key=fb.random.key(0))
    assert out.num_evals == 16 * 20 and all(e % 16 == 0 for e, _ in out.history)


def test_progress_shows_a_bar_and_a_summary(capsys):
    pytest.importorskip("tqdm")
    fb.black_box(shifted_sphere, start(), (-1.0, 1.0), max_evals=800, key=fb.random.key(0),
                 progress=True)
    out = capsys.readouterr()
    assert "evals" in out.err and "best=" in out.err
    assert out.out.startswith("stopped by max_evals after")


def numpy_losses(asked, offset=0.0):
    """The integer-valued loss of every row, computed in numpy (an outside objective)."""
    x = np.round(asked.params["x"].cpu().numpy() * 1024)
    return (np.round(x**2 / 64) + np.round(400 * (1 - np.cos(x / 128)))).sum(axis=1) + offset


def test_ask_tell_is_the_black_box_with_restarts_inside_tell():
    """Losses from numpy through ask/tell give fb.black_box's run, round for round, through
    restarts, the explorer, the face moves and the polish; the state is left as it was."""
    settings = dict(max_evals=6000, restart_after=8)
    out = fb.black_box(integer_valued, start(4), (-1.0, 1.0), key=fb.random.key(3), **settings)
    opt = fb.black_box_search((-1.0, 1.0), **settings)
    state, phases, history = opt.init(start(4), key=fb.random.key(3)), set(), []
    while state.phase != "done":
        phases.add(state.phase)
        asked = opt.ask(state)
        assert torch.equal(opt.ask(state).params["x"], asked.params["x"])  # ask is pure
        before = state.best_params["x"].clone()
        new = opt.tell(state, asked, numpy_losses(asked, offset=-37.5))
        assert torch.equal(state.best_params["x"], before)  # tell left its input alone
        state = new
        history.append((state.num_evals, float(state.best_loss) + 37.5))
    assert phases == {"converge", "explore", "faces", "polish"}
    assert (state.num_evals, state.restarts, state.explorer_updates) == (
        out.num_evals, out.restarts, out.explorer_updates) and history == out.history
    assert torch.equal(state.best_params["x"], out.params["x"])
    with pytest.raises(ValueError, match="has spent its budget"):
        opt.ask(state)


def test_tell_refuses_another_rounds_answer():
    opt = fb.black_box_search((-1.0, 1.0), max_evals=1000)
    state = opt.init(start(2), key=fb.random.key(0))
    stale = opt.ask(state)
    state = opt.tell(state, stale, numpy_losses(stale))
    stale_answer = r"asked answers the round of update 0, but the state has made 1 updates"
    with pytest.raises(ValueError, match=stale_answer):
        opt.tell(state, stale, numpy_losses(stale))
    with pytest.raises(TypeError, match=r"takes the Ask that black_box_search.ask\(state\)"):
        opt.tell(state, stale.params, numpy_losses(stale))
    with pytest.raises(ValueError, match=r"Invalid losses: shape \(3,\)"):
        opt.tell(state, opt.ask(state), [1.0, 2.0, 3.0])
    asked = opt.ask(state)  # two histories from one state: an Ask of one is not the other's
    one = opt.tell(state, asked, numpy_losses(asked))
    other = opt.tell(state, asked, numpy_losses(asked) + np.arange(16.0))
    with pytest.raises(ValueError, match="asked comes from another state"):
        opt.tell(other, opt.ask(one), numpy_losses(opt.ask(one)))


def test_a_round_of_another_size_is_refused_even_unchecked_and_done_is_done():
    opt = fb.black_box_search((-1.0, 1.0), max_evals=16 * 10, polish=0.5)
    state = opt.init(start(2), key=fb.random.key(0))
    swarm_ask = opt.ask(state)
    while state.phase != "faces":
        state = opt.tell(state, opt.ask(state), numpy_losses(opt.ask(state)))
    with pytest.raises(ValueError, match=r"asked has 16 rows, but the state's round .* \(faces\)"):
        opt.tell(state, swarm_ask, numpy_losses(swarm_ask), check=False)
    with pytest.raises(ValueError, match="answers the round of update 0, but the state has made"):
        opt.tell(state, swarm_ask, numpy_losses(swarm_ask))  # a stale answer is named as one
    while state.phase != "done":
        state = opt.tell(state, opt.ask(state), numpy_losses(opt.ask(state)))
    with pytest.raises(ValueError, match="has spent its budget"):
        opt.tell(state, swarm_ask, numpy_losses(swarm_ask))


def test_the_state_keeps_its_own_copy_of_the_params():
    params = start(2)
    state = fb.black_box_search((-1.0, 1.0), max_evals=100).init(params, key=fb.random.key(0))
    params["x"].add_(0.5)
    assert state.start.eq(0).all() and state.best_params["x"].eq(0).all()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
@pytest.mark.parametrize("run", ["restarts, explorer, faces, polish", "walker"])
def test_a_state_saved_in_every_kind_of_round_loads_into_a_fresh_init_and_ends_the_same(
        tmp_path, run, device):
    """fb.save between ask and tell at the first round of every phase and swarm kind, fb.load
    into a new search's init: the run ends bitwise where the one never saved ends."""
    if run == "walker":
        bounds, settings = (-5.0, 5.0), dict(max_evals=2000, restart_after=None)
        params = {"x": torch.zeros(4, device=device)}  # float32: the given dtypes are kept too

        def losses(asked):
            return rotated_valley(asked.params["x"].cpu()).numpy()
    else:
        bounds, settings = (-1.0, 1.0), dict(max_evals=6000, restart_after=8)
        params = {"x": start(4)["x"].to(device)}

        def losses(asked):
            return numpy_losses(asked, offset=-37.5)

    def finish(saving):
        opt, kinds = fb.black_box_search(bounds, **settings), set()
        state = opt.init(params, key=fb.random.key(0))
        while state.phase != "done":
            asked = opt.ask(state)
            kind = (state.phase, bool(state.valley), bool(state.swarm_learns),
                    len(asked.mask))
            if saving and kind not in kinds:
                fb.save(state, tmp_path / "state.pt")
                opt = fb.black_box_search(bounds, **settings)  # as a new process would
                state = fb.load(tmp_path / "state.pt", like=opt.init(params, key=fb.random.key(0)))
            kinds.add(kind)
            state = opt.tell(state, asked, losses(asked))
        return state, kinds

    (saved, kinds), (never, _) = finish(True), finish(False)
    assert {k[0] for k in kinds} >= {"converge", "faces", "polish"}
    assert (("converge", True, True, 16) in kinds if run == "walker" else  # a wide walker too:
            "explore" in {k[0] for k in kinds} and ("converge", True, True, 32) in kinds)
    assert to_dict(saved)["digest"] == to_dict(never)["digest"]
    assert saved.best_loss.device.type == saved.swarm.population.device.type == device


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_run_drives_a_search_to_its_budget_and_checkpoints_it(tmp_path, device):
    """fb.run on a black_box_search state: fb.black_box's run, round for round, stopped by
    the search's own budget, saved as it goes and resumed bitwise from the checkpoint."""
    settings = dict(max_evals=16 * 60, restart_after=4)

    def start(dim):  # the search's counters stay on the CPU, its points where params are
        return {"x": torch.zeros(dim, dtype=torch.float64, device=device)}

    out = fb.black_box(shifted_sphere, start(3), (-1.0, 1.0), key=fb.random.key(2), **settings)
    opt = fb.black_box_search((-1.0, 1.0), **settings)
    lines = []
    state = fb.run(opt, opt.init(start(3), key=fb.random.key(2)), shifted_sphere,
                   progress=lines.append, log_every=1, checkpoint=tmp_path / "state.pt",
                   checkpoint_every=7)
    assert state.phase == "done" and lines[-1]["stopped"] == "max_evals"
    assert [(line["num_evals"], line["best_loss"]) for line in lines] == out.history
    assert int(state.num_evals) == out.num_evals and int(state.step) == len(out.history)
    saved = fb.load(tmp_path / "state.pt", like=opt.init(start(3), key=fb.random.key(2)))
    assert to_dict(saved)["digest"] == to_dict(state)["digest"]
    halfway = fb.run(opt, opt.init(start(3), key=fb.random.key(2)), shifted_sphere,
                     max_steps=20, checkpoint=tmp_path / "half.pt")
    resumed = fb.load(tmp_path / "half.pt", like=opt.init(start(3), key=fb.random.key(2)))
    assert int(halfway.step) == 20
    ended = fb.run(opt, resumed, shifted_sphere)
    assert to_dict(ended)["digest"] == to_dict(state)["digest"]
    assert fb.run(opt, ended, shifted_sphere) is ended  # nothing left to run
    early = fb.run(opt, opt.init(start(3), key=fb.random.key(2)), shifted_sphere,
                   target_loss=1e-3)
    assert float(early.best_loss) <= 1e-3 and early.phase != "done"
    for bad in (dict(max_evals=100), dict(compile=True)):
        with pytest.raises(ValueError, match="to the search's own budget"):
            fb.run(opt, state, shifted_sphere, **bad)



@pytest.mark.parametrize("edit, match", [
    (lambda s: s._replace(stage=torch.tensor(7)), r"state\.stage is 7, outside \[0, 4\]"),
    (lambda s: s._replace(failed=torch.tensor(-1)), r"state\.failed is negative"),
    (lambda s: s._replace(swarm=s.swarm._replace(step_sizes=s.swarm.step_sizes * torch.nan)),
     r"state\.swarm\.step_sizes holds NaN"),
    (lambda s: s._replace(explorer=s.explorer._replace(hyperparams=s.explorer.hyperparams._replace(
        step_size=torch.tensor(-1.0, dtype=torch.float64)))),
     r"state\.explorer\.hyperparams\.step_size is -1\.0"),
    (lambda s: s._replace(faces=s.faces._replace(stage=torch.tensor(4))),
     r"state\.faces\.stage is 4, outside \[0, 3\]"),
    (lambda s: s._replace(walker=s.walker._replace(mean=s.walker.mean * torch.inf)),
     r"state\.walker\.mean holds NaN or infinite"),
    (lambda s: s._replace(walker=s.walker._replace(sigma=-s.walker.sigma)),
     r"state\.walker\.sigma is -0\.07.*outside \[0\.0, inf\)"),
    (lambda s: s._replace(walker=s.walker._replace(num_evals=torch.tensor(-16))),
     r"state\.walker\.num_evals is negative"),
], ids=["phase", "counter", "swarm", "explorer's hyperparameter", "face scan", "walker's mean",
        "walker's step", "walker's counter"])
def test_a_black_box_checkpoint_no_search_makes_is_refused_by_its_values(tmp_path, edit, match):
    opt = fb.black_box_search((-1.0, 1.0), max_evals=1000)
    state = opt.init(start(2), key=fb.random.key(0))
    fb.save(edit(state), tmp_path / "state.pt")
    with pytest.raises(ValueError, match=match):
        fb.load(tmp_path / "state.pt", like=state)


def test_the_face_moves_are_made_by_ask_and_only_the_best_one_again_by_tell(monkeypatch):
    """The state keeps what a round of face moves is made from, not its points: ``ask``
    makes them, as copies the caller may edit, and ``tell`` makes only the best one."""
    import functional_bfo._black_box.moves as moves

    made = []
    real = moves.moved
    monkeypatch.setattr(moves, "moved", lambda x, lo, hi, which: made.append(len(which)) or real(
        x, lo, hi, which))
    opt = fb.black_box_search((-1.0, 1.0), max_evals=16 * 40)
    state = opt.init(start(3), key=fb.random.key(4))
    while state.phase != "faces":
        state = opt.tell(state, opt.ask(state), numpy_losses(opt.ask(state)))
    assert made == []
    asked = opt.ask(state)
    assert made == [len(asked.mask)] and 1 < len(asked.mask) <= 2 * 3
    before = asked.params["x"].clone()
    asked.params["x"].mul_(10.0)  # the caller's Ask, edited in place: not the state's
    assert torch.equal(opt.ask(state).params["x"], before)
    state = opt.tell(state, opt.ask(state), numpy_losses(opt.ask(state)))
    assert made[-1] == 1 and len(made) == 5  # three asks of every row, the best in tell


def test_a_state_of_another_search_or_no_state_is_refused_by_name():
    """A state resumed with other settings, or something else, gets an error that says so."""
    state = fb.black_box_search((-1.0, 1.0), max_evals=1000, metric_rate=0).init(
        start(2), key=fb.random.key(0))
    other = fb.black_box_search((-1.0, 1.0), max_evals=1000, population_size=6, metric_rate=0)
    asked = fb.black_box_search((-1.0, 1.0), max_evals=1000, metric_rate=0).ask(state)
    for call in (lambda: other.ask(state), lambda: other.update(state, shifted_sphere),
                 lambda: other.tell(state, asked, numpy_losses(asked), check=False)):
        with pytest.raises(ValueError, match="population of \\(8,\\) bacteria but this "
                                             "optimizer has population_size=6"):
            call()
    adaptive = fb.adaptive_bfo(8).init(start(2), key=fb.random.key(0))
    with pytest.raises(TypeError, match="takes the BlackBoxState its init made, got "
                                        "AdaptiveBFOState"):
        other.ask(adaptive)


def test_float32_params_with_a_bad_box_get_the_boxs_error():
    with pytest.raises(ValueError, match="use -inf/inf, not None, for an open side"):
        fb.black_box(shifted_sphere, {"x": torch.zeros(2)}, {"x": (-2.0, None)},
                     max_evals=100, key=fb.random.key(0))


def test_metrics_of_a_search_state_report_its_swarm_and_its_counters():
    opt = fb.black_box_search((-1.0, 1.0), max_evals=2000)
    state = opt.init(start(2), key=fb.random.key(0))
    for _ in range(40):
        asked = opt.ask(state)
        state = opt.tell(state, asked, numpy_losses(asked))
    got = fb.materialize(fb.metrics(state))
    assert got["best_loss"] == float(state.best_loss) and got["num_evals"] == int(state.num_evals)
    assert got["step"] == 40 and got["restarts"] == int(state.restarts)
    assert {"stage", "failed_swarms", "explorer_updates", "walker_sigma", "diversity",
            "mean_loss", "step_length_max"} <= got.keys()
    with pytest.raises(TypeError, match="metrics takes the state of an optimizer"):
        fb.metrics({"x": torch.zeros(2)})


def test_the_restart_rules_read_one_at_a_time():
    """Each named condition of a converging swarm's restart, on numbers a reader can check."""
    from functional_bfo._black_box import search as bb

    assert bb.found_valley(bb.VALLEY_CONDITION * 2) and not bb.found_valley(1.0)
    # behind (progress 10 above the best before, 0): a gain of 1% of the 10 still to go
    assert bb.progressed(9.8, 10.0, 0.0, 50.0, 0.0, False, 0.01)
    assert not bb.progressed(9.95, 10.0, 0.0, 50.0, 0.0, False, 0.01)
    # ahead (best before 20): 1% of its own descent from 50 to 10
    assert bb.progressed(9.5, 10.0, 20.0, 50.0, 0.0, False, 0.01)
    assert not bb.progressed(9.7, 10.0, 20.0, 50.0, 0.0, False, 0.01)
    # ahead in a valley: 1% of its last gain counts too
    assert bb.progressed(9.95, 10.0, 20.0, 50.0, 1.0, True, 0.01)
    assert bb.stalled_out(30, 30, 1.0) and not bb.stalled_out(29, 30, 1.0)
    assert not bb.stalled_out(30, 30, bb.HOLDING_PATIENCE)
    assert bb.stalled_out(30 * bb.HOLDING_PATIENCE, 30, bb.HOLDING_PATIENCE)
    # behind the best: one window; holding it, a swarm waits 3, a walker D / 10 (1 to 3)
    assert bb.patience(True, False, 10) == bb.patience(True, True, 50) == 1
    assert bb.patience(False, False, 2) == bb.HOLDING_PATIENCE == 3
    assert bb.patience(False, True, 2) == bb.patience(False, True, 10) == 1
    assert bb.patience(False, True, 20) == 2 and bb.patience(False, True, 40) == 3
    assert bb.overspent(201, 100, behind=True) and not bb.overspent(200, 100, behind=True)
    assert not bb.overspent(10_000, 100, behind=False)


def test_a_walker_or_face_round_records_the_ranks_a_distributed_evaluator_names():
    """Those rounds call the evaluator themselves: its disagreeing ranks reach the state
    (fb.metrics, fb.run) as a swarm round's do. The evaluator here is fb.distributed's
    protocol in one process, reporting rank 1 as disagreeing."""

    class Reporting:
        takes_rows = False

        def __call__(self, loss_fn, population, *args):
            return torch.func.vmap(loss_fn)(population, *args)

        def with_disagreement(self, loss_fn, population, *args):
            return self(loss_fn, population, *args), torch.tensor(0b10)

    opt = fb.black_box_search((-1.0, 1.0), max_evals=16 * 10, polish=0.5, evaluator=Reporting())
    state = opt.init(start(2), key=fb.random.key(0))
    while state.phase != "faces":
        asked = opt.ask(state)
        state = opt.tell(state, asked, numpy_losses(asked))  # told: no evaluator, no report
    assert int(fb.metrics(state)["disagreeing_ranks"]) == 0
    state = opt.update(state, lambda p: p["x"].square().sum())
    assert int(fb.metrics(state)["disagreeing_ranks"]) == 0b10
    with pytest.raises(RuntimeError, match=r"ranks \[1\] disagree with rank 0"):
        fb.distributed.check_agreement(state)


def test_a_walker_holding_the_best_restarts_after_restart_after_rounds_without_progress():
    """A walker's step adapts, so a stall is a stall: one holding the best at D = 2 restarts
    after ``restart_after`` of its rounds without progress (D / 10 windows, at least one), not
    ``HOLDING_PATIENCE`` times that (a swarm's patience, kept for slow descents), here on a
    valley with a flat floor."""
    opt = fb.black_box_search((-1.0, 1.0), max_evals=6000, restart_after=30, polish=0.0,
                              explore_after=None)
    state = opt.init({"x": torch.zeros(2, dtype=torch.float64)}, key=fb.random.key(0))
    limit, before = 30 * 16, None
    while state.phase != "done" and int(state.restarts) == 0:
        before, asked = state, opt.ask(state)
        x = asked.params["x"]
        state = opt.tell(state, asked, ((x[:, 0] - 0.3) ** 2 + 100 * (x[:, 1] + 0.2) ** 2
                                        ).clamp_min(1e-4) + 7.0)
    assert int(state.restarts) == 1 and bool(before.valley)  # the first search: ahead
    assert float(before.best_loss) == 7.0 + 1e-4
    assert limit <= int(before.stalled) + 16 < search.HOLDING_PATIENCE * limit
