"""Logging hooks through register_step_post_hook, read back from what each logger wrote."""

from __future__ import annotations

import csv as csv_module
import warnings

import pytest
import torch

from functional_bfo.adapters import BFO, HybridBFO, loggers

PATHS = ["closure", "fast"]


def problem(cls, **kwargs):
    w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 4))
    opt = cls([w], population_size=4, swim_length=1, seed=0, **kwargs)

    def closure():
        opt.zero_grad()
        loss = (w - 0.5).square().sum()
        if w.requires_grad:
            loss.backward()
        return loss

    def step(path):
        if path == "closure":
            return opt.step(closure)
        return opt.step(loss_fn=lambda p: (p[0] - 0.5).square().sum())

    return opt, step


@pytest.mark.parametrize("path", PATHS)
def test_csv_rows_follow_every_step(path, tmp_path):
    opt, step = problem(HybridBFO)
    out = tmp_path / "bfo.csv"
    opt.register_step_post_hook(loggers.csv(out))
    best = [step(path) for _ in range(3)]
    with open(out) as f:
        rows = list(csv_module.DictReader(f))
    assert [float(r["BFO/best_fitness"]) for r in rows] == pytest.approx(best)
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert all(float(r["BFO/num_evals"]) > 0 and float(r["BFO/diversity"]) > 0 for r in rows)


@pytest.mark.parametrize("path", PATHS)
def test_tensorboard_scalars_and_population_histogram(path, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    opt, step = problem(BFO)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tensorboard's own deprecations
        writer = SummaryWriter(str(tmp_path))
        opt.register_step_post_hook(loggers.tensorboard(writer, histogram_every=2))
        best = [step(path) for _ in range(3)]
        writer.close()
        events = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0}).Reload()
    scalars = [e.value for e in events.Scalars("BFO/best_fitness")]
    assert scalars == pytest.approx(best)
    assert [e.step for e in events.Histograms("BFO/population")] == [0, 2]
    assert events.Histograms("BFO/population")[0].histogram_value.num == 4 * 4
    assert "BFO/step_length_mean" in events.Tags()["scalars"]


