"""The torch.optim adapters: closures, gradients, groups, schedulers, checkpoints, budgets."""

import io
import math
from contextlib import nullcontext

import optree
import pytest
import torch
from helpers import leaf_flags, population
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.utils import counters

import functional_bfo as fb
from functional_bfo.adapters import BFO, AdaptiveBFO, HybridBFO

CLASSES = [BFO, AdaptiveBFO, HybridBFO]
SMALL = dict(population_size=6)
CUDA = [pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                      reason="no CUDA device"))]
DEVICES = ["cpu"] + CUDA


def target(n=5, dtype=torch.float32, device="cpu"):
    return torch.linspace(-1, 1, n, dtype=dtype, device=device)


def quad_closure(params, t, backward=False, opt=None, as_item=True):
    def closure():
        if opt is not None:
            opt.zero_grad()
        loss = sum(((p.float() - t) ** 2).sum() for p in params)
        if backward:
            loss.backward()
        return loss.item() if as_item else loss
    return closure


def fresh(n=5, requires_grad=True, dtype=torch.float32, device="cpu"):
    return torch.nn.Parameter(torch.zeros(n, dtype=dtype, device=device),
                              requires_grad=requires_grad)


def core_state(opt, group=0):
    """A group's core state, from where torch's state_dict finds it."""
    return opt.state[opt.param_groups[group]["params"][0]]["swarm"]


# ----- the seed snippets ---------------------------------------------------------------------

def test_seed_000_snippet_runs():
    """Seed 000's failing snippet, with only the import line changed."""
    x = torch.nn.Parameter(torch.randn(10), requires_grad=False)
    opt = HybridBFO([x])

    def closure():
        return (x ** 2).sum().item()

    loss = opt.step(closure)  # Error occurs here (in the seed's package)
    assert isinstance(loss, float) and math.isfinite(loss)
    assert loss == pytest.approx((x ** 2).sum().item())


# ----- closures and gradients ----------------------------------------------------------------

@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("scenario", ["all", "none", "mixed"])
@pytest.mark.parametrize("backward", [True, False])
def test_every_gradient_scenario_steps_and_keeps_the_best(cls, scenario, backward):
    flags = {"all": (True, True), "none": (False, False), "mixed": (True, False)}[scenario]
    a, b = fresh(requires_grad=flags[0]), fresh(requires_grad=flags[1])
    t = target()
    opt = cls([a, b], **SMALL, seed=1)
    closure = quad_closure([a, b], t, backward=backward and any(flags), opt=opt)
    first = opt.step(closure)
    for _ in range(4):
        loss = opt.step(closure)
    assert loss <= first
    assert loss == pytest.approx(closure(), rel=1e-6)  # the model holds the best
    assert opt.best_fitness == loss


def test_hybrid_reads_requires_grad_at_every_step():
    a, b = fresh(), fresh(requires_grad=False)
    opt = HybridBFO([a, b], **SMALL, seed=0)
    closure = quad_closure([a, b], target(), backward=True, opt=opt)
    opt.step(closure)
    assert leaf_flags(core_state(opt)) == [True, False]
    a.requires_grad_(False)
    b.requires_grad_(True)
    opt.step(closure)
    assert leaf_flags(core_state(opt)) == [False, True]
    assert bool(core_state(opt).grad_known.any())  # b's gradients came through


def test_hybrid_takes_the_sparse_gradients_of_an_embedding():
    """nn.Embedding(sparse=True) hands its gradient as a sparse tensor: densified, it steers."""
    torch.manual_seed(0)
    emb, lin = torch.nn.Embedding(10, 3, sparse=True), torch.nn.Linear(3, 1)
    opt = HybridBFO([*emb.parameters(), *lin.parameters()], population_size=4, seed=0,
                    gradient_weight=0.9)
    words = torch.tensor([1, 2, 3])

    def closure():
        opt.zero_grad()
        loss = (lin(emb(words)) - 1).square().mean()
        loss.backward()
        assert emb.weight.grad is None or emb.weight.grad.is_sparse
        return loss

    first = opt.step(closure)
    for _ in range(10):
        last = opt.step(closure)
    assert last < first and bool(core_state(opt).grad_known.any())


