"""Compiled swims over large candidates evaluate their points in order, values unchanged.

Inductor may fuse independent swim points side by side, or run every point's forward pass
before any backward, keeping every point's activations alive at once; ``_chemotaxis.after``
makes each point depend on the one before (its loss and its gradients) instead.
"""

import functools

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from variants import VARIANTS

import functional_bfo as fb
from functional_bfo import _chemotaxis

SWIM = dict(population_size=16, swim_length=2, chemotaxis_steps=3)
ORDERED_VARIANTS = [v for v in VARIANTS if v.name in ("bfo", "adaptive_bfo", "hybrid_bfo")]
HYBRID = functools.partial(fb.hybrid_bfo, grad_mask=True)


def cosh_loss(p):
    return torch.cosh(p["w"]).sum()


def shifted_sphere(p):
    return (p["w"] - 0.3).square().sum()


def aten_graph(opt, state, loss):
    """The ATen graph AOT autograd hands to inductor, gradients included (no inductor: cheap)."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch.compiler.reset()
    torch.compile(opt.update, fullgraph=True, backend=aot_autograd(fw_compiler=capture))(
        state, loss)
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


def swim_point_order(make, dim: int) -> list[bool]:
    """Whether each swim point's loss (cosh) is computed after the previous point's loss and,
    where the variant takes gradients, after its gradient (sinh)."""
    opt = make(**SWIM)
    state = opt.init({"w": torch.zeros(dim)}, key=fb.random.key(0))
    graph = aten_graph(opt, state, cosh_loss)
    coshes = [n for n in graph.nodes if n.target == torch.ops.aten.cosh.default]
    sinhs = [n for n in graph.nodes if n.target == torch.ops.aten.sinh.default]
    points = SWIM["swim_length"] + 1
    assert len(coshes) == points and len(sinhs) in (0, points)
    return [before in ancestors(later) for before, later in zip(coshes, coshes[1:])] + [
        before in ancestors(later) for before, later in zip(sinhs, coshes[1:])]


@pytest.mark.parametrize("make, depends", [(fb.bfo, [True] * 2),
                                           (HYBRID, [True] * 4)], ids=["bfo", "hybrid"])
def test_large_candidates_are_evaluated_one_point_after_another(make, depends):
    dim = _chemotaxis.ORDER_POINTS_FROM // SWIM["population_size"]
    assert swim_point_order(make, dim) == depends


@pytest.mark.parametrize("make, depends", [(fb.bfo, [False] * 2),
                                           (HYBRID, [False] * 4)], ids=["bfo", "hybrid"])
def test_small_candidates_stay_free_to_fuse(make, depends):
    assert swim_point_order(make, 4) == depends


@pytest.mark.parametrize("variant", ORDERED_VARIANTS, ids=lambda v: v.name)
def test_ordered_compiled_update_matches_eager(variant, monkeypatch):
    monkeypatch.setattr(_chemotaxis, "ORDER_POINTS_FROM", 0)  # order every swim
    torch.compiler.reset()
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


def test_after_keeps_the_values():
    x = torch.tensor([[1.5, -2.0, float("inf")]])
    events = (torch.tensor([False, True, True]), torch.tensor([[float("nan"), 0.0]]),
              torch.zeros(3, 0))  # an empty leaf's gradients
    assert torch.equal(_chemotaxis.after(x, *events), x)


@pytest.mark.parametrize("make", [fb.bfo, fb.adaptive_bfo, HYBRID],
                         ids=["bfo", "adaptive", "hybrid"])
def test_rays_built_up_front_or_point_by_point_give_the_same_run(make, monkeypatch):
    """Small rays build every point at once and take their ends from them; large ones build
    each point when it is evaluated and rebuild the ends: the same bits either way."""

    def run():
        opt = make(**SWIM, bounds=(-1.0, 1.0))
        state = opt.init({"w": torch.full((3,), 0.9), "v": torch.zeros(2, 2)},
                         key=fb.random.key(5))
        for _ in range(2 * SWIM["chemotaxis_steps"] + 1):  # past a reproduction
            state = opt.update(state, lambda p: shifted_sphere(p) + p["v"].square().sum())
        return state

    built = run()
    monkeypatch.setattr(_chemotaxis, "ORDER_POINTS_FROM", 0)  # no ray is built up front
    for a, b in zip(torch.utils._pytree.tree_leaves(built),
                    torch.utils._pytree.tree_leaves(run())):
        assert torch.equal(a, b) or (a.isnan().all() and b.isnan().all())