@pytest.mark.parametrize("path", PATHS)
def test_wandb_offline(path, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    opt, step = problem(HybridBFO)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = wandb.init(mode="offline", dir=str(tmp_path), project="bfo")
        try:
            opt.register_step_post_hook(loggers.wandb())
            best = [step(path) for _ in range(3)]
            assert run.summary["BFO/best_fitness"] == pytest.approx(best[-1])
            assert run.summary["BFO/num_evals"] == opt.num_evals
        finally:
            run.finish()


def test_wandb_logs_to_a_run_started_after_the_hook_and_warns_without_one(tmp_path,
                                                                          monkeypatch):
    """Lightning's WandbLogger starts its run after configure_optimizers made the hook; a
    step with no run is applied all the same, unlogged, with a warning."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert wandb.run is None
    opt, step = problem(BFO)
    opt.register_step_post_hook(loggers.wandb())  # no run yet
    with pytest.warns(RuntimeWarning, match=r"no wandb run is active.*wandb\.init"):
        best = step("closure")
    assert opt.best_fitness == best and opt.num_evals > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = wandb.init(mode="offline", dir=str(tmp_path), project="bfo")
        try:
            best = step("closure")
            assert run.summary["BFO/best_fitness"] == pytest.approx(best)
        finally:
            run.finish()


@pytest.mark.parametrize("path", PATHS)
def test_tensorboard_groups_of_different_population_sizes(path, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(2))
    opt = BFO([{"params": [a], "population_size": 4}, {"params": [b]}],
              population_size=6, swim_length=1, seed=0)

    def closure():
        return float((a.detach() - 1).square().sum() + (b.detach() + 1).square().sum())

    def loss_fn(p):
        return (p[0] - 1).square().sum() + (p[1] + 1).square().sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tensorboard's own deprecations
        writer = SummaryWriter(str(tmp_path))
        opt.register_step_post_hook(loggers.tensorboard(writer, histogram_every=1))
        best = [opt.step(closure) if path == "closure" else opt.step(loss_fn=loss_fn)
                for _ in range(2)]
        writer.close()
        events = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0}).Reload()
    assert [e.value for e in events.Scalars("BFO/best_fitness")] == pytest.approx(best)
    assert [e.step for e in events.Scalars("BFO/diversity_group1")] == [0, 1]
    histograms = events.Histograms("BFO/population")
    assert [h.step for h in histograms] == [0, 1]
    assert histograms[0].histogram_value.num == 4 * 3 + 6 * 2  # every bacterium, both groups


@pytest.mark.parametrize("path", PATHS)
def test_steps_that_evaluate_nothing_log_no_row(path, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    opt, step = problem(BFO)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        writer = SummaryWriter(str(tmp_path))
        opt.register_step_post_hook(loggers.tensorboard(writer))
        opt.register_step_post_hook(loggers.csv(tmp_path / "bfo.csv"))
        best = [step("closure"), step("fast")]
        opt.param_groups[0]["lr"] = 0.0  # paused: evaluates nothing
        step(path)
        opt.param_groups[0]["lr"] = 0.1
        best.append(step(path))
        writer.close()
        events = EventAccumulator(str(tmp_path)).Reload()
    with open(tmp_path / "bfo.csv") as f:
        rows = list(csv_module.DictReader(f))
    assert [float(r["BFO/best_fitness"]) for r in rows] == pytest.approx(best)
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert [e.value for e in events.Scalars("BFO/best_fitness")] == pytest.approx(best)

    stopped, step = problem(BFO, max_fe=30)  # 9 evaluations a step (10 with a closure's
    stopped.register_step_post_hook(loggers.csv(tmp_path / "stopped.csv"))  # pass at the best)
    for _ in range(5):
        step(path)
    per_step = 10 if path == "closure" else 9
    assert stopped.should_stop and stopped.num_evals == 3 * per_step
    with open(tmp_path / "stopped.csv") as f:
        assert [float(r["BFO/num_evals"]) for r in csv_module.DictReader(f)] == [
            per_step, 2 * per_step, 3 * per_step]


def test_a_checkpoint_loaded_between_steps_does_not_fool_the_loggers(tmp_path):
    opt, step = problem(BFO)
    opt.register_step_post_hook(loggers.csv(tmp_path / "bfo.csv"))
    step("closure")
    saved = opt.state_dict()
    step("closure")
    opt.load_state_dict(saved)  # back to 10 evaluations
    step("closure")  # 20 again, as the step before the load: a row all the same
    opt.load_state_dict(saved)
    opt.param_groups[0]["lr"] = 0.0
    with pytest.warns(RuntimeWarning, match="paused"):
        step("closure")  # evaluates nothing, though num_evals moved since the last row
    with open(tmp_path / "bfo.csv") as f:
        rows = list(csv_module.DictReader(f))
    assert [float(r["BFO/num_evals"]) for r in rows] == [10, 20, 20]
    assert [int(r["step"]) for r in rows] == [0, 1, 1]  # the run's step, as the load set it


class Writer:
    """Records what the hook hands a SummaryWriter: (kind, name, step)."""

    def __init__(self, seen):
        self.seen = seen

    def add_scalar(self, name, value, step):
        self.seen.append(("scalar", name, step))

    def add_histogram(self, name, values, step):
        self.seen.append(("histogram", name, step))


def test_a_resumed_run_logs_on_from_its_step(tmp_path):
    """A fresh optimizer loading a checkpoint (a new process) logs at the run's next step,
    not from 0 again (TensorBoard and CSV both), so its rows continue the first run's."""
    opt, step = problem(BFO)
    for _ in range(3):
        step("closure")
    resumed, step_resumed = problem(BFO)
    resumed.load_state_dict(opt.state_dict())
    resumed.register_step_post_hook(loggers.csv(tmp_path / "bfo.csv"))
    seen = []
    resumed.register_step_post_hook(loggers.tensorboard(Writer(seen), histogram_every=1))
    for _ in range(2):
        step_resumed("closure")
    with open(tmp_path / "bfo.csv") as f:
        assert [int(r["step"]) for r in csv_module.DictReader(f)] == [3, 4]
    assert sorted({s for _, _, s in seen}) == [3, 4]


def test_paused_steps_groups_of_other_sizes_and_late_groups_log_cleanly(tmp_path):
    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(2))
    opt = BFO([{"params": [a], "lr": 0.0}, {"params": [b], "population_size": 6}],
              population_size=4, swim_length=1, seed=0)
    out = tmp_path / "bfo.csv"
    opt.register_step_post_hook(loggers.csv(out))

    def closure():
        return float((a.detach() - 1).square().sum() + (b.detach() + 1).square().sum())

    first = BFO([torch.nn.Parameter(torch.zeros(2))], lr=0.0, population_size=4, seed=0)
    first.register_step_post_hook(loggers.csv(tmp_path / "paused.csv"))
    with pytest.warns(RuntimeWarning, match="paused"):
        first.step(lambda: 1.0)  # every group paused: nothing to log, no crash
        opt.step(closure)
    assert not (tmp_path / "paused.csv").exists()
    opt.param_groups[0]["lr"] = 0.1  # group 0 starts late
    opt.step(closure)
    with open(out) as f:
        rows = list(csv_module.DictReader(f))
    assert len(rows) == 2 and all(None not in r for r in rows)  # columns stay aligned
    assert rows[0]["BFO/diversity"] == "nan" and float(rows[1]["BFO/diversity"]) > 0
    assert float(rows[1]["BFO/diversity_group1"]) > 0


def test_csv_rows_keep_the_files_columns_when_a_group_is_added(tmp_path):
    """A header is written once: a later column is left out, with a warning naming it."""
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    opt = BFO([a], population_size=4, swim_length=1, seed=0)
    out = tmp_path / "bfo.csv"
    opt.register_step_post_hook(loggers.csv(out))

    def closure():
        return float((a.detach() - 1).square().sum() + (b.detach() + 1).square().sum())

    opt.step(closure)
    opt.add_param_group({"params": [b]})
    with pytest.warns(RuntimeWarning, match=r"BFO/diversity_group1.*new file"):
        opt.step(closure)
    opt.step(closure)  # said once
    with open(out) as f:
        rows = list(csv_module.reader(f))
    assert len(rows) == 4 and {len(r) for r in rows} == {len(rows[0])}
