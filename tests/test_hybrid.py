"""HybridBFO: gradient masks (all, none, mixed, dynamic), the direction mix, telemetry, errors."""

import optree
import pytest
import torch
import torch._dynamo.testing
from helpers import assert_trees_equal, leaf_flags, population

import functional_bfo as fb
from functional_bfo._hybrid import _mix


def quad(p):
    return (p["a"] - 2).square().sum() + (p["b"] + 1).square().sum()


def params(a_grad=False, b_grad=False):
    return {"a": torch.zeros(3, requires_grad=a_grad), "b": torch.zeros(2, requires_grad=b_grad)}


@pytest.mark.parametrize("a_grad,b_grad", [(True, True), (False, False), (True, False)],
                         ids=["all", "none", "mixed"])
def test_mask_from_requires_grad_and_both_parts_improve(a_grad, b_grad):
    # No leaf requiring grad is refused with grad_mask=None; False says so on purpose.
    opt = fb.hybrid_bfo(population_size=10, gradient_weight=0.8,
                        grad_mask=None if a_grad or b_grad else False)
    state = opt.init(params(a_grad, b_grad), key=fb.random.key(0))
    assert leaf_flags(state) == {"a": a_grad, "b": b_grad}
    state = fb.run(opt, state, quad, max_steps=60)
    assert (state.best_params["a"] - 2).abs().max() < 0.1  # gradient (or BFO) leaves
    assert (state.best_params["b"] + 1).abs().max() < 0.1  # BFO-only (or gradient) leaves
    norms = state.grad_norms
    assert (norms == 0).all() if not (a_grad or b_grad) else (norms > 0).any()


def test_dynamic_mask_changes_between_updates_without_recompiling():
    opt = fb.hybrid_bfo(population_size=6, grad_mask=False)
    state = opt.update(opt.init(params(), key=fb.random.key(1)), quad)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(opt.update, fullgraph=True, backend=counter)
    state = compiled(state, quad)
    assert (state.grad_norms == 0).all()
    state = compiled(fb.with_grad_mask(state, {"a": True, "b": False}), quad)
    # Bacteria that moved have gradients under the new mask (those that stayed keep the
    # gradient computed where they stand, under the old mask, until they move).
    assert (state.grad_norms > 0).any() and counter.frame_count == 1
    eager = opt.update(fb.with_grad_mask(state, True), quad)
    assert leaf_flags(eager)["b"]


def test_mix_weights_zero_and_one_and_keeps_unit_norm():
    torch.manual_seed(0)
    phi = torch.randn(4, 5)
    phi = phi / phi.norm(dim=1, keepdim=True)
    g = torch.randn(4, 5)
    mask = torch.tensor([True, True, True, False, False])  # 3 coordinates take gradients
    usable = torch.tensor([True, True, True, False])
    same = _mix(phi, g, usable, mask, torch.tensor(0.0), 1.0)
    torch.testing.assert_close(same, phi)
    down = _mix(phi, g, usable, mask, torch.tensor(1.0), 1.0)
    torch.testing.assert_close(down[:, 3:], phi[:, 3:])  # gradient-free coordinates: pure BFO
    cos = torch.nn.functional.cosine_similarity(down[:3, :3], -g[:3, :3], dim=1)
    torch.testing.assert_close(cos, torch.ones(3))
    torch.testing.assert_close(down[3], phi[3])  # no usable gradient: pure tumble
    half = _mix(phi, g, usable, mask, torch.tensor(0.5), 1.0)
    torch.testing.assert_close(half.norm(dim=1), torch.ones(4))


def test_gradient_norms_match_foreach_norm_and_count_vanishing_and_exploding():
    opt = fb.hybrid_bfo(population_size=5, grad_mask=True, vanishing_threshold=1e-3,
                        exploding_threshold=3.0)
    state = opt.update(opt.init(params(), key=fb.random.key(2)), quad)
    state = opt.update(state, quad)
    grads = torch.func.vmap(torch.func.grad(quad))(population(state))
    rows = [torch.stack(torch._foreach_norm([grads["a"][i], grads["b"][i]])).norm()
            for i in range(5)]
    torch.testing.assert_close(state.grad_norms, torch.stack(rows))
    assert int(state.grad_exploding) == int((torch.stack(rows) > 3.0).sum())
    assert int(state.grad_vanishing) == int((torch.stack(rows) < 1e-3).sum())
    got = fb.materialize(fb.metrics(state))
    assert got["grad_norm_mean"] == pytest.approx(float(torch.stack(rows).mean()), rel=1e-5)


