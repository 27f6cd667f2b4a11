"""The torch.optim shell: transactional steps, loads, groups and edits; lr; clean candidates."""

import copy
import io
import math
import warnings

import pytest
import torch
from helpers import population
from torch.func import functional_call

import functional_bfo as fb
from functional_bfo.adapters import BFO, AdaptiveBFO, HybridBFO, evaluating_candidates
from functional_bfo.adapters import optimizers as adapters_optimizers

CLASSES = [BFO, AdaptiveBFO, HybridBFO]
TINY = dict(population_size=3, swim_length=1)  # 3 * 2 + 1 = 7 closure calls per group,
# and one more per step at the best


def two_params(requires_grad=True):
    torch.manual_seed(0)
    return (torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]), requires_grad=requires_grad),
            torch.nn.Parameter(torch.tensor([0.3]), requires_grad=requires_grad))


def make(cls, w, b, groups, **kwargs):
    params = [{"params": [w]}, {"params": [b]}] if groups == 2 else [w, b]
    return cls(params, **TINY, seed=3, **kwargs)


def core_state(opt, group=0):
    """A group's core state, from where torch's state_dict finds it."""
    return opt.state[opt.param_groups[group]["params"][0]]["swarm"]


def loss_of(w, b):
    return (w - 0.25).square().sum() + (b + 1.0).square().sum()


def closure_for(opt, w, b, fail_at=None, error=KeyError):
    calls = [0]

    def closure():
        calls[0] += 1
        if calls[0] == fail_at:
            raise error("the data loader ran dry")
        opt.zero_grad()
        loss = loss_of(w, b)
        if w.requires_grad:
            loss.backward()
        return loss
    return closure


