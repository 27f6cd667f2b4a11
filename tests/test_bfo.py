"""Behaviour of the canonical BFO beyond the contract: bounds, dtypes, non-finite losses,
the run driver, evaluators, hyperparameters and the module helper."""

import functools
import sys
from typing import NamedTuple

import optree
import pytest
import torch
from helpers import assert_trees_equal, population
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import functional_bfo as fb
from functional_bfo._bounds import flat_box, leaf_bounds, project
from functional_bfo._layout import layout


def sq(p):
    return sum((x.float() - 0.3).square().sum() for x in optree.tree_leaves(p))


@pytest.mark.parametrize("mode", ["clip", "reflect", "wrap"])
def test_positions_never_leave_the_box(mode):
    opt = fb.bfo(population_size=16, step_size=2.0, bounds=(-1.0, 0.5), boundary=mode,
                 chemotaxis_steps=2, reproduction_steps=1, elimination_prob=0.5, tumble="levy")
    state = opt.init({"x": torch.zeros(4)}, key=fb.random.key(0))

    def far(p):
        return (p["x"] - 3.0).square().sum()  # pulls everyone into the upper face
    for _ in range(10):
        state = opt.update(state, far)
        x = population(state)["x"]
        assert (x >= -1.0).all() and (x <= 0.5).all()
        assert (state.best_params["x"] <= 0.5).all()


def test_projection_modes_by_hand():
    box = leaf_bounds(torch.tensor(0.0), torch.tensor(1.0))
    x = torch.tensor([-0.25, 0.5, 1.25, 2.5, -1.75])
    assert torch.equal(project(x, box, "clip"), torch.tensor([0.0, 0.5, 1.0, 1.0, 0.0]))
    assert torch.equal(project(x, box, "reflect"), torch.tensor([0.25, 0.5, 0.75, 0.5, 0.25]))
    assert torch.equal(project(x, box, "wrap"), torch.tensor([0.75, 0.5, 0.25, 0.5, 0.25]))
    half_open = leaf_bounds(torch.tensor(0.0), torch.tensor(torch.inf))
    assert torch.equal(project(x, half_open, "reflect"), torch.tensor([0.0, 0.5, 1.25, 2.5, 0.0]))


@settings(max_examples=60, deadline=None)
@given(low=st.floats(-1e30, 1e30), width=st.floats(1e-6, 1e30), seed=st.integers(0, 2**31),
       dtype=st.sampled_from([torch.float32, torch.float64]), closed=st.booleans(),
       mode=st.sampled_from(["clip", "reflect", "wrap"]))