def test_nonfinite_gradients_never_poison_positions():
    """sqrt(|x|) has an infinite gradient at 0: those bacteria fall back to a pure tumble."""
    def kinked(p):
        return p["a"].abs().sqrt().sum() + p["b"].abs().sqrt().sum()
    opt = fb.hybrid_bfo(population_size=6, grad_mask=True)
    state = opt.update(opt.init(params(), key=fb.random.key(3)), kinked)
    assert int(state.grad_nonfinite) > 0 and not bool(state.grad_known[0])
    for _ in range(3):
        state = opt.update(state, kinked)
        assert all(torch.isfinite(x).all() for x in population(state).values())
        assert bool(torch.isfinite(state.grads).all())


def test_a_bacterium_staying_where_its_gradient_is_not_finite_keeps_it_unknown():
    """It does not get its stored (zeroed) gradient back as a known one: its norm stays
    NaN, it is not known (so its tumbles stay pure) and nothing new is counted as met."""
    def kinked(p):
        return p["a"].abs().sqrt().sum()

    opt = fb.hybrid_bfo(population_size=4, swim_length=1, grad_mask=True,
                        elimination_prob=0.0, elimination_prob_max=0.0)
    state = opt.init({"a": torch.tensor([0.0, 1.0, 2.0])}, key=fb.random.key(0))
    state = opt.update(state, kinked)
    assert not bool(state.grad_known[0]) and int(state.grad_nonfinite) == 1
    stays = 0
    for _ in range(3):
        before = state.population[0].clone()
        state = opt.update(state, kinked)
        if torch.equal(state.population[0], before):
            stays += 1
            assert not bool(state.grad_known[0]) and bool(torch.isnan(state.grad_norms[0]))
    assert stays > 0


def per_row_gradients(loss_fn, population, *args):
    """An evaluator that differentiates each candidate's leaves: ``grad_and_value``."""
    grads, losses = torch.func.vmap(torch.func.grad_and_value(
        lambda p: loss_fn(p, *args)))(population)
    return losses, grads


def rippled(p):
    """A loss whose gradients round (a change in how they are computed shows)."""
    return (torch.cos(3 * p["a"]) * p["a"].square()).sum() + torch.tanh(p["b"] - 1).sum() ** 3


@pytest.mark.parametrize("chunk_size", [None, 1, 3])
def test_chunked_gradients_equal_an_evaluator_differentiating_each_row_bitwise(chunk_size):
    """Chunks, and an evaluator that differentiates the leaves (not the rows), give the
    same run bit for bit."""
    runs = []
    for kwargs in (dict(chunk_size=chunk_size), dict(evaluator=per_row_gradients)):
        opt = fb.hybrid_bfo(population_size=7, grad_mask={"a": True, "b": False}, **kwargs)
        state = opt.init(params(), key=fb.random.key(6))
        for _ in range(12):  # past a reproduction and a dispersal
            state = opt.update(state, rippled)
        runs.append(state)
    assert_trees_equal(*runs)
    assert bool(runs[0].grad_known.any())


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_non_differentiable_loss_is_refused_eager_and_compiled(chunk_size):
    opt = fb.hybrid_bfo(population_size=4, grad_mask={"a": True, "b": False},
                        chunk_size=chunk_size)
    state = opt.init(params(), key=fb.random.key(4))
    detached = lambda p: (p["a"].detach() ** 2).sum() + p["b"].detach().sum()  # noqa: E731
    with pytest.raises(ValueError, match=r"not differentiable with respect to params"):
        opt.update(state, detached)
    # Compiled, dynamo reports an exception met while tracing as its own, with our message.
    with pytest.raises(Exception, match=r"not differentiable with respect to params"):
        torch.compile(opt.update, fullgraph=True, backend="aot_eager")(state, detached)


def test_a_loss_that_detaches_only_the_marked_leaves_shows_vanishing_gradients():
    """The mask is a tensor (it may change between updates), so which leaves a loss detaches
    is not read on the host: the marked leaves' zero gradients show in telemetry instead."""
    opt = fb.hybrid_bfo(population_size=4, grad_mask={"a": True, "b": False})
    state = opt.init(params(), key=fb.random.key(4))
    state = opt.update(state, lambda p: (p["a"].detach() ** 2).sum() + p["b"].sum())
    assert int(state.grad_vanishing) == 4