def test_hybrid_closure_gradients_are_per_candidate():
    """Gradients are cleared before each candidate, so each is the candidate's own."""
    a = fresh(n=3)
    t = target(3)
    opt = HybridBFO([a], population_size=4, seed=0, gradient_weight=1.0)

    def closure():  # no zero_grad: the adapter must not let gradients pile up
        loss = ((a - t) ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    state = core_state(opt)
    expected = 2 * (population(state)[0] - t)
    known = state.grad_known
    torch.testing.assert_close(fb.as_params(state, state.grads)[0][known], expected[known])


@pytest.mark.parametrize("cls", CLASSES)
def test_closure_return_types_give_the_same_trajectory(cls):
    results = []
    for kind in ["float", "0d", "1elem", "graph"]:
        a = fresh()
        t = target()
        opt = cls([a], **SMALL, seed=3)

        def closure(a=a, t=t, kind=kind):
            loss = ((a - t) ** 2).sum()
            return {"float": loss.item(), "0d": loss.detach(), "1elem": loss.reshape(1),
                    "graph": loss}[kind]

        for _ in range(3):
            opt.step(closure)
        results.append(a.detach().clone())
    for r in results[1:]:
        torch.testing.assert_close(r, results[0])


@pytest.mark.parametrize("bad,error,match", [
    (lambda: None, TypeError, "return loss"),
    (lambda: "0.5", TypeError, "str"),
    (lambda: torch.ones(2), TypeError, "shape \\(2,\\)"),
    (lambda: torch.tensor(True), TypeError, "torch.bool"),
])
def test_bad_closure_returns_are_named(bad, error, match):
    a = fresh()
    before = a.detach().clone()
    opt = BFO([a], **SMALL, seed=0)
    with pytest.raises(error, match=match):
        opt.step(bad)
    torch.testing.assert_close(a.detach(), before)  # the parameters are not corrupted


@pytest.mark.parametrize("cls", CLASSES)
def test_nonfinite_losses_rank_last(cls):
    a = fresh()
    t = target()
    opt = cls([a], **SMALL, seed=2)

    def closure():  # NaN on half the space, inf on another part
        loss = ((a - t) ** 2).sum()
        if a[0] > 0.05:
            return math.nan
        return math.inf if a[1] > 0.5 else loss.item()

    for _ in range(5):
        loss = opt.step(closure)
    assert math.isfinite(loss) and bool(torch.isfinite(a).all())
    assert a[0] <= 0.05 and a[1] <= 0.5


def test_a_raising_closure_restores_the_parameters_and_says_where():
    a = fresh()
    t = target()
    opt = AdaptiveBFO([a], **SMALL, seed=0)
    opt.step(quad_closure([a], t))
    before = a.detach().clone()
    calls = 0

    def closure():
        nonlocal calls
        calls += 1
        if calls == 4:
            raise KeyError("data loader ran dry")
        return ((a - t) ** 2).sum().item()

    with pytest.raises(KeyError, match="data loader ran dry") as info:
        opt.step(closure)
    torch.testing.assert_close(a.detach(), before)
    if hasattr(info.value, "__notes__"):
        assert "restored" in info.value.__notes__[0]


# ----- parity with the functional core --------------------------------------------------------

def _core_run(factory, kwargs, n_steps, seed, loss_fn, params):
    opt = factory(**kwargs)
    state = opt.init([p.detach().clone() for p in params],
                     key=fb.random.fold_in(fb.random.key(seed), 0))
    for _ in range(n_steps):
        state = opt.update(state, loss_fn)
    return state


@pytest.mark.parametrize("cls,factory,extra", [
    (BFO, fb.bfo, dict(evaluator=fb.evaluate.loop())),
    (AdaptiveBFO, fb.adaptive_bfo, dict(evaluator=fb.evaluate.loop())),
    (HybridBFO, fb.hybrid_bfo, dict(grad_mask=True)),
])
@pytest.mark.parametrize("path", ["closure", "loss_fn"])
def test_adapter_trajectory_equals_the_core(cls, factory, extra, path):
    torch.manual_seed(0)
    a = fresh(dtype=torch.float64)
    t = target(dtype=torch.float64)
    kwargs = dict(population_size=6, chemotaxis_steps=3)
    opt = cls([a], **kwargs, seed=7, reevaluate=False)
    for _ in range(8):
        if path == "closure":
            opt.step(quad_closure([a], t, backward=cls is HybridBFO, opt=opt, as_item=False))
        else:
            opt.step(loss_fn=lambda p: ((p[0] - t) ** 2).sum())
    state = _core_run(factory, {**kwargs, **extra}, 8, 7,
                      lambda p: ((p[0] - t) ** 2).sum(), [fresh(dtype=torch.float64)])
    ours = core_state(opt)
    torch.testing.assert_close(population(ours)[0], population(state)[0])
    torch.testing.assert_close(ours.best_loss, state.best_loss)
    settling = 8 if path == "closure" else 0  # the passes at the best that end closure steps
    assert opt.num_evals == int(ours.num_evals) == int(state.num_evals) + settling
    torch.testing.assert_close(a.detach(), state.best_params[0])


def test_fast_path_gets_named_params_for_functional_call():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    opt = AdaptiveBFO(model.named_parameters(), population_size=8, seed=0)

    def loss_fn(params):
        assert sorted(params) == ["bias", "weight"]
        return torch.nn.functional.mse_loss(torch.func.functional_call(model, params, (x,)), y)

    first = opt.step(loss_fn=loss_fn)
    for _ in range(10):
        loss = opt.step(loss_fn=loss_fn)
    assert loss < first
    with torch.no_grad():
        assert loss == pytest.approx(torch.nn.functional.mse_loss(model(x), y).item(), rel=1e-5)


def test_reevaluate_scores_the_incumbent_on_the_new_objective():
    """A lucky minibatch cannot freeze the model: each step rescores where it stands."""
    a = fresh()
    offset = {"value": -100.0}  # the first objective is far below the later ones
    opt = BFO([a], **SMALL, seed=0)

    def closure():
        return (((a - 1) ** 2).sum() + offset["value"]).item()

    opt.step(closure)
    offset["value"] = 0.0
    loss = opt.step(closure)
    assert loss > -50  # the stale best of -100 was replaced by an honest score
    assert loss == pytest.approx(closure(), rel=1e-6)


# ----- param groups, schedulers -----------------------------------------------------------------

def test_param_groups_are_separate_swarms_with_their_own_settings():
    a, b = fresh(), fresh()
    t = target()
    opt = BFO([{"params": [a], "lr": 0.05}, {"params": [b]}], **SMALL, seed=0)
    closure = quad_closure([a, b], t)
    opt.step(closure)
    assert float(core_state(opt, 0).hyperparams.step_size) == pytest.approx(0.05)
    assert float(core_state(opt, 1).hyperparams.step_size) == pytest.approx(0.1)
    swarms = int(core_state(opt, 0).num_evals) + int(core_state(opt, 1).num_evals)
    assert opt.num_evals == swarms  # the pass at the best that ends the step: the last's


def test_group_edits_take_effect_at_the_next_step():
    a = fresh()
    opt = AdaptiveBFO([a], **SMALL, seed=0)
    closure = quad_closure([a], target())
    opt.step(closure)
    opt.param_groups[0]["elimination_prob"] = 0.1
    opt.param_groups[0]["lr"] = 0.5
    opt.step(closure)
    hp = core_state(opt).hyperparams
    assert float(hp.elimination_prob) == pytest.approx(0.1)
    assert float(hp.step_size_max) == pytest.approx(0.5)


def test_defaults_are_the_new_groups_defaults_as_in_torch():
    a, b = fresh(), fresh()
    opt = AdaptiveBFO([a], **SMALL, seed=0)
    opt.defaults["lr"] = 0.25
    opt.add_param_group({"params": [b]})
    assert [g["lr"] for g in opt.param_groups] == [1.0, 0.25]


def test_seed_bfo_scheduler_runs_and_takes_effect():
    """The integration guide's BFOScheduler with the migration table's lines: it writes the
    param groups, as torch's schedulers do, and the settings have their names here."""
    class BFOScheduler:
        def __init__(self, optimizer, schedule_fn):
            self.optimizer = optimizer
            self.schedule_fn = schedule_fn
            self.epoch = 0

        def step(self):
            # Update BFO parameters
            params = self.schedule_fn(self.epoch)
            for key, value in params.items():
                if key in self.optimizer.defaults:
                    for group in self.optimizer.param_groups: group[key] = value  # noqa: E701
            self.epoch += 1

    def schedule(epoch):
        return {
            'lr': 0.1 * (0.95 ** epoch),
            'elimination_prob': min(0.5, 0.25 * (1.05 ** epoch))
        }

    a = fresh()
    optimizer = AdaptiveBFO([a], **SMALL, seed=0)
    closure = quad_closure([a], target())
    scheduler = BFOScheduler(optimizer, schedule)
    num_epochs = 3
    for _ in range(num_epochs):
        optimizer.step(closure)  # train_epoch()
        scheduler.step()
    optimizer.step(closure)
    hp = core_state(optimizer).hyperparams
    assert float(hp.step_size_max) == pytest.approx(0.1 * 0.95 ** 2)
    assert float(hp.elimination_prob) == pytest.approx(0.25 * 1.05 ** 2)


def test_torch_lr_schedulers_drive_the_step_size():
    a = fresh()
    opt = BFO([a], **SMALL, seed=0)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    closure = quad_closure([a], target())
    for _ in range(3):
        opt.step(closure)
        scheduler.step()
    opt.step(closure)
    assert float(core_state(opt).hyperparams.step_size) == pytest.approx(0.1 * 0.5 ** 3)


def test_structural_and_invalid_edits_are_rejected():
    a = fresh()
    opt = BFO([a], **SMALL, seed=0)
    closure = quad_closure([a], target())
    opt.step(closure)
    opt.param_groups[0]["population_size"] = 12
    with pytest.raises(ValueError, match="population_size.*cannot change"):
        opt.step(closure)
    opt.param_groups[0]["population_size"] = 6
    opt.param_groups[0]["elimination_prob"] = 1.5
    with pytest.raises(ValueError, match="Invalid elimination_prob"):
        opt.step(closure)


def test_add_param_group_adds_a_swarm():
    a, b = fresh(), fresh()
    t = target()
    opt = BFO([a], **SMALL, seed=0)
    opt.step(quad_closure([a, b], t))
    opt.add_param_group({"params": [b], "elimination_prob": 0.5})
    assert opt.param_groups[1]["elimination_prob"] == 0.5
    first = opt.step(quad_closure([a, b], t))
    for _ in range(3):
        loss = opt.step(quad_closure([a, b], t))
    assert loss <= first and bool((b != 0).any())
    with pytest.raises(TypeError, match=r"call them \['elimination_prob'\]"):
        opt.add_param_group({"params": [fresh()], "elim_prob": 0.5})
    with pytest.raises(TypeError, match=r"call them \['lr'\]"):
        opt.add_param_group({"params": [fresh()], "step_size": 0.5})
    assert len(opt.param_groups) == 2


# ----- checkpoints ------------------------------------------------------------------------------

def _roundtrip(sd):
    buffer = io.BytesIO()
    torch.save(sd, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("cls", CLASSES)
def test_resume_from_a_state_dict_equals_never_stopping(cls):
    t = target()
    a = fresh()
    opt = cls([a], **SMALL, seed=4)
    for _ in range(6):
        opt.step(quad_closure([a], t, backward=True, opt=opt))
    straight = a.detach().clone()

    b = fresh()
    first = cls([b], **SMALL, seed=4)
    for _ in range(3):
        first.step(quad_closure([b], t, backward=True, opt=first))
    saved, weights = _roundtrip(first.state_dict()), b.detach().clone()

    c = torch.nn.Parameter(weights.clone())
    resumed = cls([c], **SMALL, seed=99)  # the seed comes back from the state dict
    resumed.load_state_dict(saved)
    for _ in range(3):
        resumed.step(quad_closure([c], t, backward=True, opt=resumed))
    torch.testing.assert_close(c.detach(), straight, rtol=0, atol=0)
    assert resumed.num_evals == opt.num_evals


@pytest.mark.parametrize("cls", CLASSES)
def test_a_state_dict_of_minibatch_training_loads_after_every_step(cls):
    """Each step's batch differs, so the best is rescored on it and need not be the least of
    the losses the swarm scored on earlier batches: every step's state dict resumes exactly."""
    batches = [target() * (1 + (k % 3)) - 0.2 * k for k in range(8)]
    a = fresh()
    opt = cls([a], **SMALL, seed=4)
    saved, after = [], []
    for t in batches:
        opt.step(quad_closure([a], t, backward=True, opt=opt))
        saved.append(_roundtrip(opt.state_dict()))
        after.append(a.detach().clone())
    for k in range(len(batches) - 2):
        c = torch.nn.Parameter(after[k].clone())
        resumed = cls([c], **SMALL, seed=99)
        resumed.load_state_dict(saved[k])
        for t in batches[k + 1:k + 3]:
            resumed.step(quad_closure([c], t, backward=True, opt=resumed))
        assert torch.equal(c.detach(), after[k + 2])


@pytest.mark.parametrize("cls", CLASSES)
def test_per_leaf_tensor_bounds_resume_from_a_state_dict(cls):
    """torch's load copies the param groups, bounds and all: equal bounds are not edited."""
    t, bounds = target(), [(torch.full((5,), -2.0), torch.linspace(1.0, 2.0, 5))]
    a = fresh()
    opt = cls([a], **SMALL, seed=4, bounds=bounds)
    for _ in range(2):
        opt.step(quad_closure([a], t, backward=True, opt=opt))
    saved, weights = _roundtrip(opt.state_dict()), a.detach().clone()
    for _ in range(2):
        opt.step(quad_closure([a], t, backward=True, opt=opt))
    c = torch.nn.Parameter(weights)
    resumed = cls([c], **SMALL, seed=99, bounds=bounds)
    resumed.load_state_dict(saved)
    for _ in range(2):
        resumed.step(quad_closure([c], t, backward=True, opt=resumed))
    assert torch.equal(c.detach(), a.detach())


@pytest.mark.parametrize("cls", CLASSES)
def test_a_state_dict_of_before_the_first_step_then_a_new_lr_resumes_exactly(cls):
    """What lr_find does: saved before any step, loaded, then the lr a fit sets; the swarm
    starts at the first step, from the lr then, as in the optimizer never saved."""
    a, b = fresh(), fresh()
    opt = cls([a], **SMALL, lr=1e-3, seed=0)
    resumed = cls([b], **SMALL, lr=1e-3, seed=0)
    resumed.load_state_dict(_roundtrip(opt.state_dict()))
    for o, p in ((opt, a), (resumed, b)):
        o.param_groups[0]["lr"] = 0.1
        for _ in range(3):
            o.step(quad_closure([p], target(), backward=True, opt=o))
    assert torch.equal(a, b)


def test_state_dict_roundtrips_exactly():
    a = fresh()
    opt = HybridBFO([a], **SMALL, seed=1)
    for _ in range(3):
        opt.step(quad_closure([a], target(), backward=True, opt=opt))
    sd = opt.state_dict()
    other = HybridBFO([fresh()], **SMALL, seed=2)
    other.load_state_dict(_roundtrip(sd))
    again = other.state_dict()
    assert again["param_groups"] == sd["param_groups"]
    assert optree.tree_structure(again) == optree.tree_structure(sd)
    for x, y in zip(optree.tree_leaves(again), optree.tree_leaves(sd)):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        else:
            assert x == y or (x != x and y != y)


@pytest.mark.parametrize("make,match", [
    (lambda: BFO([fresh(n=4)], **SMALL), "shape|differ"),
    (lambda: BFO([fresh(), fresh()], **SMALL), "same optimizer and params structure"),
    (lambda: AdaptiveBFO([fresh()], **SMALL), "record is of 'BFO'"),
    (lambda: BFO([fresh(dtype=torch.float64)], **SMALL), "differ"),
])
def test_mismatched_state_dicts_are_rejected(make, match):
    a = fresh()
    opt = BFO([a], **SMALL, seed=0)
    opt.step(quad_closure([a], target()))
    with pytest.raises(ValueError, match=match):
        make().load_state_dict(opt.state_dict())
    with pytest.raises(ValueError, match="Not a state dict of BFO"):
        BFO([fresh()]).load_state_dict(torch.optim.SGD([fresh()], lr=0.1).state_dict())


@pytest.mark.parametrize("device", CUDA)
def test_state_dict_moves_between_cpu_and_cuda(device):
    t = target()
    a = fresh()
    opt = AdaptiveBFO([a], **SMALL, seed=0)
    for _ in range(2):
        opt.step(quad_closure([a], t))
    b = torch.nn.Parameter(a.detach().to(device))
    moved = AdaptiveBFO([b], **SMALL)
    moved.load_state_dict(_roundtrip(opt.state_dict()))
    moved.step(quad_closure([b], t.to(device)))
    opt.step(quad_closure([a], t))
    torch.testing.assert_close(b.detach().cpu(), a.detach())


# ----- budgets and early stopping --------------------------------------------------------------

def test_max_fe_stops_before_the_budget_and_stops_calling_the_closure():
    a = fresh()
    opt = BFO([a], population_size=4, swim_length=1, seed=0, max_fe=50, reevaluate=False)
    calls = 0
    base = quad_closure([a], target())

    def closure():
        nonlocal calls
        calls += 1
        return base()

    steps = 0
    while not opt.should_stop:
        opt.step(closure)
        steps += 1
    assert opt.stop_reason == "max_fe" and opt.num_evals <= 50 and calls == opt.num_evals
    assert steps == 5  # 4 * 2 candidates and the pass at the best: 9 evaluations per step
    opt.step(closure)
    assert calls == opt.num_evals  # a stopped optimizer evaluates nothing


@pytest.mark.parametrize("grow", ["a paused group resumes", "a group is added"])
def test_max_fe_holds_when_more_groups_step_than_before(grow):
    """The next step's cost is counted over the groups it steps, not the last step's."""
    a, b = fresh(), fresh()
    groups = [{"params": [a]}] + ([{"params": [b], "lr": 0.0}] if "paused" in grow else [])
    opt = BFO(groups, population_size=4, swim_length=1, seed=0, max_fe=35)
    closure = quad_closure([a, b], target())
    with pytest.warns(RuntimeWarning, match="paused") if "paused" in grow else nullcontext():
        for _ in range(2):  # 10 evaluations a step: 4 * 2 candidates, reevaluate, the best
            opt.step(closure)
    if "paused" in grow:
        opt.param_groups[1]["lr"] = 0.1
    else:
        opt.add_param_group({"params": [b]})
    while not opt.should_stop:
        opt.step(closure)
    assert opt.stop_reason == "max_fe" and opt.num_evals == 20  # both groups: 19 more, past 35


def test_reevaluate_false_refuses_a_second_stepping_group():
    """Each group's best was scored with the others' values of its own step: without the
    rescore a stale best can be kept over a better one, so two groups need reevaluate."""
    a, b = fresh(), fresh()
    opt = BFO([{"params": [a]}, {"params": [b]}], **SMALL, seed=0, reevaluate=False)
    with pytest.raises(ValueError, match=r"reevaluate=False needs one .* 2 .*reevaluate=True"):
        opt.step(quad_closure([a, b], target()))
    assert opt.num_evals == 0 and not a.detach().any() and not b.detach().any()
    opt.param_groups[1]["lr"] = 0.0  # paused: one group steps
    with pytest.warns(RuntimeWarning, match="paused"):
        opt.step(quad_closure([a, b], target()))
    assert opt.num_evals > 0


def test_target_loss_and_patience_stop():
    a = fresh()
    opt = AdaptiveBFO([a], **SMALL, seed=0, target_loss=1.0)
    while not opt.should_stop:
        loss = opt.step(quad_closure([a], target()))
    assert opt.stop_reason == "target_loss" and loss <= 1.0
    b = fresh()
    opt = BFO([b], **SMALL, seed=0, patience=2)
    flat = lambda: 1.0  # noqa: E731 - nothing ever improves
    for _ in range(5):
        opt.step(flat)
    assert opt.stop_reason == "patience"


# ----- compile --------------------------------------------------------------------------------

def test_compile_fast_path_matches_eager_without_recompiling():
    t = target()
    runs = []
    for compile in (False, True):
        torch.compiler.reset()
        counters.clear()
        a = fresh()
        opt = BFO([a], population_size=4, swim_length=1, seed=0, compile=compile)
        for i in range(4):  # a new lambda every step, as loops write it
            opt.step(loss_fn=lambda p: ((p[0] - t) ** 2).sum())
            if i == 1:
                opt.param_groups[0]["lr"] = 0.05
        runs.append(a.detach().clone())
    torch.testing.assert_close(runs[0], runs[1])
    assert counters["stats"]["unique_graphs"] == 1  # no recompile for new lambdas or edits


def test_compile_failure_is_loud_and_closures_are_refused():
    a = fresh()
    opt = BFO([a], population_size=4, swim_length=1, seed=0, compile=True)

    def breaks_the_graph(p):
        print("a graph break")
        return p[0].sum()

    with pytest.raises(RuntimeError, match="compile=False"):
        opt.step(loss_fn=breaks_the_graph)
    with pytest.raises(ValueError, match="compile=False with closures"):
        opt.step(quad_closure([a], target()))


# ----- dtypes and devices ----------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("cls", CLASSES)
def test_dtypes_are_kept(cls, dtype, device):
    a = fresh(dtype=dtype, device=device)
    t = target(device=device)
    opt = cls([a], **SMALL, seed=0)
    first = opt.step(quad_closure([a], t, backward=True, opt=opt))
    for _ in range(3):
        loss = opt.step(quad_closure([a], t, backward=True, opt=opt))
    opt.step(loss_fn=lambda p: ((p[0].float() - t) ** 2).sum())
    assert a.dtype == dtype and a.device.type == device and loss <= first
    assert population(core_state(opt))[0].dtype == dtype


# ----- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("call,error,match", [
    (lambda opt: opt.step(), TypeError, "needs one callable.*set_closure"),
    (lambda opt: opt.step(lambda: 1.0, loss_fn=lambda p: p[0].sum()), TypeError, "one callable"),
    (lambda opt: opt.step(3), TypeError, "one callable.*got 3"),
    (lambda opt: opt.population, ValueError, "before the first step"),
    (lambda opt: opt.metrics(), ValueError, "param group 0 has no swarm"),
    (lambda opt: opt.metrics(5), ValueError, r"param group 5 has no swarm"),
    (lambda opt: opt.metrics(-1), ValueError, r"param group -1 has no swarm"),
])
def test_bad_calls_are_named(call, error, match):
    opt = BFO([fresh()], **SMALL, seed=0)
    with pytest.raises(error, match=match):
        call(opt)


