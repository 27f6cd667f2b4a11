"""Compiled swims over large candidates evaluate their points in order, values unchanged.

Inductor may fuse independent swim points side by side, keeping every point's activations
alive at once; ``_chemotaxis.after`` makes each point depend on the one before instead.
"""

import pytest
import torch
from variants import VARIANTS

import functional_bfo as fb
from functional_bfo import _chemotaxis

SWIM = dict(population_size=16, swim_length=2, chemotaxis_steps=3)
ORDERED_VARIANTS = [v for v in VARIANTS if v.name in ("bfo", "adaptive_bfo", "hybrid_bfo")]


def cosh_loss(p):
    return torch.cosh(p["w"]).sum()


def shifted_sphere(p):
    return (p["w"] - 0.3).square().sum()


def traced_graph(opt, state, loss):
    """The FX graph dynamo hands to the backend (no inductor: cheap)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    torch.compile(opt.update, fullgraph=True, backend=backend)(state, loss)
    assert len(graphs) == 1
    return graphs[0].graph


def ancestors(node):
    seen, stack = set(), [node]
    while stack:
        for parent in stack.pop().all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def points_depend_on_each_other(dim: int) -> list[bool]:
    opt = fb.bfo(**SWIM)
    state = opt.init({"w": torch.zeros(dim)}, key=fb.random.key(0))
    graph = traced_graph(opt, state, cosh_loss)
    coshes = [n for n in graph.nodes if n.target in (torch.cosh, torch.Tensor.cosh)]
    assert len(coshes) == SWIM["swim_length"] + 1  # one evaluation per swim point
    return [before in ancestors(later) for before, later in zip(coshes, coshes[1:])]


def test_large_candidates_are_evaluated_one_point_after_another():
    dim = _chemotaxis.ORDER_POINTS_FROM // SWIM["population_size"]
    assert points_depend_on_each_other(dim) == [True, True]


def test_small_candidates_stay_free_to_fuse():
    assert points_depend_on_each_other(4) == [False, False]


@pytest.mark.parametrize("variant", ORDERED_VARIANTS, ids=lambda v: v.name)
def test_ordered_compiled_update_matches_eager(variant, monkeypatch):
    monkeypatch.setattr(_chemotaxis, "ORDER_POINTS_FROM", 0)  # order every swim
    torch._dynamo.reset()
    opt = variant.make()
    params = {"w": torch.linspace(-1.0, 1.0, 5)}
    state = opt.init(params, key=fb.random.key(3))
    compiled = torch.compile(opt.update, fullgraph=True)
    eager_state, compiled_state = state, state
    for _ in range(4):
        eager_state = opt.update(eager_state, shifted_sphere)
        compiled_state = compiled(compiled_state, shifted_sphere)
    torch.testing.assert_close(compiled_state.population, eager_state.population,
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(compiled_state.best_params, eager_state.best_params,
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(compiled_state.best_loss, eager_state.best_loss,
                               rtol=1e-4, atol=1e-6)


def test_after_keeps_values_and_follows_the_event():
    x = torch.tensor([[1.5, -2.0, float("inf")]])
    event = torch.tensor([True, False, True])
    assert torch.equal(_chemotaxis.after(x, event), x)