def snapshot(opt, params):
    """Everything a step may change, as plain values."""
    buf, sd = io.BytesIO(), opt.state_dict()
    torch.save(sd["state"], buf)  # the swarms and counters; the settings come last
    return ([p.detach().clone() for p in params], buf.getvalue(), opt.num_evals,
            opt.best_fitness, opt.stop_reason, copy.deepcopy([
                {k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]),
            opt.last_step_evals)


def assert_same(a, b):
    for x, y in zip(a[0], b[0]):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert a[1:] == b[1:]


def fresh_copy(cls, groups, state_dict, w, b):
    """A new optimizer over new params equal to ``w, b``, loaded from ``state_dict``."""
    w2, b2 = two_params()
    other = make(cls, w2, b2, groups)
    other.load_state_dict(state_dict)
    with torch.no_grad():
        w2.copy_(w), b2.copy_(b)
    return other, w2, b2


# ----- a step commits fully or changes nothing ----------------------------------------------

@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("error", [KeyError, KeyboardInterrupt])
def test_a_closure_raising_at_any_call_changes_nothing(cls, groups, error):
    calls_per_step = 7 * groups + 1  # the last call, at the best, may fail too
    for fail_at in range(1, calls_per_step + 1):
        w, b = two_params()
        opt = make(cls, w, b, groups)
        opt.step(closure_for(opt, w, b))
        before = snapshot(opt, [w, b])
        with pytest.raises(error) as info:
            opt.step(closure_for(opt, w, b, fail_at=fail_at, error=error))
        assert "restored" in info.value.__notes__[0]
        assert_same(snapshot(opt, [w, b]), before)
        # The retry equals a run that never saw the fault.
        opt.step(closure_for(opt, w, b))
        w2, b2 = two_params()
        clean = make(cls, w2, b2, groups)
        for _ in range(2):
            clean.step(closure_for(clean, w2, b2))
        assert_same(snapshot(opt, [w, b]), snapshot(clean, [w2, b2]))


@pytest.mark.parametrize("cls", CLASSES)
def test_the_first_step_raising_leaves_no_swarm(cls):
    w, b = two_params()
    opt = make(cls, w, b, 2)
    before = snapshot(opt, [w, b])
    with pytest.raises(KeyError):
        opt.step(closure_for(opt, w, b, fail_at=9))
    assert_same(snapshot(opt, [w, b]), before)
    with pytest.raises(ValueError, match="before the first step"):
        opt.population  # noqa: B018


def test_the_fast_path_raising_changes_nothing():
    w, b = two_params()
    opt = make(AdaptiveBFO, w, b, 2)
    opt.step(loss_fn=lambda p: loss_of(*p))
    before = snapshot(opt, [w, b])
    for bad in (lambda p: loss_of(*p).reshape(1, 1).expand(2, 2),
                lambda p: (_ for _ in ()).throw(KeyboardInterrupt())):
        with pytest.raises((ValueError, KeyboardInterrupt)):
            opt.step(loss_fn=bad)
        assert_same(snapshot(opt, [w, b]), before)


# ----- load_state_dict and add_param_group validate before changing anything ----------------

def with_counter(sd, **entries):
    """``sd`` with the optimizer's own entries (state[0]['optimizer']) edited."""
    entry = {**sd["state"][0], "optimizer": {**sd["state"][0]["optimizer"], **entries}}
    return {**sd, "state": {**sd["state"], 0: entry}}


def with_swarm(sd, **fields):
    """``sd`` with fields of the (one) swarm replaced (None: removed)."""
    swarm = {k: v for k, v in {**sd["state"][0]["swarm"], **fields}.items() if v is not None}
    return {**sd, "state": {**sd["state"], 0: {**sd["state"][0], "swarm": swarm}}}


@pytest.mark.parametrize("bad", [
    lambda sd: {"state": {}, "param_groups": []},
    lambda sd: {"param_groups": sd["param_groups"]},
    lambda sd: AdaptiveBFO([torch.nn.Parameter(torch.zeros(3)),
                            torch.nn.Parameter(torch.zeros(1))], **TINY).state_dict(),
    lambda sd: {**sd, "param_groups": [{**sd["param_groups"][0], "population_size": 0}]},
    lambda sd: with_swarm(sd, leaves=[torch.zeros(5, 3)] + sd["state"][0]["swarm"]["leaves"][1:]),
    lambda sd: with_swarm(sd, digest="0" * 64),
    lambda sd: with_swarm(sd, paths=None),
    lambda sd: {**sd, "state": {}},
    lambda sd: with_counter(sd, best="abc"),
    lambda sd: with_counter(sd, reason=5),
    lambda sd: with_counter(sd, steps=-5.5),
    lambda sd: with_counter(sd, **{"class": "AdaptiveBFO"}),
])
def test_a_rejected_load_changes_nothing(bad):
    w, b = two_params()
    opt = make(BFO, w, b, 1)
    for _ in range(2):
        opt.step(closure_for(opt, w, b))
    good = opt.state_dict()
    before = snapshot(opt, [w, b])
    with pytest.raises(ValueError):
        opt.load_state_dict(bad(good))
    assert_same(snapshot(opt, [w, b]), before)
    opt.step(closure_for(opt, w, b))  # and it goes on as if nothing happened
    w2, b2 = two_params()
    clean = make(BFO, w2, b2, 1)
    for _ in range(3):
        clean.step(closure_for(clean, w2, b2))
    assert_same(snapshot(opt, [w, b]), snapshot(clean, [w2, b2]))


@pytest.mark.parametrize("group,error", [
    ({"params": [torch.nn.Parameter(torch.zeros(2))], "population_size": 0}, ValueError),
    ({"params": [torch.nn.Parameter(torch.zeros(2))], "lr": -1.0}, ValueError),
    ({"params": [torch.zeros(2, dtype=torch.int64)]}, TypeError),
    ({"params": [torch.nn.Parameter(torch.zeros(2))], "step_size": 0.2}, TypeError),
    ({"params": [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(
        torch.zeros(2, device="meta"))]}, ValueError),
])
def test_a_rejected_param_group_is_not_added(group, error):
    w, b = two_params()
    opt = make(BFO, w, b, 1)
    opt.step(closure_for(opt, w, b))
    before = snapshot(opt, [w, b])
    with pytest.raises(error):
        opt.add_param_group(group)
    assert len(opt.param_groups) == 1
    assert_same(snapshot(opt, [w, b]), before)
    opt.step(closure_for(opt, w, b))  # no IndexError


def test_a_malformed_optimizer_entry_is_named():
    w, b = two_params()
    opt = make(BFO, w, b, 1)
    opt.step(closure_for(opt, w, b))
    with pytest.raises(ValueError, match=r"Not a state dict of BFO .*invalid: \['best'\]"):
        opt.load_state_dict(with_counter(opt.state_dict(), best="abc"))


def test_other_group_keys_are_kept_as_torch_keeps_them():
    w, b = two_params()
    named = HybridBFO([{"params": [w], "name": "head"},  # Lightning's LearningRateMonitor
                       {"params": [b], "weight_decay": 0.0}], **TINY)  # Transformers' grouping
    assert named.param_groups[0]["name"] == "head"
    opt = make(HybridBFO, w, b, 1)
    torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=5)  # cycles momentum
    torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1.0)
    torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    assert {"initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum"} <= set(group)
    opt.add_param_group({**group, "params": [torch.nn.Parameter(torch.zeros(2))]})
    assert len(opt.param_groups) == 2