@pytest.mark.parametrize("make,error,match", [
    (lambda: BFO([]), ValueError, "empty parameter list"),
    (lambda: BFO([fresh()], population_size=0), ValueError, "Invalid population_size"),
    (lambda: BFO([fresh()], elimination_prob=2.0), ValueError, "Invalid elimination_prob"),
    (lambda: BFO([fresh()], elim_prob=0.1), TypeError, r"Unexpected settings \['elim_prob'\]"),
    (lambda: BFO([fresh()], step_size=0.1), TypeError, "lr is the core's step_size"),
    (lambda: AdaptiveBFO([fresh()], step_size_max=0.1), TypeError, "lr is the core's step_size_"),
    (lambda: AdaptiveBFO([fresh()], gradient_weight=0.5), TypeError, "Unexpected"),
    (lambda: HybridBFO([fresh()], gradient_weight=2.0), ValueError, "Invalid gradient_weight"),
    (lambda: BFO([torch.zeros(3, dtype=torch.int64)]), TypeError, "floating"),
    (lambda: BFO([fresh()], max_fe=0), ValueError, "Invalid max_fe"),
    (lambda: BFO([fresh()], compile="yes"), RuntimeError, "Unrecognized mode=yes"),
    (lambda: BFO([fresh()], module=[torch.nn.Linear(1, 1)]), TypeError, "module must be the model"),
    (lambda: BFO([fresh()], evaluator=object()), TypeError, "evaluator must be one of fb.distr"),
    (lambda: BFO([fresh()], chunk_size=0), ValueError, "Invalid chunk_size"),
])
def test_bad_construction_is_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_seed_none_follows_torch_manual_seed():
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        a = fresh()
        opt = BFO([a], **SMALL)
        opt.step(quad_closure([a], target()))
        runs.append(a.detach().clone())
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