def test_given_gradient_is_used_instead_of_per_bacterium_gradients():
    opt = fb.hybrid_bfo(population_size=6, gradient_weight=1.0, grad_mask=True)
    state = opt.update(opt.init(params(), key=fb.random.key(5)), quad)
    grad = torch.func.grad(quad)(state.best_params)
    new = opt.update(state, quad, grad=grad)
    assert int(new.num_evals) == 2 * int(state.num_evals)
    norm = (grad["a"].square().sum() + grad["b"].square().sum()).sqrt()
    torch.testing.assert_close(new.grad_norms, norm.expand(6))


def test_maximize_climbs_the_gradient():
    opt = fb.hybrid_bfo(population_size=8, gradient_weight=0.9, grad_mask=True, maximize=True)
    state = opt.init(params(), key=fb.random.key(6))
    state = fb.run(opt, state, lambda p: -quad(p), max_steps=40)
    assert float(state.best_loss) > -0.05


@pytest.mark.parametrize("bad,match", [
    (dict(gradient_weight=1.5), "Invalid gradient_weight"),
    (dict(momentum=1.0), "Invalid momentum"),
    (dict(grad_mask="yes"), "Invalid grad_mask"),
    (dict(evaluator=fb.evaluate.loop(), chunk_size=2), "chunk_size or evaluator"),
])
def test_invalid_hybrid_arguments(bad, match):
    with pytest.raises(ValueError, match=match):
        fb.hybrid_bfo(**bad)


def loop_value_and_grad(loss_fn, population, *args):
    """One torch.func.grad_and_value call per bacterium: the slow, obvious evaluator."""
    size = optree.tree_leaves(population)[0].shape[0]
    outs = [torch.func.grad_and_value(loss_fn)(optree.tree_map(lambda x, i=i: x[i], population),
                                               *args) for i in range(size)]
    grads = optree.tree_map(lambda *g: torch.stack(g), *[g for g, _ in outs])
    return torch.stack([v for _, v in outs]), grads


def test_custom_evaluator_matches_the_vmapped_one():
    kwargs = dict(population_size=6, gradient_weight=0.7, grad_mask=True)
    vmapped = fb.hybrid_bfo(**kwargs)
    looped = fb.hybrid_bfo(**kwargs, evaluator=loop_value_and_grad)
    a = vmapped.init(params(), key=fb.random.key(3))
    b = looped.init(params(), key=fb.random.key(3))
    for _ in range(5):
        a, b = vmapped.update(a, quad), looped.update(b, quad)
    torch.testing.assert_close(a.best_loss, b.best_loss)
    torch.testing.assert_close(population(a), population(b))


def test_an_evaluator_of_rows_is_handed_the_rows_and_gives_gradients_as_rows():
    """One (N, D) tensor to batch however many leaves the params have, as the default has."""
    shapes = []

    def by_rows(loss_fn, population, *args):
        shapes.append(tuple(population.shape))
        grads, losses = torch.func.vmap(torch.func.grad_and_value(loss_fn))(population, *args)
        return losses, grads

    by_rows.takes_rows = True
    kwargs = dict(population_size=6, gradient_weight=0.7, grad_mask={"a": True, "b": False})
    default, rowwise = fb.hybrid_bfo(**kwargs), fb.hybrid_bfo(**kwargs, evaluator=by_rows)
    a = default.init(params(), key=fb.random.key(3))
    b = rowwise.init(params(), key=fb.random.key(3))
    for _ in range(5):
        a, b = default.update(a, quad), rowwise.update(b, quad)
    assert set(shapes) == {(6, 5)}  # D = 3 + 2
    assert_trees_equal(a, b)


def test_no_leaf_requiring_grad_is_refused_when_the_mask_comes_from_requires_grad():
    """Detached params would silently make the hybrid adaptive_bfo paying for gradients."""
    with pytest.raises(ValueError, match=r"none does .*grad_mask=True"):
        fb.hybrid_bfo(population_size=4).init(params(), key=fb.random.key(0))


def test_module_loss_params_need_a_mask_and_take_one_from_the_module():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    model[0].requires_grad_(False)  # a frozen layer: gradient-free
    params, loss_fn = fb.module_loss(model, torch.nn.functional.mse_loss)
    with pytest.raises(ValueError, match=r"grad_mask=None"):  # detached copies
        fb.hybrid_bfo(population_size=4).init(params, key=fb.random.key(0))
    mask = {n: p.requires_grad for n, p in model.named_parameters()}  # module_loss's advice
    opt = fb.hybrid_bfo(population_size=4, grad_mask=mask)
    state = opt.init(params, key=fb.random.key(0))
    assert list(leaf_flags(state).values()) == [False, False, True, True]
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    state = opt.update(state, loss_fn, x, y)
    assert (state.grad_norms > 0).all()