# ----- settings: edits are validated where they are used ----------------------------------

@pytest.mark.parametrize("cls,canonical", [(BFO, "step_size"), (AdaptiveBFO, "step_size_max"),
                                           (HybridBFO, "step_size_max")])
def test_an_invalid_edit_fails_the_step_and_the_next_valid_edit_fixes_it(cls, canonical):
    w, b = two_params()
    opt = make(cls, w, b, 1)
    opt.step(closure_for(opt, w, b))
    group = opt.param_groups[0]
    before = snapshot(opt, [w, b])
    group["lr"] = -1.0
    with pytest.raises(ValueError, match=r"Invalid lr: -1\.0; expected finite values"):
        opt.step(closure_for(opt, w, b))  # the shell's name, not the core's
    assert_same(snapshot(opt, [w, b])[:5], before[:5])
    group["lr"] = 0.05
    opt.step(closure_for(opt, w, b))
    assert float(getattr(core_state(opt).hyperparams, canonical)) == pytest.approx(0.05)
    group["elimination_prob"] = 2.0
    with pytest.raises(ValueError, match="elimination_prob"):
        opt.step(closure_for(opt, w, b))
    group["elimination_prob"] = 0.1
    opt.step(closure_for(opt, w, b))
    assert float(core_state(opt).hyperparams.elimination_prob) == pytest.approx(0.1)


def test_a_shape_setting_cannot_change_after_the_first_step_but_can_be_set_back():
    w, b = two_params()
    opt = make(BFO, w, b, 1)
    opt.step(closure_for(opt, w, b))
    opt.param_groups[0]["population_size"] = 9
    with pytest.raises(ValueError, match="population_size"):
        opt.step(closure_for(opt, w, b))
    opt.param_groups[0]["population_size"] = 3
    opt.step(closure_for(opt, w, b))


@pytest.mark.parametrize("path", ["closure", "fast"])
def test_settings_edited_before_the_first_step_shape_the_swarm(path):
    w, b = two_params()
    opt = make(AdaptiveBFO, w, b, 1)
    opt.param_groups[0]["population_size"] = 5
    for _ in range(2):
        opt.step(closure_for(opt, w, b)) if path == "closure" else opt.step(
            loss_fn=lambda p: loss_of(*p))
    assert opt.population.shape == (5, 4)
    assert opt.num_evals == 2 * (5 * 2 + 1) + (2 if path == "closure" else 0)


# ----- lr --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("lr", [1e-5, 1e-3, 0.01, 0.1, 3.0])
def test_any_positive_lr_constructs_and_caps_every_step(cls, lr):
    w, b = two_params()
    opt = cls([w, b], lr=lr, **TINY, seed=0)
    for _ in range(3):
        opt.step(closure_for(opt, w, b))
    assert opt.metrics()["step_length_max"] <= lr * (1 + 1e-6)


@pytest.mark.parametrize("cls", CLASSES)
def test_an_invalid_lr_is_told_as_lr_at_construction_and_from_a_schedule(cls):
    """The shell takes lr, not the core's step_size / step_size_max: errors say lr."""
    w, b = two_params()
    for lr in (-1.0, math.nan):
        with pytest.raises(ValueError, match=r"Invalid lr: (-1\.0|nan); expected a finite "):
            cls([w, b], lr=lr, **TINY, seed=0)
    opt = cls([w, b], lr=0.1, **TINY, seed=0)
    opt.param_groups[0]["lr"] = -2.0
    with pytest.raises(ValueError, match=r"Invalid lr: -2\.0; expected a finite") as error:
        opt.step(closure_for(opt, w, b))
    assert "step_size" not in str(error.value)