def test_seed_api_attributes():
    a = fresh()
    opt = BFO([a], **SMALL, seed=0)
    opt.step(quad_closure([a], target()))
    assert opt.population.shape == (6, 5)
    assert opt._compute_diversity() > 0
    assert isinstance(opt.best_fitness, float)
    torch.testing.assert_close(opt.best_params[0], a.detach())
    assert opt.defaults["population_size"] == 6 and opt.defaults["elimination_prob"] == 0.25
    assert opt.metrics()["num_evals"] == opt.num_evals  # with the pass at the best


# ----- properties --------------------------------------------------------------------------------

@settings(max_examples=10)
@given(cls=st.sampled_from(CLASSES), seed=st.integers(0, 2**20), size=st.integers(1, 6),
       steps=st.integers(1, 4), shift=st.floats(-3, 3))
def test_best_never_increases_and_the_model_holds_it(cls, seed, size, steps, shift):
    """On a fixed objective: monotone best, the parameters score it, same seed same run."""
    runs = []
    for _ in range(2):
        a = torch.nn.Parameter(torch.zeros(size))
        opt = cls([a], population_size=4, seed=seed)

        def closure(a=a):
            return ((a - shift) ** 2).sum() + torch.cos(3 * a).sum()

        losses = [opt.step(closure) for _ in range(steps)]
        assert all(b <= x for x, b in zip(losses, losses[1:]))
        assert losses[-1] == pytest.approx(closure().item(), rel=1e-5, abs=1e-6)
        runs.append(a.detach().clone())
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