@pytest.mark.parametrize("evaluator", [fb.evaluate.vmap(), fb.evaluate.loop()],
                         ids=["vmap", "loop"])
def test_an_evaluator_that_does_not_differentiate_is_named(evaluator):
    opt = fb.hybrid_bfo(population_size=4, grad_mask=True, evaluator=evaluator)
    with pytest.raises(ValueError, match=r"evaluator must differentiate loss_fn"):
        opt.update(opt.init(params(), key=fb.random.key(0)), quad)


def test_an_evaluator_returning_losses_only_is_named():
    opt = fb.hybrid_bfo(population_size=4, grad_mask=True,
                        evaluator=lambda loss_fn, population: torch.zeros(4))
    with pytest.raises(TypeError, match="must return \\(losses, grads\\)"):
        opt.update(opt.init(params(), key=fb.random.key(0)), quad)


def test_trains_an_mlp_on_digits_to_90_percent():
    """scikit-learn's digits ship with the package (no download); 64-32-10 MLP, ~5 s."""
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, test = order[:1400], order[1400:]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
    params, loss_fn = fb.module_loss(model, torch.nn.functional.cross_entropy)
    opt = fb.hybrid_bfo(population_size=8, gradient_weight=0.7, grad_mask=True, step_size=0.5,
                        step_size_max=5.0, init_scale=0.1)
    state = opt.init(params, key=fb.random.key(0))
    state = fb.run(opt, state, loss_fn, x[train], y[train], max_steps=150)
    logits = torch.func.functional_call(model, state.best_params, (x[test],))
    assert (logits.argmax(1) == y[test]).float().mean() >= 0.90


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_leaf_dtypes_are_kept_with_momentum(dtype):
    opt = fb.hybrid_bfo(population_size=4, grad_mask=True, momentum=0.9)
    p = {"a": torch.zeros(3, dtype=dtype), "b": torch.zeros(2, dtype=dtype)}
    state = opt.init(p, key=fb.random.key(9))
    for _ in range(3):
        new = opt.update(state, lambda q: quad({k: v.float() for k, v in q.items()}))
        for old_leaf, new_leaf in zip(state, new):
            if isinstance(old_leaf, torch.Tensor):
                assert old_leaf.dtype == new_leaf.dtype
        grads = fb.as_params(new, new.grads)
        assert grads["a"].dtype == dtype and population(new)["b"].dtype == dtype
        state = new


@pytest.mark.parametrize("seed", range(4))
def test_a_scored_start_gives_bacterium_0_its_gradient_in_the_first_tumble(seed):
    slope = torch.tensor([1.0, -3.0, 0.5, 2.0])
    opt = fb.hybrid_bfo(population_size=4, swim_length=2, gradient_weight=1.0, grad_mask=True)
    params = {"x": torch.tensor([0.5, -1.0, 2.0, 0.0])}
    state = opt.init(params, key=fb.random.key(seed))
    state = fb.with_start_loss(state, (params["x"] * slope).sum(), grad={"x": slope})
    new = opt.update(state, lambda p: (p["x"] * slope).sum())
    moved = population(new)["x"][0] - params["x"]
    assert float(torch.nn.functional.cosine_similarity(moved, -slope, dim=0)) > 0.999
    assert int(new.num_evals) == 1 + 4 * 3


def test_with_start_loss_is_for_the_start_only():
    opt = fb.hybrid_bfo(population_size=4, grad_mask=True)
    state = opt.init({"x": torch.zeros(2)}, key=fb.random.key(0))
    nan = fb.with_start_loss(state, float("nan"))
    assert bool(torch.isnan(nan.losses[0])) and float(nan.best_loss) == float("inf")
    moved = opt.update(state, lambda p: p["x"].sum())
    with pytest.raises(ValueError, match="right after init"):
        fb.with_start_loss(moved, 1.0)
    plain = fb.bfo(population_size=4).init({"x": torch.zeros(2)}, key=fb.random.key(0))
    with pytest.raises(TypeError, match="hybrid_bfo"):
        fb.with_start_loss(plain, 1.0, grad={"x": torch.zeros(2)})