@pytest.mark.parametrize("cls", [AdaptiveBFO, HybridBFO])
def test_a_schedule_below_the_step_size_floor_takes_the_floor_down_with_it(cls):
    """lr caps every step: a decay past step_size_min (1e-7 by default) must not fail."""
    w, b = two_params()
    opt = cls([w, b], lr=1e-3, **TINY, seed=0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 10.0 ** -(2 * i))
    for _ in range(4):
        opt.step(closure_for(opt, w, b))
        sched.step()
    assert opt.metrics()["step_length_max"] <= 1e-9 * (1 + 1e-6)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("schedule", ["cosine", "warmup"])
def test_schedules_reaching_zero_pause_the_group_with_one_warning(cls, schedule):
    w, b = two_params()
    opt = cls([w, b], lr=0.05, **TINY, seed=0)
    if schedule == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2)  # 0.05, 0.025, 0
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, i / 2))  # 0, .5, 1
    lrs, evals = [], []
    with pytest.warns(RuntimeWarning, match="lr=0 is paused") as caught:
        for _ in range(5):
            before = [w.detach().clone(), b.detach().clone()]
            lrs.append(opt.param_groups[0]["lr"])
            opt.step(closure_for(opt, w, b))
            evals.append(opt.num_evals)
            if lrs[-1] == 0:
                assert torch.equal(w, before[0]) and torch.equal(b, before[1])
            sched.step()
    assert len([c for c in caught if "paused" in str(c.message)]) == 1
    assert 0 in lrs and any(lr > 0 for lr in lrs)
    paused = [i for i, lr in enumerate(lrs) if lr == 0]
    for i in paused:
        assert evals[i] == (evals[i - 1] if i else 0)


def test_a_budget_over_paused_groups_returns():
    w, b = two_params()
    opt = BFO([w, b], lr=0.0, **TINY, seed=0)
    with pytest.warns(RuntimeWarning, match="paused"):
        assert math.isnan(opt.step(closure_for(opt, w, b)))
    assert opt.num_evals == 0


def test_telemetry_names_are_not_hyperparameter_names():
    w, b = two_params()
    opt = AdaptiveBFO([w, b], **TINY, seed=0)
    opt.step(closure_for(opt, w, b))
    assert not set(opt.metrics()) & set(opt.defaults)


# ----- candidates leave no trace -------------------------------------------------------------

class Counter(torch.nn.Module):
    """A buffer every forward pass changes, as custom running statistics do."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return x


def bn_model(counter=True):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                               Counter() if counter else torch.nn.Identity(),
                               torch.nn.Linear(4, 1))


def buffers_after_one_forward(model, start_buffers, x):
    """What one train-mode forward pass at the model's params gives from ``start_buffers``."""
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for buf, saved in zip(reference.buffers(), start_buffers):
            buf.copy_(saved)
        reference.train()(x)
    return [buf.clone() for buf in reference.buffers()]


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("path", ["closure", "fast"])
@pytest.mark.parametrize("module", ["none", "model", "wrapped"])
def test_buffers_are_what_one_forward_pass_of_the_best_gives(cls, path, module):
    """By default, and with module= (a DataParallel wrapper unwrapped)."""
    # torch.func.grad refuses a forward pass that writes a captured buffer in place.
    counter = not (cls is HybridBFO and path == "fast")
    model = bn_model(counter).train()
    net = torch.nn.DataParallel(model) if module == "wrapped" else model
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    given = {"none": None, "model": model, "wrapped": net}[module]
    opt = cls(model.named_parameters(), **TINY, seed=0, module=given)
    seen = []

    def closure():
        seen.append(evaluating_candidates())
        opt.zero_grad()
        loss = (net(x) - y).square().mean()
        loss.backward()
        return loss

    def loss_fn(params):
        return (functional_call(model, params, (x,)) - y).square().mean()

    for _ in range(2):
        start = [buf.clone() for buf in model.buffers()]
        opt.step(closure) if path == "closure" else opt.step(loss_fn=loss_fn)
        expected = buffers_after_one_forward(model, start, x)
        for got, want in zip(model.buffers(), expected):
            torch.testing.assert_close(got, want)
    assert int(model[1].num_batches_tracked) == 2
    assert not counter or int(model[2].calls) == 2
    if path == "closure":
        assert seen[-1] is False and seen.count(False) == 2  # each step's last pass only
    assert not evaluating_candidates()