def test_a_point_inside_the_box_stays_where_it_is(low, width, seed, dtype, closed, mode):
    """Only what left the box moves: folding every point (low + remainder(x - low)) would
    round the ones inside to the spacing of |low|'s floats (0.0625 at 1e6 in float32)."""
    box = leaf_bounds(torch.tensor(low, dtype=dtype), torch.tensor(low + width, dtype=dtype),
                      closed=closed)
    u = torch.rand(256, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x = (box.low.double() + u * box.width.double()).to(dtype).clamp(box.low, box.high)
    assert torch.equal(project(x, box, mode), x)


def test_bacterium_0_is_the_params_in_a_wide_box():
    """The first candidates hold the params themselves, not them rounded to the box's grid."""
    params = {"x": torch.tensor([0.1234567, -3.3])}
    for boundary in ("clip", "reflect", "wrap"):
        opt = fb.bfo(population_size=4, bounds=(-1e6, 1e6), boundary=boundary)
        asked = opt.ask(opt.init(params, key=fb.random.key(0)))
        assert torch.equal(asked.params["x"][0], params["x"]), boundary


@settings(max_examples=60, deadline=None)
@given(low=st.floats(-1e6, 1e6), width=st.floats(1e-6, 1e6), seed=st.integers(0, 2**31),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_reflection_folds_back_as_the_textbook_formula_bit_for_bit(low, width, seed, dtype):
    """The fold is ``minimum(y, period - y)``: the points of ``where(y > width, period - y,
    y)``, the textbook's, in every bit (one full-size ``where`` fewer on an eager ray), for
    the points that left the box (the others stay)."""
    box = leaf_bounds(torch.tensor(low, dtype=dtype), torch.tensor(low + width, dtype=dtype))
    scale = torch.tensor([1e-3, 1.0, 10.0, 1e4], dtype=dtype).repeat_interleave(64)
    x = box.low + (torch.randn(256, generator=torch.Generator().manual_seed(seed),
                               dtype=dtype) * scale * box.width)
    y = torch.remainder(x - box.low, box.reflect_period)
    folded = box.low + torch.where(y > box.width, box.reflect_period - y, y)
    textbook = torch.where((x < box.low) | (x > box.high), folded, x).clamp(box.low, box.high)
    torch.testing.assert_close(project(x, box, "reflect"), textbook, rtol=0, atol=0,
                               equal_nan=True)  # a box rounded to width 0: NaN in both


@pytest.mark.parametrize("mode", ["clip", "reflect", "wrap"])
def test_a_box_known_closed_projects_as_the_masked_one(mode):
    """A box the host knows is finite skips the open-coordinate mask: the same positions."""
    low, high = torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([1.0, 0.5, 7.0])
    x = torch.linspace(-20, 20, 3 * 401).reshape(401, 3)
    closed, masked = leaf_bounds(low, high, closed=True), leaf_bounds(low, high)
    assert closed.open is None and masked.open is not None
    assert torch.equal(project(x, closed, mode), project(x, masked, mode))


def test_a_box_is_closed_only_from_finite_numbers():
    """Tensor bounds are never read on the host: a box with any keeps the open-coordinate
    mask, as one with an infinite side does."""
    shape = layout({"a": torch.zeros(2), "b": torch.zeros(2), "c": torch.zeros(2)})
    cpu = torch.device("cpu")
    numbers = {"a": (-1.0, 1.0), "b": (0.0, 2.0), "c": (0.0, 3.0)}
    assert flat_box(numbers, shape, cpu).open is None
    tensors = {"a": (-1.0, 1.0), "b": (torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])),
               "c": (0.0, 3.0)}
    assert not bool(flat_box(tensors, shape, cpu).open.any())
    open_side = {**tensors, "c": (0.0, float("inf"))}
    assert flat_box(open_side, shape, cpu).open.tolist() == [False] * 4 + [True] * 2


def test_ties_across_swim_calls_keep_the_earliest_best():
    """A staircase loss makes many candidates tie at each new best: one point per call,
    eager and compiled, and the whole ray in one call keep the same, earliest, best (checked
    to fail when the calls' bests are compared in reverse)."""
    def stairs(p):
        return torch.floor(p["x"].sum())

    kwargs = dict(population_size=12, step_size=0.2, chemotaxis_steps=3, bounds=(-5.0, 5.0))
    opt, ray = fb.bfo(**kwargs), fb.bfo(**kwargs, swim_batch=5)
    state = opt.init({"x": torch.zeros(3)}, key=fb.random.key(3))
    compiled = torch.compile(opt.update, fullgraph=True, backend="aot_eager")
    one, whole, traced = state, state, state
    for _ in range(6):
        one, whole = opt.update(one, stairs), ray.update(whole, stairs)
        traced = compiled(traced, stairs)
        assert_trees_equal(one, whole)
        assert_trees_equal(one, traced)


def test_per_leaf_bounds_pytree_and_uniform_initial_population():
    params = {"a": torch.zeros(3), "b": torch.zeros(2)}
    bounds = {"a": (-1.0, 1.0), "b": (torch.tensor([0.0, 5.0]), torch.tensor([1.0, 6.0]))}
    opt = fb.bfo(population_size=200, bounds=bounds)
    state = opt.init(params, key=fb.random.key(1))
    b = population(state)["b"]
    assert torch.equal(b[0], torch.tensor([0.0, 5.0]))  # params clipped into the box
    assert (b[:, 1] >= 5.0).all() and (b[:, 1] <= 6.0).all()
    assert abs(b[1:, 1].mean().item() - 5.5) < 0.06  # uniform in the box
    assert abs(population(state)["a"][1:].mean().item()) < 0.1


