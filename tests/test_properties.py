"""Property tests of the optimizers' contract over drawn params pytrees and hyperparameters.

Each example is tiny (a few scalars, at most 8 bacteria, 2-3 updates) so that the file runs
in well under a minute on two cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import optree
import torch
from helpers import assert_trees_equal, clone, population
from hypothesis import given
from hypothesis import strategies as st

import functional_bfo as fb

DTYPES = st.sampled_from([torch.float32, torch.float64])
SHAPES = st.sampled_from([(), (1,), (2,), (3,), (2, 2)])
UPDATES = 3


@st.composite
def leaves(draw, dtype=None):
    shape = draw(SHAPES)
    dtype = dtype or draw(DTYPES)
    n = math.prod(shape)
    values = draw(st.lists(st.floats(-1.0, 1.0, width=32), min_size=n, max_size=n))
    return torch.tensor(values, dtype=dtype).reshape(shape)


def containers(children):
    return st.one_of(
        st.dictionaries(st.sampled_from("abc"), children, min_size=1, max_size=3),
        st.lists(children, min_size=1, max_size=3),
        st.lists(children, min_size=1, max_size=3).map(tuple),
    )


def params_trees(dtype=None):
    """Bare leaves, dicts, lists, tuples, nested; 0-d and small leaves; float32/float64."""
    return st.recursive(leaves(dtype), containers, max_leaves=4)


@dataclass(frozen=True)
class Case:
    params: object
    kwargs: dict
    seed: int
    factory: object = fb.bfo

    @property
    def size(self) -> int:
        return self.kwargs["population_size"]

    def opt(self, **overrides):
        return self.factory(**{**self.kwargs, **overrides})

    def init(self, **overrides):
        return self.opt(**overrides).init(self.params, key=fb.random.key(self.seed))


@st.composite
def cases(draw, bounded=None, dtype=None, min_size=1):
    factory = draw(st.sampled_from([fb.bfo, fb.adaptive_bfo]))
    kwargs = dict(
        population_size=draw(st.integers(min_size, 8)),
        swim_length=draw(st.integers(0, 3)),
        chemotaxis_steps=draw(st.integers(1, 3)),
        elimination_prob=draw(st.floats(0.0, 1.0)),
        step_size=draw(st.floats(0.05, 0.5)),
        tumble=draw(st.sampled_from(["gaussian", "levy"])),
        levy_beta=draw(st.floats(0.3, 1.99)),
    )
    if factory is fb.bfo:
        kwargs.update(reproduction_steps=draw(st.integers(1, 2)), swarming=draw(st.booleans()))
    else:
        kwargs.update(elimination_prob_max=draw(st.floats(0.0, 1.0)),
                      stagnation_steps=draw(st.integers(1, 3)),
                      adaptation_rate=draw(st.floats(0.0, 1.0)))
    if bounded is None:
        bounded = draw(st.booleans())
    if bounded:
        kwargs["bounds"] = (draw(st.floats(-3.0, -0.5)), draw(st.floats(0.5, 3.0)))
        kwargs["boundary"] = draw(st.sampled_from(["clip", "reflect", "wrap"]))
    return Case(draw(params_trees(dtype)), kwargs, draw(st.integers(0, 2**32 - 1)), factory)


def loss_fn(p):
    return sum((x.to(torch.float64) - 0.3).square().sum() for x in optree.tree_leaves(p))


def neg_loss_fn(p):
    return -loss_fn(p)



def run_updates(opt, state, n=UPDATES, fn=loss_fn):
    for _ in range(n):
        state = opt.update(state, fn)
    return state


def compute_dtype(params):
    float64 = any(x.dtype == torch.float64 for x in optree.tree_leaves(params))
    return torch.float64 if float64 else torch.float32


# ---------------------------------------------------------------------------------------------


@given(cases())
def test_init_and_update_never_mutate_their_inputs(case):
    params_before = clone(case.params)
    opt = case.opt()
    state = opt.init(case.params, key=fb.random.key(case.seed))
    assert_trees_equal(case.params, params_before)
    for _ in range(UPDATES):
        before = clone(state)
        new = opt.update(state, loss_fn)
        assert_trees_equal(state, before)
        state = new
    assert_trees_equal(case.params, params_before)


@given(cases())
def test_same_key_gives_bitwise_equal_states(case):
    a = run_updates(case.opt(), case.init())
    b = run_updates(case.opt(), case.init())
    assert_trees_equal(a, b)


@given(cases())
def test_best_loss_never_increases_and_is_the_loss_of_best_params(case):
    opt = case.opt()
    state = opt.init(case.params, key=fb.random.key(case.seed))
    assert float(state.best_loss) == math.inf
    previous = math.inf
    for _ in range(UPDATES):
        state = opt.update(state, loss_fn)
        best = float(state.best_loss)
        assert best <= previous
        previous = best
        torch.testing.assert_close(loss_fn(state.best_params).to(state.best_loss.dtype),
                                   state.best_loss)
        # The best is at least as good as every bacterium's current loss.
        assert bool((state.losses.nan_to_num(math.inf) >= state.best_loss).all())


def assert_inside(tree, low, high, batch_dims):
    for x in optree.tree_leaves(tree):
        assert x.dim() >= batch_dims
        # The box as the leaf's dtype holds it: a bound such as 0.6 has no exact float32.
        lo = torch.tensor(low, dtype=x.dtype)
        hi = torch.tensor(high, dtype=x.dtype)
        assert bool(((x >= lo) & (x <= hi)).all()), (x, low, high)


@given(cases(bounded=True))
def test_bounds_hold_for_population_and_best_after_every_update(case):
    low, high = case.kwargs["bounds"]
    opt = case.opt()
    state = opt.init(case.params, key=fb.random.key(case.seed))
    assert_inside(population(state), low, high, 1)
    assert_inside(state.best_params, low, high, 0)
    for _ in range(UPDATES):
        state = opt.update(state, loss_fn)
        assert_inside(population(state), low, high, 1)
        assert_inside(state.best_params, low, high, 0)


@given(cases())
def test_update_preserves_structure_shapes_and_dtypes(case):
    size = case.size
    opt = case.opt()
    state = opt.init(case.params, key=fb.random.key(case.seed))
    dtype = compute_dtype(case.params)
    spec = optree.tree_structure(case.params)
    state_type = {fb.bfo: fb.BFOState, fb.adaptive_bfo: fb.AdaptiveBFOState}[case.factory]
    for _ in range(UPDATES + 1):
        assert type(state) is state_type
        assert optree.tree_structure(population(state)) == spec
        assert optree.tree_structure(state.best_params) == spec
        for p, x, b in zip(optree.tree_leaves(case.params),
                           optree.tree_leaves(population(state)),
                           optree.tree_leaves(state.best_params)):
            assert (x.shape, x.dtype) == ((size, *p.shape), p.dtype)
            assert (b.shape, b.dtype) == (p.shape, p.dtype)
        for t, shape in ((state.losses, (size,)), (state.health, (size,)),
                         (state.best_loss, ())):
            assert (t.shape, t.dtype) == (shape, dtype)
        for t in (state.step, state.num_evals):
            assert (t.shape, t.dtype) == ((), torch.int64)
        assert (state.key.shape, state.key.dtype) == ((2,), torch.int64)
        for h in state.hyperparams:
            assert (h.shape, h.dtype) == ((), dtype)
        state = opt.update(state, loss_fn)


@given(cases())
def test_num_evals_and_step_grow_by_a_fixed_amount_per_update(case):
    per_update = case.size * (case.kwargs["swim_length"] + 1)
    opt = case.opt()
    state = opt.init(case.params, key=fb.random.key(case.seed))
    assert (int(state.num_evals), int(state.step)) == (0, 0)
    calls = []

    def counting_loss(p):
        calls.append(1)
        return loss_fn(p)

    loop_opt = case.opt(evaluator=fb.evaluate.loop())
    for i in range(1, UPDATES + 1):
        state = opt.update(state, loss_fn)
        assert (int(state.num_evals), int(state.step)) == (i * per_update, i)
    # The counter is the truth: the loop evaluator calls loss_fn exactly that often.
    loop_opt.update(loop_opt.init(case.params, key=fb.random.key(case.seed)), counting_loss)
    assert len(calls) == per_update


@given(cases(), st.data())
def test_chunked_vmap_equals_unchunked_bitwise(case, data):
    chunk = data.draw(st.integers(1, case.size), label="chunk_size")
    whole = run_updates(case.opt(), case.init())
    chunked_opt = case.opt(evaluator=fb.evaluate.vmap(chunk_size=chunk))
    chunked = run_updates(chunked_opt, case.init(evaluator=fb.evaluate.vmap(chunk_size=chunk)))
    assert_trees_equal(chunked, whole)


@given(cases(), st.data())
def test_swim_batch_changes_only_how_candidates_are_grouped(case, data):
    """Any number of swim points per evaluator call: the same trajectory, bitwise."""
    points = case.kwargs["swim_length"] + 1
    batch = data.draw(st.integers(2, points + 1), label="swim_batch")
    rows = []

    def recording(loss_fn, population, *args):
        rows.append(optree.tree_leaves(population)[0].shape[0])
        return fb.evaluate.vmap()(loss_fn, population, *args)

    one = run_updates(case.opt(), case.init())
    grouped = run_updates(case.opt(swim_batch=batch, evaluator=recording), case.init())
    assert_trees_equal(grouped, one)
    calls = -(-points // batch)
    sizes = [min(batch, points - c * batch) * case.size for c in range(calls)]
    assert rows == sizes * UPDATES


@given(cases())
def test_loop_evaluator_matches_vmap_evaluator(case):
    vmapped = run_updates(case.opt(), case.init())
    loop_opt = case.opt(evaluator=fb.evaluate.loop())
    looped = run_updates(loop_opt, case.init(evaluator=fb.evaluate.loop()))
    assert optree.tree_structure(looped) == optree.tree_structure(vmapped)
    for x, y in zip(optree.tree_leaves(looped), optree.tree_leaves(vmapped)):
        assert (x.shape, x.dtype) == (y.shape, y.dtype)
        torch.testing.assert_close(x, y, equal_nan=True)


@given(cases())
def test_maximizing_negated_loss_follows_the_same_path(case):
    low = run_updates(case.opt(), case.init())
    high = run_updates(case.opt(maximize=True), case.init(maximize=True), fn=neg_loss_fn)
    assert_trees_equal(population(high), population(low))
    assert_trees_equal(high.best_params, low.best_params)
    assert_trees_equal(high.health, low.health)
    assert_trees_equal(high.losses, -low.losses)
    assert_trees_equal(high.best_loss, -low.best_loss)
    assert_trees_equal((high.step, high.num_evals), (low.step, low.num_evals))


def fb_random_draws(seed):
    k = fb.random.key(seed)
    return (fb.random.normal(k, (5,)), fb.random.uniform(k, (3,), torch.float64),
            fb.random.split(k, 3), fb.random.fold_in(k, 7))


@given(cases(), st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
def test_global_torch_rng_is_never_read_nor_advanced(case, seed_a, seed_b):
    with torch.random.fork_rng(devices=[]):  # leave the suite's global generator alone
        torch.manual_seed(seed_a)
        reference = run_updates(case.opt(), case.init())
        draws = fb_random_draws(case.seed)

        torch.manual_seed(seed_b)
        opt = case.opt()
        state = opt.init(case.params, key=fb.random.key(case.seed))
        for i in range(UPDATES):
            torch.manual_seed(seed_a ^ seed_b ^ i)
            torch.rand(7)  # reseed and advance the global generator between updates
            state = opt.update(state, loss_fn)
        assert_trees_equal(state, reference)
        assert_trees_equal(fb_random_draws(case.seed), draws)

        # Not even read: init and updates leave the global generator where it was.
        torch.manual_seed(seed_b)
        rng = torch.get_rng_state()
        run_updates(opt, opt.init(case.params, key=fb.random.key(case.seed)))
        fb_random_draws(case.seed)
        assert torch.equal(torch.get_rng_state(), rng)


@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, math.inf, -math.inf]),
                min_size=1, max_size=12),
       st.sampled_from([torch.float32, torch.float64]))
def test_first_min_is_min_dim_0_bit_for_bit(values, dtype):
    """The population's best by two plain reductions equals ``min(dim=0)``: the first of
    equal costs, the element itself (the sign of a tied zero), eager and under vmap."""
    from functional_bfo._tree import first_min

    costs = torch.tensor(values, dtype=dtype)
    value, index = costs.min(dim=0)
    got_value, got_index = first_min(costs)
    assert got_value.shape == got_index.shape == (1,)
    got_value, got_index = got_value[0], got_index[0]
    assert int(got_index) == int(index)
    assert torch.equal(got_value, value) and got_value.signbit() == value.signbit()
    batch = torch.stack([costs, costs.flip(0)])
    values_v, index_v = (x.squeeze(1) for x in torch.func.vmap(first_min)(batch))
    expected_v, expected_i = batch.min(dim=1)
    assert torch.equal(index_v, expected_i) and torch.equal(values_v.signbit(),
                                                           expected_v.signbit())


@given(st.lists(st.integers(1, 3), max_size=3), st.lists(st.integers(1, 3), max_size=3))
def test_a_bounds_shape_broadcasts_as_torch_says(shape, to):
    from functional_bfo._bounds import broadcasts

    try:
        fits = torch.broadcast_shapes(torch.Size(shape), torch.Size(to)) == torch.Size(to)
    except RuntimeError:
        fits = False
    assert broadcasts(tuple(shape), tuple(to)) == fits
