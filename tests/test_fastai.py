"""fastai's Learner with our optimizers, on the CPU, with a tiny local model."""

from __future__ import annotations

import math
import random
import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("fastai.basics")
import fastai.callback.schedule  # noqa: E402, F401  (adds Learner.fit_one_cycle)
from fastai.callback.core import Callback  # noqa: E402
from fastai.data.core import DataLoaders  # noqa: E402
from fastai.data.load import DataLoader  # noqa: E402
from fastai.learner import Learner  # noqa: E402

from functional_bfo.adapters import BFO, AdaptiveBFO, HybridBFO, evaluating_candidates  # noqa: E402
from functional_bfo.adapters.fastai import BFOCallback, bfo_opt  # noqa: E402


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
        self.batches: list[tuple[bool, float]] = []

    def forward(self, x):
        self.batches.append((evaluating_candidates(), float(x[0, 0])))
        return self.net(x)


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 3, generator=g)
    pairs = list(zip(x, x.sum(dim=1, keepdim=True)))
    train = DataLoader(pairs[:32], bs=8, shuffle=True)
    train.rng = random.Random(0)  # fastai seeds its shuffle from Python's global random
    return DataLoaders(train, DataLoader(pairs[32:], bs=8), device="cpu")


def mae(pred, target):
    return (pred - target).abs().mean()


def learner(cls, **kwargs):
    model = Tiny()
    learn = Learner(data(), model, loss_func=nn.functional.mse_loss, metrics=mae,
                    opt_func=bfo_opt(cls, population_size=4, swim_length=1, seed=0, **kwargs),
                    cbs=BFOCallback())
    return learn, model


def fit(learn, how, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fastai's own deprecations
        getattr(learn, how)(*args, **kwargs)


@pytest.mark.parametrize("cls", [BFO, AdaptiveBFO, HybridBFO])
@pytest.mark.parametrize("how", ["fit", "fit_one_cycle"])
def test_fit_and_fit_one_cycle_train_with_metrics(cls, how, tmp_path):
    learn, model = learner(cls)
    valid = learn.validate()[0]
    fit(learn, how, 2, 0.1)
    assert isinstance(learn.opt.opt, cls) and learn.opt.opt.num_evals > 0
    loss, metric = learn.recorder.values[-1][1:3]
    assert math.isfinite(loss) and math.isfinite(metric)
    if cls is HybridBFO and how == "fit":  # the gradient makes 8 steps enough to tell
        assert loss < valid


def test_every_candidate_of_a_step_sees_the_steps_batch():
    learn, model = learner(BFO)
    fit(learn, "fit", 1, 0.1)
    step, groups = None, []
    for candidate, first in model.batches:
        if not candidate:
            step = first
            groups.append(set())
        else:
            groups[-1].add(first)
            assert first == step
    assert sum(bool(g) for g in groups) == 4  # one step per training batch


def test_fit_one_cycle_drives_lr_and_hybrid_momentum():
    learn, model = learner(HybridBFO)
    seen = []

    class Record(BFOCallback):
        order = 100

        def after_step(self):
            group = self.learn.opt.opt.param_groups[0]
            seen.append((group["lr"], group["momentum"]))

    learn.add_cb(Record())
    fit(learn, "fit_one_cycle", 1, 0.1)
    lrs = [s[0] for s in seen]
    assert max(lrs) == pytest.approx(0.1, rel=0.05) and lrs[0] < max(lrs)
    assert len({m for _, m in seen}) > 1


def test_a_learner_without_our_optimizer_is_refused():
    model = Tiny()
    learn = Learner(data(), model, loss_func=nn.functional.mse_loss, cbs=BFOCallback())
    with pytest.raises(TypeError, match="bfo_opt"):
        fit(learn, "fit", 1, 0.1)


def test_gradient_accumulation_is_refused_with_the_alternatives():
    """fastai steps once a window with the closure of its last batch: the other batches
    would not rank a candidate, silently."""
    from fastai.callback.training import GradientAccumulation

    learn, model = learner(BFO)
    learn.add_cb(GradientAccumulation(n_acc=16))
    with pytest.raises(ValueError, match="GradientAccumulation.*a larger batch"):
        fit(learn, "fit", 1, 0.1)


@pytest.mark.parametrize("cls", [BFO, HybridBFO])
def test_freezing_keeps_the_swarm_and_its_budget(cls):
    """fastai clears an optimizer's state when it freezes or unfreezes (fine_tune does
    both): the swarm goes on, counts on, and max_fe still stops it."""
    learn, model = learner(cls, max_fe=100)
    seen = []

    class Record(Callback):
        def after_step(self):
            seen.append(learn.opt.opt.num_evals)

    learn.add_cb(Record())
    fit(learn, "fit", 1, 0.1)
    learn.freeze()
    learn.unfreeze()
    fit(learn, "fit", 2, 0.1)
    assert seen == sorted(seen) and seen[-1] <= 100 and learn.opt.opt.should_stop


def test_weight_decay_is_refused_not_ignored():
    learn, model = learner(BFO)
    with pytest.raises(ValueError, match="wd"):
        fit(learn, "fit", 1, 0.1, wd=0.1)


def test_bfo_opt_passed_uncalled_says_to_call_it():
    learn = Learner(data(), Tiny(), loss_func=nn.functional.mse_loss, opt_func=bfo_opt,
                    cbs=BFOCallback())
    with pytest.raises(TypeError, match=r"opt_func=bfo_opt\(HybridBFO") as info:
        fit(learn, "fit", 1, 0.1)
    assert "Parameter containing" not in str(info.value)