@pytest.mark.parametrize("factory", [fb.bfo, fb.adaptive_bfo,
                                     functools.partial(fb.hybrid_bfo, grad_mask=True)],
                         ids=["bfo", "adaptive_bfo", "hybrid_bfo"])
def test_a_half_open_box_holds_the_initial_bacteria(factory):
    """On a coordinate with one finite side, new bacteria spread around the params by
    init_scale and are clipped to that side, like every later position (this held only
    after the first update before)."""
    bounds = (torch.tensor(-0.5), torch.tensor(torch.inf))
    state = factory(population_size=400, bounds=bounds).init({"x": torch.zeros(3)},
                                                             key=fb.random.key(4))
    x = population(state)["x"]
    assert bool((x >= -0.5).all()) and float((x == -0.5).float().mean()) > 0.2
    assert float(x.max()) > 1.5  # the open side is not clipped


class Pair(NamedTuple):
    weight: torch.Tensor
    scale: torch.Tensor


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_leaf_dtypes_are_kept_and_losses_are_at_least_float32(dtype):
    params = [Pair(torch.zeros(3, dtype=dtype), torch.ones((), dtype=dtype))]
    opt = fb.bfo(population_size=6, step_size=0.2)
    state = opt.init(params, key=fb.random.key(2))
    for _ in range(3):
        state = opt.update(state, sq)
    assert population(state)[0].weight.dtype == dtype
    assert state.best_params[0].scale.dtype == dtype
    want = torch.float64 if dtype == torch.float64 else torch.float32
    assert state.losses.dtype == want and state.best_loss.dtype == want
    assert isinstance(state.best_params[0], Pair)


def test_non_finite_losses_rank_last_and_never_become_best():
    """Half the space returns NaN or inf; the best stays finite and in the good half."""
    def loss(p):
        x = p["x"]
        bad = torch.where(x[0] > 0, torch.nan, torch.inf)
        return torch.where(x[1] > 0, bad, x.square().sum())
    opt = fb.bfo(population_size=8, step_size=0.5, chemotaxis_steps=2, reproduction_steps=1)
    state = opt.init({"x": torch.tensor([0.0, 1.0])}, key=fb.random.key(3))
    for _ in range(8):
        state = opt.update(state, loss)
        assert torch.isfinite(state.best_loss)
        assert state.best_params["x"][1] <= 0
        assert not torch.isnan(state.losses).any()


def test_all_nan_first_generation_keeps_best_at_inf():
    """If every candidate is NaN, nothing becomes best and the losses rank as +inf."""
    opt = fb.bfo(population_size=3, swim_length=1)
    state = opt.update(opt.init({"x": torch.zeros(2)}, key=fb.random.key(4)),
                       lambda p: p["x"].sum() * torch.nan)
    assert state.best_loss == torch.inf
    assert torch.equal(state.losses, torch.full((3,), torch.inf))
    assert torch.equal(state.best_params["x"], torch.zeros(2))


def test_maximize_reports_the_maximum():
    opt = fb.bfo(population_size=8, maximize=True, step_size=0.3)
    state = opt.init({"x": torch.zeros(2)}, key=fb.random.key(5))
    state = fb.run(opt, state, lambda p: -(p["x"] - 1).square().sum(), max_steps=30)
    assert float(state.best_loss) > -0.2
    assert (state.best_params["x"] - 1).abs().max() < 0.45
    assert torch.equal(state.best_loss, state.losses.max().maximum(state.best_loss))


