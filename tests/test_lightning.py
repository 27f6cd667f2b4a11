"""The adapters inside Lightning's ordinary code, on the CPU, with tiny local models."""

from __future__ import annotations

import csv
import math
import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch

L = pytest.importorskip("lightning")
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from lightning.pytorch.plugins import MixedPrecision  # noqa: E402

from functional_bfo.adapters import BFO, HybridBFO  # noqa: E402
from functional_bfo.adapters.lightning import BFOCallback  # noqa: E402


class Regression(L.LightningModule):
    def __init__(self, cls=HybridBFO, automatic=True, on_epoch=False):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                                       torch.nn.Linear(4, 1))
        self.cls, self.on_epoch, self.best = cls, on_epoch, []
        self.automatic_optimization = automatic

    def loss(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch, batch_idx):
        if self.automatic_optimization:
            loss = self.loss(batch)
            self.log("train_loss", loss, on_step=not self.on_epoch, on_epoch=self.on_epoch)
            return loss
        self.manual_step(self.optimizers(), batch)

    def manual_step(self, opt, batch):
        """One manual-optimization step of ``opt``, its closure scoring ``batch``."""
        def closure():
            opt.zero_grad()
            loss = self.loss(batch)
            self.manual_backward(loss)
            return loss

        opt.step(closure=closure)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.best.append(self.optimizers().optimizer.best_fitness)

    def configure_optimizers(self):
        return self.cls(self.parameters(), population_size=4, swim_length=1, seed=0,
                        module=self)


def loader(batches=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8 * batches, 3, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    return torch.utils.data.DataLoader(data, batch_size=8)


def fit(model, tmp_path, callbacks=(), **trainer):
    logger = CSVLogger(tmp_path, name="run")
    trainer = {"accelerator": "cpu", **trainer}
    with warnings.catch_warnings():
        # Lightning's advice on workers and log intervals, and on a GPU machine that a test
        # on the CPU leaves its GPU unused
        warnings.simplefilter("ignore")
        t = L.Trainer(max_epochs=1, logger=logger, callbacks=list(callbacks),
                      enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, log_every_n_steps=1, **trainer)
        t.fit(model, loader())
    with open(logger.log_dir + "/metrics.csv") as f:
        return list(csv.DictReader(f))


def column(rows, name):
    return [float(r[name]) for r in rows if r.get(name)]


@pytest.mark.parametrize("cls", [BFO, HybridBFO])
def test_automatic_optimization_logs_the_best_loss(cls, tmp_path):
    model = Regression(cls)
    rows = fit(model, tmp_path, [BFOCallback()])
    assert column(rows, "train_loss") == pytest.approx(model.best, rel=1e-6)
    assert column(rows, "bfo/best_loss") == pytest.approx(model.best, rel=1e-6)
    assert len(column(rows, "bfo/diversity")) == 3
    assert column(rows, "bfo/step_length_mean") and column(rows, "bfo/num_evals")


def test_the_epoch_mean_averages_the_best_not_the_candidates(tmp_path):
    model = Regression(on_epoch=True)
    with_callback = column(fit(model, tmp_path / "a", [BFOCallback()]), "train_loss")
    assert with_callback == pytest.approx([sum(model.best) / len(model.best)], rel=1e-6)
    model = Regression(on_epoch=True)
    without = column(fit(model, tmp_path / "b"), "train_loss")
    assert without[0] > with_callback[0] * 1.01  # the candidates' losses, mostly worse


def test_manual_optimization(tmp_path):
    model = Regression(automatic=False)
    fit(model, tmp_path, [BFOCallback()])
    assert len(model.best) == 3 and all(math.isfinite(b) for b in model.best)
    assert model.optimizers().optimizer.num_evals == 3 * (4 * 2 + 1 + 1)  # 3 whole steps


class TwoOptimizers(Regression):
    """Manual optimization: the first layer by HybridBFO, the last by BFO."""

    def __init__(self):
        super().__init__(automatic=False)

    def training_step(self, batch, batch_idx):
        for opt in self.optimizers():
            self.manual_step(opt, batch)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.best.append([o.optimizer.num_evals for o in self.optimizers()])

    def configure_optimizers(self):
        return [HybridBFO(self.net[0].parameters(), population_size=4, swim_length=1, seed=0),
                BFO(self.net[2].parameters(), population_size=3, swim_length=1, seed=0)]


def test_each_optimizers_telemetry_has_its_own_columns(tmp_path):
    model = TwoOptimizers()
    rows = fit(model, tmp_path, [BFOCallback()])
    assert column(rows, "bfo/num_evals_o0") == [float(n) for n, _ in model.best]
    assert column(rows, "bfo/num_evals_o1") == [float(n) for _, n in model.best]
    assert column(rows, "bfo/best_loss_o0") and column(rows, "bfo/best_loss_o1")


def test_bf16_mixed_precision_works(tmp_path):
    model = Regression()
    rows = fit(model, tmp_path, [BFOCallback()], precision="bf16-mixed")
    assert all(math.isfinite(v) for v in column(rows, "train_loss"))


def test_a_grad_scaler_precision_is_refused_with_the_alternative(tmp_path):
    plugin = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match="bf16-mixed"):
        fit(Regression(), tmp_path, [BFOCallback()], plugins=[plugin])