def test_a_plain_closure_leaves_one_forward_pass_in_the_buffers():
    """Without module=, a train-mode BatchNorm counted every candidate's forward pass."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).train()
    x = torch.randn(16, 3)
    opt = BFO(model.parameters(), population_size=8, swim_length=4, seed=0)
    opt.step(lambda: model(x).square().mean())
    assert int(model[1].num_batches_tracked) == 1  # not 8 * 5 + 1 = 41
    assert opt.num_evals == 42


@pytest.mark.parametrize("module", [False, True])
def test_a_failed_step_restores_the_buffers(module):
    model = bn_model().train()
    x = torch.randn(16, 3)
    opt = BFO(model.parameters(), **TINY, seed=0, module=model if module else None)
    start = [buf.clone() for buf in model.buffers()]
    calls = [0]

    def closure():
        calls[0] += 1
        if calls[0] == 4:
            raise KeyError("boom")
        return model(x).square().mean()

    with pytest.raises(KeyError):
        opt.step(closure)
    for got, want in zip(model.buffers(), start):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# ----- HybridBFO's first step ----------------------------------------------------------------

@pytest.mark.parametrize("path", ["closure", "fast"])
@pytest.mark.parametrize("seed", range(6))
def test_hybrid_first_tumble_follows_the_start_gradient(path, seed):
    w = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    slope = torch.tensor([1.0, -3.0, 0.5, 2.0])
    opt = HybridBFO([w], population_size=4, swim_length=2, gradient_weight=1.0, seed=seed,
                    lr=0.1, step_size=0.1)
    start = w.detach().clone()

    def closure():
        opt.zero_grad()
        loss = (w * slope).sum()
        loss.backward()
        return loss

    opt.step(closure) if path == "closure" else opt.step(loss_fn=lambda p: (p[0] * slope).sum())
    moved = population(core_state(opt))[0][0] - start
    cosine = torch.nn.functional.cosine_similarity(moved, -slope, dim=0)
    assert float(cosine) > 0.999
    assert float((w.detach() * slope).sum()) < float((start * slope).sum())


# ----- the state dict ------------------------------------------------------------------------

@pytest.mark.parametrize("cls", CLASSES)
def test_state_dict_has_torch_layout_and_loads_with_weights_only(cls):
    w, b = two_params()
    opt = make(cls, w, b, 2)
    opt.step(closure_for(opt, w, b))
    sd = opt.state_dict()
    assert set(sd) == {"state", "param_groups"}
    assert [g["params"] for g in sd["param_groups"]] == [[0], [1]]
    assert set(sd["state"]) == {0, 1} and sd["state"][1]["swarm"]["leaves"][0].shape == (3, 1)
    assert sd["state"][0]["optimizer"]["class"] == cls.__name__
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    other, w2, b2 = fresh_copy(cls, 2, torch.load(buf, weights_only=True), w, b)
    opt.step(closure_for(opt, w, b))
    other.step(closure_for(other, w2, b2))
    assert_same(snapshot(opt, [w, b]), snapshot(other, [w2, b2]))


def test_torchs_state_dict_hooks_run():
    w, b = two_params()
    opt = make(BFO, w, b, 2)
    opt.step(closure_for(opt, w, b))
    seen = []
    opt.register_state_dict_pre_hook(lambda o: seen.append("save pre"))
    opt.register_state_dict_post_hook(lambda o, sd: {**sd, "note": "kept"})
    sd = opt.state_dict()
    assert seen == ["save pre"] and sd["note"] == "kept"

    def drop_note(o, state_dict):  # a pre-hook may hand back a replacement
        seen.append("load pre")
        return {k: v for k, v in state_dict.items() if k != "note"}
    opt.register_load_state_dict_pre_hook(drop_note)
    opt.register_load_state_dict_post_hook(lambda o: seen.append("load post"))
    opt.load_state_dict(sd)
    assert seen == ["save pre", "load pre", "load post"]


# ----- compile modes -------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [True, "reduce-overhead", "max-autotune"])  # True: default
def test_each_compile_mode_runs_the_fast_path_as_eager_does(mode):
    results = []
    for compile in (False, mode):
        torch.compiler.reset()
        w, b = two_params()
        opt = BFO([w, b], **TINY, seed=0, compile=compile)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. CUDA graphs skipped on the CPU
            for _ in range(2):
                opt.step(loss_fn=lambda p: loss_of(*p))
        results.append(snapshot(opt, [w, b])[0])
    for x, y in zip(*results):
        torch.testing.assert_close(x, y)


def test_invalid_compile_modes_are_named():
    with pytest.raises(RuntimeError, match="reduce-overhead"):  # torch's own message
        BFO([torch.nn.Parameter(torch.zeros(2))], compile="fast")


# ----- edges ---------------------------------------------------------------------------------

def test_a_group_added_later_reaches_the_fast_paths_loss():
    w, b = two_params()
    opt = BFO([w], **TINY, seed=0)
    seen = []

    def loss_fn(p):
        seen.append(len(p))
        return loss_of(*p) if len(p) == 2 else (p[0] - 0.25).square().sum()

    opt.step(loss_fn=loss_fn)
    before = len(seen)
    opt.add_param_group({"params": [b]})
    opt.step(loss_fn=loss_fn)
    assert set(seen[:before]) == {1} and set(seen[before:]) == {2}


@pytest.mark.parametrize("cls", CLASSES)
def test_the_first_best_is_the_loss_of_the_params_it_leaves(cls):
    outside = torch.tensor([5.0, -4.0])  # the best point, outside the box
    w = torch.nn.Parameter(outside.clone())
    opt = cls([w], **TINY, seed=0, bounds=(-1.0, 1.0), reevaluate=True)
    best = opt.step(lambda: float((w.detach() - outside).square().sum()))
    assert best == pytest.approx(float((w.detach() - outside).square().sum()))


def test_a_groups_maximize_is_what_stopping_reads():
    w, b = two_params()
    opt = BFO([{"params": [w, b], "maximize": True}], **TINY, seed=0, target_loss=100.0)
    opt.step(closure_for(opt, w, b))
    assert opt.stop_reason is None  # -loss would have reached it at once


def test_hybrid_keeps_gradients_of_parameters_the_loss_does_not_use():
    w, b = two_params()
    unused = torch.nn.Parameter(torch.zeros(2))
    opt = HybridBFO([w, b, unused], **TINY, seed=0)
    opt.step(closure_for(opt, w, b))
    assert bool(core_state(opt).grad_known.all())


def test_chunk_size_can_change_at_any_step():
    w, b = two_params()
    opt = make(BFO, w, b, 1)
    opt.step(loss_fn=lambda p: loss_of(*p))
    opt.param_groups[0]["chunk_size"] = 2
    opt.step(loss_fn=lambda p: loss_of(*p))
    assert opt._swarms[0].evaluator.chunk_size == 2


@pytest.mark.parametrize("cls", [BFO, HybridBFO])
def test_the_fast_path_takes_the_groups_rows_and_a_closure_its_params(cls):
    """vmap batches one (P, D) tensor per group on the fast path, however many params."""
    w, b = two_params()
    opt = make(cls, w, b, 1)
    opt.step(loss_fn=lambda p: loss_of(*p))
    assert opt._swarms[0].evaluator.takes_rows
    opt._swarms[0].evaluator.closure = lambda: 0.0
    assert not opt._swarms[0].evaluator.takes_rows


def test_a_tensor_lr_works():
    w, b = two_params()
    opt = AdaptiveBFO([w, b], lr=torch.tensor(0.01), **TINY, seed=0)
    opt.step(closure_for(opt, w, b))
    assert opt.metrics()["step_length_max"] <= 0.01 * (1 + 1e-6)


def test_start_losses_keep_their_precision():
    state = fb.bfo(population_size=3).init({"x": torch.zeros(2, dtype=torch.float64)},
                                           key=fb.random.key(0))
    assert float(fb.with_start_loss(state, 0.1).best_loss) == 0.1
    assert float(fb.with_start_loss(state, 2).best_loss) == 2.0


@pytest.mark.parametrize("module", [False, True])
def test_buffers_are_read_at_each_step_so_module_to_is_fine(module):
    model = bn_model().train()
    opt = BFO(model.parameters(), **TINY, seed=0, module=model if module else None)
    model.double()
    x = torch.randn(16, 3, dtype=torch.float64)
    opt.step(lambda: model(x).square().mean())
    assert int(model[1].num_batches_tracked) == 1 and int(model[2].calls) == 1


def test_a_closure_set_beforehand_serves_the_next_closureless_step():
    w, b = two_params()
    opt = make(BFO, w, b, 1)
    with pytest.raises(TypeError, match="set_closure"):
        opt.step()
    opt.set_closure(closure_for(opt, w, b, fail_at=3))
    with pytest.raises(KeyError):
        opt.step()
    assert opt.closure_pending  # a failed step keeps it, as it keeps everything
    opt.set_closure(closure_for(opt, w, b))
    opt.step()
    assert not opt.closure_pending
    w2, b2 = two_params()
    clean = make(BFO, w2, b2, 1)
    clean.step(closure_for(clean, w2, b2))
    assert_same(snapshot(opt, [w, b]), snapshot(clean, [w2, b2]))


def test_a_grad_scaler_steps_through_a_set_closure():
    """AMP's recipe: the scaler calls step() without a closure after unscale_."""
    w, b = two_params()
    opt = make(HybridBFO, w, b, 1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)

    def closure():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(w, b)
        scaler.scale(loss).backward()
        return loss

    start = float(loss_of(w, b).detach())
    for _ in range(3):
        closure()  # the loop's ordinary forward and scaled backward
        opt.set_closure(closure)  # then the scaler's step() scores candidates with it
        scaler.step(opt)
        scaler.update()
    assert float(loss_of(w, b).detach()) < start