def test_run_respects_budgets_and_stopping_rules():
    opt = fb.bfo(population_size=4, swim_length=1)  # 8 evaluations per update
    state = opt.init({"x": torch.zeros(2)}, key=fb.random.key(6))
    assert int(fb.run(opt, state, sq, max_evals=100).num_evals) == 96
    assert int(fb.run(opt, state, sq, max_steps=3).step) == 3
    reports = []
    fb.run(opt, state, sq, max_steps=50, target_loss=1e9, progress=reports.append)
    assert reports[-1]["stopped"] == "target_loss" and reports[-1]["updates"] == 1
    stalled = fb.run(opt, state, lambda p: p["x"].sum() * 0, max_steps=50, patience=3)
    assert int(stalled.step) == 4  # the first update improves on +inf, then 3 stall


def test_run_progress_shows_a_tqdm_bar_then_a_summary(capsys):
    pytest.importorskip("tqdm")
    opt = fb.bfo(population_size=4, swim_length=1)
    state = opt.init({"x": torch.zeros(2)}, key=fb.random.key(7))
    fb.run(opt, state, sq, max_evals=80, progress=True, log_every=2)
    out = capsys.readouterr()
    assert "80/80" in out.err and "best=" in out.err  # the bar, on stderr
    assert out.out.startswith("stopped by max_evals after 10 updates (80 evaluations")


def test_run_progress_prints_lines_without_tqdm(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if it were not installed
    opt = fb.bfo(population_size=4, swim_length=1)
    state = opt.init({"x": torch.zeros(2)}, key=fb.random.key(7))
    fb.run(opt, state, sq, max_steps=4, progress=True, log_every=2)
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in out[:2]] == ["1", "2"]
    assert out[-1].startswith("stopped by max_steps after 4 updates")


def test_an_evaluator_may_name_the_data_it_is_always_given():
    def with_data(loss_fn, population, data):  # evaluator(loss_fn, population, *args)
        return torch.func.vmap(lambda p: loss_fn(p, data))(population)
    opt = fb.bfo(population_size=4, evaluator=with_data)
    state = opt.update(opt.init({"x": torch.zeros(2)}, key=fb.random.key(0)),
                       lambda p, target: (p["x"] - target).square().sum(), torch.tensor(1.0))
    assert float(state.best_loss) <= 2.0


def test_loop_evaluator_matches_vmap_and_handles_item():
    def branchy(p):  # data-dependent Python control flow: vmap cannot batch it
        return p["x"].square().sum() if p["x"].sum().item() > 0 else p["x"].abs().sum()
    vm = fb.bfo(population_size=5)
    lp = fb.bfo(population_size=5, evaluator=fb.evaluate.loop())
    a = vm.update(vm.init({"x": torch.zeros(3)}, key=fb.random.key(8)), sq)
    b = lp.update(lp.init({"x": torch.zeros(3)}, key=fb.random.key(8)), sq)
    torch.testing.assert_close(population(a), population(b))
    state = lp.update(lp.init({"x": torch.zeros(3)}, key=fb.random.key(8)), branchy)
    assert torch.isfinite(state.best_loss)


def test_data_args_reach_the_loss_and_module_loss_trains():
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    model = nn.Linear(3, 1)
    params, loss_fn = fb.module_loss(model, nn.functional.mse_loss)
    opt = fb.bfo(population_size=16, step_size=0.1, chemotaxis_steps=5, init_scale=0.5)
    state = opt.init(params, key=fb.random.key(9))
    start = float(loss_fn(params, x, y))
    state = fb.run(opt, state, loss_fn, x, y, max_steps=60)
    assert float(state.best_loss) < 0.2 * start
    model.load_state_dict(state.best_params)
    torch.testing.assert_close(nn.functional.mse_loss(model(x), y), state.best_loss)


def test_with_hyperparams_changes_the_step_size():
    opt = fb.bfo(population_size=4, swim_length=0)
    state = opt.update(opt.init({"x": torch.zeros(3)}, key=fb.random.key(10)), sq)
    small = opt.update(fb.with_hyperparams(state, step_size=1e-3), sq)
    moved = (population(small)["x"] - population(state)["x"]).norm(dim=1)
    assert (moved <= 1e-3 + 1e-7).all()
    assert small.hyperparams.step_size.dtype == torch.float32