def test_gradient_accumulation_is_refused_with_the_alternatives(tmp_path):
    """Lightning steps once every k batches with a closure over the last one: the other
    batches would not rank a candidate, silently."""
    with pytest.raises(ValueError, match="accumulate_grad_batches=2.*gradient_accumulation"):
        fit(Regression(), tmp_path, [BFOCallback()], accumulate_grad_batches=2)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@CUDA
@pytest.mark.parametrize("cls", [BFO, HybridBFO])
def test_bf16_mixed_on_cuda_trains(cls, tmp_path):
    class Where(L.Callback):  # the Trainer moves the module back to the CPU after fit
        def on_train_batch_end(self, trainer, module, *args):
            self.device = module.device.type

    model, where = Regression(cls), Where()
    rows = fit(model, tmp_path, [BFOCallback(), where], accelerator="gpu", devices=1,
               precision="bf16-mixed")
    assert all(math.isfinite(v) for v in column(rows, "train_loss"))
    assert where.device == "cuda" and len(model.best) == 3


@CUDA
def test_16_mixed_on_cuda_is_refused_with_the_alternative(tmp_path):
    """Lightning's 16-mixed steps through a GradScaler, which cannot run our closure."""
    with pytest.raises(ValueError, match="bf16-mixed"):
        fit(Regression(), tmp_path, [BFOCallback()], accelerator="gpu", devices=1,
            precision="16-mixed")


def test_the_callback_gives_the_module_its_log_back(tmp_path):
    model = Regression()
    fit(model, tmp_path, [BFOCallback()])
    assert "log" not in model.__dict__ and "log_dict" not in model.__dict__


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_ddp_strategies_end_with_identical_parameters(strategy, tmp_path):
    script = pathlib.Path(__file__).with_name("lightning_ddp.py")
    out = tmp_path / "params"
    run = subprocess.run([sys.executable, str(script), strategy, str(out)], timeout=240,
                         capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ranks = [torch.load(f"{out}.rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(a, b) for a, b in zip(*ranks))
    start = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    assert not all(torch.equal(a, b) for a, b in zip(ranks[0], start.parameters()))


@pytest.mark.parametrize("cls", [BFO, HybridBFO])
def test_without_the_callback_or_module_the_step_logs_the_best_loss(cls, tmp_path):
    """A new user's module: BFO(self.parameters()) and self.log, nothing else."""
    class Plain(Regression):
        def configure_optimizers(self):
            return self.cls(self.parameters(), population_size=4, swim_length=1, seed=0)

    model = Plain(cls)
    assert column(fit(model, tmp_path), "train_loss") == pytest.approx(model.best, rel=1e-6)
