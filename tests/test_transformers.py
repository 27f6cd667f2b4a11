"""BFOTrainer inside the real Transformers Trainer, on the CPU, with a tiny local model."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from functional_bfo.adapters import BFO, HybridBFO, evaluating_candidates  # noqa: E402
from functional_bfo.adapters.transformers import BFOTrainer  # noqa: E402


class Tiny(nn.Module):
    """A model as the Trainer expects one: keyword inputs, a dict with the loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
        self.seen: list[tuple[bool, float]] = []  # (a candidate?, the batch's first input)

    def forward(self, x, labels=None):
        self.seen.append((evaluating_candidates(), float(x[0, 0])))
        out = self.net(x)
        loss = None if labels is None else nn.functional.mse_loss(out, labels)
        return {"loss": loss, "logits": out}


class Data(torch.utils.data.Dataset):
    def __init__(self, n=32):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def arguments(folder, **kwargs):
    settings = dict(output_dir=str(folder), per_device_train_batch_size=8, max_steps=4,
                    learning_rate=0.05, logging_steps=1, save_strategy="no", report_to=[],
                    use_cpu=True, seed=0, remove_unused_columns=False, disable_tqdm=True)
    return transformers.TrainingArguments(**{**settings, **kwargs})


def train(model, args, resume=None, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the Trainer's advice for plain nn.Modules
        trainer = BFOTrainer(model=model, args=args, train_dataset=Data(), **kwargs)
        trainer.train(resume_from_checkpoint=resume)
    return trainer


def full_loss(model):
    data = Data()
    with torch.no_grad():
        x, y = (t.to(next(model.parameters()).device) for t in (data.x, data.y))
        return float(nn.functional.mse_loss(model.net(x), y))


def test_the_default_optimizer_is_hybrid_bfo_and_it_trains(tmp_path):
    model = Tiny()
    before = full_loss(model)
    trainer = train(model, arguments(tmp_path))
    opt = trainer.optimizer.optimizer
    assert isinstance(opt, HybridBFO) and opt.num_evals > 4 * 33
    assert full_loss(model) < before
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 4


def test_any_of_our_optimizers_can_be_passed(tmp_path):
    model = Tiny()
    opt = BFO(model.parameters(), population_size=6, lr=0.05, seed=0, module=model)
    trainer = train(model, arguments(tmp_path), optimizers=(opt, None))
    assert trainer.optimizer.optimizer is opt and opt.num_evals > 0


def test_other_optimizers_are_refused(tmp_path):
    model = Tiny()
    with pytest.raises(TypeError, match="transformers.Trainer"):
        train(model, arguments(tmp_path),
              optimizers=(torch.optim.SGD(model.parameters(), lr=0.1), None))


def test_gradient_accumulation_scores_every_candidate_on_the_same_window(tmp_path):
    model = Tiny()
    train(model, arguments(tmp_path, gradient_accumulation_steps=2, max_steps=2))
    # Group the forward passes into steps: a step's candidates follow its 2 batches' logging
    # passes; every candidate sees exactly those 2 batches.
    steps, current = [], None
    for candidate, first in model.seen:
        if not candidate:
            if current is None or current["candidates"]:
                current = {"batches": [], "candidates": set()}
                steps.append(current)
            current["batches"].append(first)
        else:
            current["candidates"].add(first)
    windows = [s for s in steps if s["candidates"]]
    assert len(windows) == 2
    for s in windows:
        assert s["candidates"] == set(s["batches"][-2:])


def test_the_logged_grad_norm_is_the_windows_mean_losss(tmp_path):
    """As the Trainer's own step: each batch's backward is divided by the accumulation
    steps, so the gradient the Trainer clips and logs is that of the window's mean loss."""
    data, model = Data(8), Tiny()
    nn.functional.mse_loss(model.net(data.x), data.y).backward()
    direct = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten()
                                                       for p in model.parameters()])))
    for k in (1, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = BFOTrainer(model=Tiny(), train_dataset=data, args=arguments(
                tmp_path / str(k), gradient_accumulation_steps=k,
                per_device_train_batch_size=8 // k, max_steps=1))
            trainer.train()
        logged = [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]
        assert logged == [pytest.approx(direct, rel=1e-5)], k


def test_bf16_on_the_cpu(tmp_path):
    model = Tiny()
    trainer = train(model, arguments(tmp_path, bf16=True))
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in trainer.state.log_history
               if "loss" in e)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cls", [BFO, HybridBFO])
def test_fp16_with_its_grad_scaler_on_cuda_trains(cls, tmp_path):
    """fp16=True makes the Trainer scale the loss through a GradScaler on CUDA."""
    model = Tiny().cuda()
    before = full_loss(model)
    optimizer = cls(model.parameters(), population_size=4, seed=0, module=model)
    trainer = train(model, arguments(tmp_path, fp16=True, use_cpu=False, max_steps=8),
                    optimizers=(optimizer, None))
    assert trainer.accelerator.scaler is not None
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in trainer.state.log_history
               if "loss" in e)
    assert full_loss(model) < before


def test_the_default_scheduler_decays_lr_the_largest_step(tmp_path):
    model = Tiny()
    trainer = train(model, arguments(tmp_path))
    lrs = [entry["learning_rate"] for entry in trainer.state.log_history
           if "learning_rate" in entry]
    assert lrs[0] == pytest.approx(0.05) and lrs == sorted(lrs, reverse=True)
    assert trainer.optimizer.optimizer.param_groups[0]["lr"] == pytest.approx(0.0)


def test_resume_from_a_checkpoint_equals_never_stopping(tmp_path):
    straight = Tiny()
    train(straight, arguments(tmp_path / "a"))
    first = Tiny()  # the same run, with checkpoints
    train(first, arguments(tmp_path / "b", save_strategy="steps", save_steps=2))
    resumed = Tiny()
    train(resumed, arguments(tmp_path / "b", save_strategy="steps", save_steps=2),
          resume=str(tmp_path / "b" / "checkpoint-2"))
    for a, b in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_custom_loss_that_pops_the_labels(tmp_path):
    def loss_func(outputs, labels, num_items_in_batch=None):
        return nn.functional.l1_loss(outputs["logits"], labels)

    model = Tiny()
    trainer = train(model, arguments(tmp_path), compute_loss_func=loss_func)
    assert trainer.optimizer.optimizer.num_evals > 0


def test_a_retried_run_starts_from_an_empty_window(tmp_path):
    model = Tiny()
    calls = [0]
    forward = model.forward

    def failing(*args, **kwargs):
        if evaluating_candidates() and not calls[0]:  # the first step's first candidate
            calls[0] += 1
            raise KeyError("a flaky data source")
        return forward(*args, **kwargs)

    model.forward = failing
    args = arguments(tmp_path, gradient_accumulation_steps=2, max_steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = BFO(model.parameters(), population_size=2, swim_length=1, lr=0.05, seed=0)
        trainer = BFOTrainer(model=model, args=args, train_dataset=Data(),
                             optimizers=(opt, None))
        with pytest.raises(KeyError):
            trainer.train()
        model.seen.clear()
        trainer.train()
    candidates = [first for candidate, first in model.seen if candidate]
    # The retried step: 1 + 2 * 2 closure calls, each over a window of 2 batches (not 4).
    assert len(candidates) == 5 * 2 and len(set(candidates)) == 2


def test_ranks_of_a_torchrun_launch_stay_identical(tmp_path):
    """Each rank trains on its own batches; the default data-parallel evaluator averages."""
    script = pathlib.Path(__file__).with_name("transformers_ddp.py")
    out = str(tmp_path / "params")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", str(script), out], capture_output=True,
                         text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ranks = [torch.load(f"{out}.rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(a, b) for a, b in zip(*ranks))