def test_with_hyperparams_keeps_a_float64_state_exact():
    """A Python float reaches a float64 field unrounded, as the factory stores it."""
    state = fb.bfo(population_size=4, step_size=0.1).init(
        {"x": torch.zeros(2, dtype=torch.float64)}, key=fb.random.key(0))
    assert fb.with_hyperparams(state, step_size=0.1).hyperparams.step_size.item() == 0.1
    assert torch.equal(fb.with_hyperparams(state, step_size=0.1).hyperparams.step_size,
                       state.hyperparams.step_size)


def test_update_never_touches_the_global_rng():
    opt = fb.bfo(population_size=4)
    before = torch.get_rng_state()
    opt.update(opt.init({"x": torch.zeros(3)}, key=fb.random.key(11)), sq)
    assert torch.equal(torch.get_rng_state(), before)


def test_metrics_match_direct_computation_and_compile_without_breaks():
    opt = fb.bfo(population_size=6)
    state = opt.update(opt.init({"x": torch.ones(3), "y": torch.zeros(2)},
                                key=fb.random.key(12)), sq)
    got = fb.materialize(fb.metrics(state))
    losses = state.losses.double()
    assert got["best_loss"] == pytest.approx(float(state.best_loss))
    assert got["mean_loss"] == pytest.approx(float(losses.mean()))
    assert got["worst_loss"] == pytest.approx(float(losses.max()))
    assert got["nonfinite_losses"] == 0 and got["num_evals"] == 30 and got["step"] == 1
    assert type(got["step"]) is int and type(got["num_evals"]) is int  # counts, not floats
    assert type(got["best_loss"]) is float
    flat = state.population.double()
    rms = (flat - flat.mean(0)).square().sum(1).mean().sqrt()
    assert got["diversity"] == pytest.approx(float(rms), rel=1e-5)
    assert torch._dynamo.explain(fb.metrics)(state).graph_break_count == 0


def test_the_worst_loss_of_a_maximizing_population_is_its_least():
    opt = fb.bfo(population_size=6, maximize=True)
    state = opt.update(opt.init({"x": torch.ones(3)}, key=fb.random.key(12)),
                       lambda p: -sq(p))
    got = fb.materialize(fb.metrics(state))
    assert got["worst_loss"] == pytest.approx(float(state.losses.min()))
    assert got["best_loss"] >= float(state.losses.max())


def test_materialize_makes_exactly_one_transfer(monkeypatch):
    opt = fb.bfo(population_size=4)
    values = fb.metrics(opt.init({"x": torch.zeros(2)}, key=fb.random.key(13)))
    calls = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: calls.append(t) or original(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda t: pytest.fail("item() is a sync"))
    out = fb.materialize(values)
    assert len(calls) == 1 and set(out) == set(values)
    assert out["nonfinite_losses"] == 4  # before the first update no loss is known


def test_compiled_updates_of_optimizers_with_other_number_bounds_in_one_process():
    """A second compile of update with other bounds numbers sees them as symbolic ints; the
    box must still be built without graph breaks (math.isfinite on them cannot be traced)."""
    torch.compiler.reset()
    params = {"x": torch.linspace(-2, 2, 7)}
    for bounds in [(-3, 3), (-1, 1), (-1.5, float("inf"))]:
        opt = fb.bfo(8, bounds=bounds)
        state = opt.init(params, key=fb.random.key(0))
        compiled = torch.compile(opt.update, fullgraph=True, backend="aot_eager")(
            state, lambda p: p["x"].sum())
        eager = opt.update(state, lambda p: p["x"].sum())
        torch.testing.assert_close(population(compiled), population(eager))
        assert bool((population(compiled)["x"] >= bounds[0]).all())
