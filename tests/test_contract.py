"""What every optimizer variant must do: one registry, one suite (see tests/variants.py)."""

import optree
import pytest
import torch
import torch._dynamo.testing
from helpers import assert_trees_equal, clone, population, rastrigin, rosenbrock, sphere
from variants import VARIANTS, loss_fn, params, run_updates

import functional_bfo as fb

variants = pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)




@variants
def test_update_keeps_state_structure(variant):
    opt = variant.make()
    state = opt.init(params(), key=fb.random.key(0))
    new = opt.update(state, loss_fn)
    assert type(new) is type(state)
    assert optree.tree_structure(new) == optree.tree_structure(state)
    for x, y in zip(optree.tree_leaves(state), optree.tree_leaves(new)):
        assert (x.shape, x.dtype, x.device) == (y.shape, y.dtype, y.device)
    assert all(isinstance(x, torch.Tensor) for x in optree.tree_leaves(new))


@variants
def test_update_does_not_mutate_inputs(variant):
    opt = variant.make()
    p = params()
    p_copy = clone(p)
    state = opt.init(p, key=fb.random.key(1))
    state = opt.update(state, loss_fn)
    before = clone(state)
    opt.update(state, loss_fn)
    assert_trees_equal(state, before)
    assert_trees_equal(p, p_copy)


@variants
def test_best_loss_never_increases_and_matches_best_params(variant):
    opt = variant.make()
    state = opt.init(params(), key=fb.random.key(2))
    previous = float("inf")
    for _ in range(12):
        state = opt.update(state, loss_fn)
        assert float(state.best_loss) <= previous
        previous = float(state.best_loss)
        torch.testing.assert_close(loss_fn(state.best_params), state.best_loss)


@variants
def test_same_key_same_result_different_key_different_result(variant):
    opt = variant.make()
    a = run_updates(opt, opt.init(params(), key=fb.random.key(3)), 5)
    b = run_updates(opt, opt.init(params(), key=fb.random.key(3)), 5)
    c = run_updates(opt, opt.init(params(), key=fb.random.key(4)), 5)
    assert_trees_equal(a, b)
    assert not torch.equal(population(a)["w"], population(c)["w"])


@variants
def test_initial_params_are_evaluated_first(variant):
    """The first update evaluates the initial params, so the best is never worse than them."""
    opt = variant.make()
    p = {"w": torch.tensor([0.5, 0.5, 0.5]), "b": (torch.full((2, 2), -0.25), torch.tensor(1.0))}
    state = opt.update(opt.init(p, key=fb.random.key(5)), loss_fn)
    assert float(state.best_loss) == 0.0


@variants
def test_vmap_over_states_equals_separate_runs(variant):
    opt = variant.make()
    keys = fb.random.split(fb.random.key(6), 4)
    states = torch.func.vmap(lambda k: opt.init(params(), key=k))(keys)
    step = torch.func.vmap(opt.update, in_dims=(0, None))
    for _ in range(7):  # past reproductions and a dispersal
        states = step(states, loss_fn)
    for i in range(4):
        single = run_updates(opt, opt.init(params(), key=keys[i]), 7)
        batched = optree.tree_map(lambda x, i=i: x[i], states)
        if variant.flags.get("vmap_rounds_matmul"):
            torch.testing.assert_close(batched, single, rtol=0, atol=1e-12, equal_nan=True)
        else:
            assert_trees_equal(batched, single)


@variants
def test_states_of_a_vmapped_init_compile_once_under_a_vmapped_update(variant):
    """A field of constants came out of vmap(init) with stride 0, and the next state's did
    not: the vmapped update compiled twice."""
    opt = variant.make()
    keys = fb.random.split(fb.random.key(6), 3)
    states = torch.func.vmap(lambda k: opt.init(params(), key=k))(keys)
    assert all(0 not in x.stride() for x in optree.tree_leaves(states) if x.numel() > 1)
    torch._dynamo.reset()  # vmap's wrapper is one code object: other variants' entries
    counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
    step = torch.compile(torch.func.vmap(opt.update, in_dims=(0, None)), fullgraph=True,
                         backend=counter)
    for _ in range(3):
        states = step(states, loss_fn)
    assert counter.frame_count == 1


@variants
def test_checkpoint_resume_is_bitwise_identical(variant, tmp_path):
    opt = variant.make()
    state = run_updates(opt, opt.init(params(), key=fb.random.key(8)), 3)
    fb.save(state, tmp_path / "state.pt")
    torch.load(tmp_path / "state.pt", weights_only=True)  # plain tensors only
    like = opt.init(params(), key=fb.random.key(0))
    resumed = fb.load(tmp_path / "state.pt", like=like)
    assert_trees_equal(run_updates(opt, resumed, 4), run_updates(opt, state, 4))


