"""Cycle events run three ways, bitwise the same: skipped, branched (torch.cond), masked."""

import optree
import pytest
import torch
from helpers import assert_trees_equal

import functional_bfo as fb
from functional_bfo._cycle import run_event


def shift(flag, inputs, context):
    """A toy event: ``a`` moves by the context where ``flag`` holds; ``b`` passes through."""
    a, b = inputs
    (c, d) = context
    return torch.where(flag, a + c * d, a), b


def recording_backend(graphs: list):
    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward
    return backend


def operands():
    base = torch.arange(8.0)
    scale = torch.tensor(2.0)
    # views of one tensor and a repeated object: cond takes no aliasing operands
    return (base[:3], base[3:6]), (base[5:8], scale)


@pytest.mark.parametrize("flag", [True, False])
def test_compiled_cpu_event_branches_and_equals_the_masked_event(flag):
    graphs = []
    compiled = torch.compile(lambda f, i, c: run_event(f, shift, i, c), fullgraph=True,
                             backend=recording_backend(graphs))
    inputs, context = operands()
    got = compiled(torch.tensor(flag), inputs, context)
    assert_trees_equal(got, shift(torch.tensor(flag), inputs, context))
    assert "torch.ops.higher_order.cond" in graphs[0]


def test_masked_when_told_not_to_branch():
    graphs = []
    compiled = torch.compile(lambda f, i, c: run_event(f, shift, i, c, branch=False),
                             fullgraph=True, backend=recording_backend(graphs))
    inputs, context = operands()
    assert_trees_equal(compiled(torch.tensor(True), inputs, context),
                       shift(torch.tensor(True), inputs, context))
    assert "cond" not in graphs[0]


def test_eager_false_flag_skips_and_a_tensor_flag_masks():
    inputs, context = operands()
    assert run_event(False, shift, inputs, context) is inputs
    assert_trees_equal(run_event(torch.tensor(True), shift, inputs, context),
                       shift(torch.tensor(True), inputs, context))


def test_compiled_vmap_masks_instead_of_branching():
    flags = torch.tensor([True, False, True])
    a, c = torch.arange(6.0).reshape(3, 2), torch.ones(3, 2)

    def one(f, x, y):
        return run_event(f, shift, (x, x * 0), (y, torch.tensor(3.0)))

    got = torch.compile(torch.func.vmap(one), fullgraph=True)(flags, a, c)
    expected = [one(f, x, y) for f, x, y in zip(flags, a, c)]
    assert_trees_equal(got, optree.tree_map(lambda *xs: torch.stack(xs), *expected))


@pytest.mark.parametrize("make", [
    lambda: fb.bfo(population_size=6, chemotaxis_steps=2, reproduction_steps=2),
    lambda: fb.adaptive_bfo(population_size=8, min_population_size=3, chemotaxis_steps=2),
], ids=["bfo", "adaptive_bfo_varying"])
def test_compiled_updates_branch_on_cpu_and_vmap_over_runs(make):
    """A compiled CPU update runs reproduction under torch.cond; compiled and vmapped over
    runs (a batched step) it masks, and still matches each run on its own."""
    opt = make()
    loss = lambda p: (p["x"] - 0.3).square().sum()  # noqa: E731
    start = {"x": torch.zeros(3)}
    graphs = []
    state = opt.init(start, key=fb.random.key(0))
    torch.compile(opt.update, fullgraph=True, backend=recording_backend(graphs))(state, loss)
    assert "torch.ops.higher_order.cond" in graphs[0]

    keys = fb.random.split(fb.random.key(1), 3)
    states = torch.func.vmap(lambda k: opt.init(start, key=k))(keys)
    update = torch.compile(torch.func.vmap(lambda s: opt.update(s, loss)), fullgraph=True)
    for _ in range(5):  # steps 0..4: reproduction at 2 and 4
        states = update(states)
    for i, k in enumerate(keys):
        single = opt.init(start, key=k)
        for _ in range(5):
            single = opt.update(single, loss)
        # compiled vs eager: the same steps, up to inductor's float rounding
        torch.testing.assert_close(optree.tree_map(lambda x, i=i: x[i], states), single,
                                   rtol=1e-4, atol=1e-5, equal_nan=True)