@pytest.mark.parametrize("cls", CLASSES)
def test_a_state_dict_saved_between_a_schedule_and_a_step_resumes_exactly(cls):
    """The saved groups hold the scheduler's new lr, the saved swarm not yet."""
    w, b = two_params()
    opt = make(cls, w, b, 1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step(closure_for(opt, w, b))
    sched.step()
    other, w2, b2 = fresh_copy(cls, 1, opt.state_dict(), w, b)
    opt.step(closure_for(opt, w, b))
    other.step(closure_for(other, w2, b2))
    assert_same(snapshot(opt, [w, b])[:5], snapshot(other, [w2, b2])[:5])


@pytest.mark.parametrize("compile", [False, True])
def test_a_train_mode_batchnorm_on_the_fast_path_needs_no_module(compile):
    """The step's first pass, at the params as they stand, finds the layers vmap needs set."""
    model = bn_model(counter=False).train()
    x = torch.randn(8, 3)
    opt = BFO(model.named_parameters(), **TINY, seed=0, compile=compile)
    for _ in range(2):
        opt.step(loss_fn=lambda p: functional_call(model, p, (x,)).square().mean())
    assert int(model[1].num_batches_tracked) == 2 and opt.num_evals == 2 * (7 + 1)
    opt = BFO(model.named_parameters(), **TINY, seed=0, reevaluate=False)
    with pytest.raises(RuntimeError, match="vmap|Batch"):  # nothing found the layers
        opt.step(loss_fn=lambda p: functional_call(model, p, (x,)).square().mean())
    opt = BFO(model.named_parameters(), **TINY, seed=0, reevaluate=False, module=model)
    opt.step(loss_fn=lambda p: functional_call(model, p, (x,)).square().mean())


def test_the_glue_reads_stepped_groups_publicly():
    model = bn_model(counter=False)
    opt = BFO([{"params": [model[0].weight]}, {"params": [model[3].weight]}], **TINY, seed=0)
    assert opt.stepped_groups == []
    opt.param_groups[1]["lr"] = 0.0
    with pytest.warns(RuntimeWarning, match="paused"):
        opt.step(lambda: model(torch.randn(8, 3)).square().mean())
    assert opt.stepped_groups == [0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_tensor_lr_a_scheduler_edits_in_place_reaches_the_swarm_by_value(dtype):
    """torch's schedulers fill_ a tensor lr: the same object, a new value."""
    w, b = two_params()
    opt = BFO([w, b], **TINY, seed=0, lr=torch.tensor(0.5, dtype=dtype))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    for _ in range(3):
        opt.step(closure_for(opt, w, b))
        sched.step()
    opt.step(closure_for(opt, w, b))
    step_size = core_state(opt).hyperparams.step_size
    assert float(step_size) == pytest.approx(5e-4)
    opt.param_groups[0]["lr"].fill_(0.25)  # the swarm's copy is its own
    assert float(step_size) == pytest.approx(5e-4)


def test_a_fixed_setting_edited_after_a_load_is_refused_as_without_one():
    w, b = two_params()
    opt = make(BFO, w, b, 1)
    opt.step(closure_for(opt, w, b))
    other, w2, b2 = fresh_copy(BFO, 1, opt.state_dict(), w, b)
    other.param_groups[0]["swim_length"] = 3
    with pytest.raises(ValueError, match=r"\['swim_length'\] shape the swarm"):
        other.step(closure_for(other, w2, b2))


def test_a_state_dict_with_invalid_settings_is_refused_before_any_step():
    """Settings are checked for every group, with or without a swarm yet."""
    w, b = two_params()
    sd = make(BFO, w, b, 2).state_dict()
    sd["param_groups"][1]["population_size"] = 0
    other = make(BFO, *two_params(), 2)
    before = other.state_dict()
    with pytest.raises(ValueError, match="Invalid population_size"):
        other.load_state_dict(sd)
    assert other.state_dict()["param_groups"] == before["param_groups"]


def test_the_pause_warning_raised_as_an_error_fails_the_step_whole():
    w, b = two_params()
    opt = BFO([{"params": [w]}, {"params": [b], "lr": 0.0}], **TINY, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="lr=0 is paused"):
            opt.step(closure_for(opt, w, b))
    assert opt.num_evals == 0
    with pytest.warns(RuntimeWarning, match="lr=0 is paused"):  # still to be said
        opt.step(closure_for(opt, w, b))


def test_a_stopped_run_resumes_under_the_new_optimizers_limits():
    """The counters come from the checkpoint; whether they mean stop is this optimizer's say."""
    w, b = two_params()
    opt = make(BFO, w, b, 1, max_fe=20)
    while not opt.should_stop:
        opt.step(closure_for(opt, w, b))
    sd = opt.state_dict()
    same = make(BFO, *two_params(), 1, max_fe=20)
    same.load_state_dict(sd)
    w3, b3 = two_params()
    more = make(BFO, w3, b3, 1, max_fe=10_000)
    more.load_state_dict(sd)
    assert same.stop_reason == "max_fe" and more.stop_reason is None
    before = more.num_evals
    more.step(closure_for(more, w3, b3))
    assert more.num_evals > before
    maximizing = BFO([torch.nn.Parameter(torch.zeros(2))], **TINY, seed=0, maximize=True,
                     target_loss=5.0)
    maximizing.step(lambda: 6.0)
    assert maximizing.stop_reason == "target_loss"
    again = BFO([torch.nn.Parameter(torch.zeros(2))], **TINY, seed=0, maximize=True,
                target_loss=5.0)
    again.load_state_dict(maximizing.state_dict())
    assert again.stop_reason == "target_loss"


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("fast", [False, True])
def test_steps_between_cycles_leave_the_events_out_with_the_same_parameters(cls, fast,
                                                                              monkeypatch):
    """An eager step knows its swarm's step on the host: where no cycle ends it runs the
    update without the masked events (at_step), and every step ends where it did with them."""
    picked, runs = [], []
    real = adapters_optimizers.at_step
    for spy in (lambda core, step: picked.append(real(core, step)) or picked[-1],
                lambda core, step: core):  # every update whole: the events in each
        monkeypatch.setattr(adapters_optimizers, "at_step", spy)
        w, b = two_params()
        opt = make(cls, w, b, groups=1, chemotaxis_steps=2)
        for _ in range(5):
            opt.step(loss_fn=lambda p: loss_of(*p)) if fast else opt.step(closure_for(opt, w, b))
        runs.append((w.detach().clone(), b.detach().clone(), core_state(opt).health))
    twins = [p.twin is None for p in picked]  # a twin has none of its own
    assert twins == [True, True, False, True, False]  # steps 0 to 4: cycles end at 2 and 4
    for a, b in zip(*runs):
        assert torch.equal(a, b)