@variants
def test_compile_fullgraph_has_no_graph_breaks_and_matches_eager(variant):
    torch.compiler.reset()
    opt = variant.make()
    state = opt.update(opt.init(params(), key=fb.random.key(9)), loss_fn)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(opt.update, fullgraph=True, backend=counter)  # a break raises
    eager_state, compiled_state = state, state
    for i in range(3):
        eager_state = opt.update(eager_state, loss_fn)
        compiled_state = compiled(compiled_state, loss_fn)
        if i == 0:  # a changed hyperparameter is a tensor value: no recompile either
            eager_state = fb.with_hyperparams(eager_state, step_size=0.15)
            compiled_state = fb.with_hyperparams(compiled_state, step_size=0.15)
    assert counter.frame_count == 1  # compiled once, reused on later calls
    torch.testing.assert_close(compiled_state.population, eager_state.population,
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(compiled_state.best_loss, eager_state.best_loss,
                               rtol=1e-4, atol=1e-6)
    assert torch.equal(compiled_state.num_evals, eager_state.num_evals)


@variants
def test_an_empty_leaf_is_carried_through_eager_and_compiled_updates(variant, monkeypatch):
    monkeypatch.setattr(fb._chemotaxis, "ORDER_POINTS_FROM", 0)  # ordered swims see it too
    torch.compiler.reset()
    opt = variant.make()
    with_empty = {**params(), "empty": torch.zeros(3, 0)}

    def loss(p):
        return loss_fn(p) + p["empty"].sum()
    eager = run_updates(opt, opt.init(with_empty, key=fb.random.key(4)), 3, loss)
    plain = run_updates(opt, opt.init(params(), key=fb.random.key(4)), 3)
    assert torch.equal(plain.losses, eager.losses)  # the empty leaf changes nothing
    state = torch.compile(opt.update, fullgraph=True, backend="aot_eager")(eager, loss)
    assert population(state)["empty"].shape == (state.losses.shape[0], 3, 0)
    assert torch.isfinite(state.best_loss)


@variants
def test_whole_swim_ray_in_one_call_compiles_and_keeps_the_trajectory(variant):
    torch.compiler.reset()
    points = variant.kwargs.get("swim_length", 4) + 1
    opt, batched = variant.make(), variant.make(swim_batch=points)
    state = opt.update(opt.init(params(), key=fb.random.key(9)), loss_fn)
    explain = torch._dynamo.explain(batched.update)(state, loss_fn)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1
    assert_trees_equal(run_updates(batched, state, 4), run_updates(opt, state, 4))


@variants
def test_two_points_per_call_keep_the_trajectory(variant):
    """Points stacked two per evaluator call (the last call holds one): bit for bit the
    trajectory of one point per call, aux, swarming and greedy swims too."""
    opt, paired = variant.make(), variant.make(swim_batch=2)
    state = opt.init(params(), key=fb.random.key(5))
    assert_trees_equal(run_updates(paired, state, 6), run_updates(opt, state, 6))


CONVERGENCE = [  # (problem, max_evals, tolerance on best loss - minimum)
    (sphere(5), 20_000, 0.05),
    (rosenbrock(2), 20_000, 0.05),
    # Canonical BFO's fixed steps settle in a basin next to the global one (2.0 over 6 seeds;
    # 0.02-1.8 with Lévy tumbles): this bounds that, it does not claim the global minimum.
    (rastrigin(3), 30_000, 2.5),
]


@pytest.mark.slow
@variants
@pytest.mark.parametrize("case", CONVERGENCE, ids=lambda c: c[0].name)
def test_converges(variant, case):
    problem, budget, tol = case
    opt = variant.factory(**{**variant.converge, "bounds": problem.bounds})
    state = opt.init({"x": torch.zeros(problem.dim, dtype=torch.float64)}, key=fb.random.key(0))
    state = fb.run(opt, state, problem.loss, max_evals=budget)
    assert float(state.best_loss) - problem.minimum < tol


@variants
@pytest.mark.parametrize("step", [0, 3])
def test_an_updates_candidates_do_not_depend_on_its_losses(variant, step):
    """Every point of every ray is scored whatever the losses, so the candidates of an update
    are known before any loss is: what lets an ask/tell pair hand them out at once."""
    state = run_updates(variant.make(), variant.make().init(params(), key=fb.random.key(1)),
                        step)

    def candidates_under(scores):
        seen = []

        def evaluator(loss_fn, population, *args):
            leaves = optree.tree_leaves(population)
            seen.extend(x.clone() for x in leaves)
            losses = scores(leaves[0].shape[0])
            if variant.flags.get("uses_gradients"):
                return losses, optree.tree_map(lambda x: torch.sin(x * losses.numel()),
                                               population)
            return losses

        variant.make(evaluator=evaluator).update(state, loss_fn)
        return seen

    ranked = candidates_under(lambda n: torch.arange(n, dtype=torch.float64))
    noisy = candidates_under(lambda n: torch.where(torch.arange(n) % 3 == 0, torch.nan,
                                                   torch.randn(n, dtype=torch.float64)))
    assert len(ranked) == len(noisy) and len(ranked) > 0
    assert all(torch.equal(a, b) for a, b in zip(ranked, noisy))
