"""The adapter examples run (a few steps each, so the suite stays fast)."""

import importlib.util
import math
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["adapter_bfo", "adapter_adaptive", "adapter_hybrid"])
def test_adapter_example_runs(name, capsys):
    loss = load(name).main(steps=3)
    assert math.isfinite(loss)
    assert "step" in capsys.readouterr().out


def test_the_distributed_example_prints_the_one_process_run_on_two(tmp_path):
    """torchrun with 2 CPU processes (gloo) gives the numbers one process gives."""
    script = str(EXAMPLES / "distributed.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, script, "--steps", "12"], capture_output=True,
                         text=True, timeout=120, env=env)
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", script, "--steps", "12"], capture_output=True,
                         text=True, timeout=180, env=env)
    assert one.returncode == 0 and two.returncode == 0, two.stdout + two.stderr

    def lines(out):
        return [line.split("(")[0] for line in out.splitlines()
                if line.startswith(("step", "training"))]

    assert lines(one.stdout) and lines(one.stdout) == lines(two.stdout)
    assert "(2 processes)" in two.stdout


@pytest.mark.parametrize("name,framework,size", [("lightning_digits", "lightning", 1),
                                                 ("transformers_digits", "transformers", 4),
                                                 ("fastai_digits", "fastai.basics", 1)])
def test_integration_examples_run(name, framework, size, capsys):
    pytest.importorskip(framework)
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / "integrations" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert math.isfinite(module.main(size))
    assert "accuracy" in capsys.readouterr().out


def test_the_ask_tell_example_resumes_a_crash_and_shards_across_ranks(tmp_path):
    """Killed between ask and tell, it resumes to the uninterrupted run's numbers; torchrun
    with 2 processes (gloo) prints the one-process numbers."""
    script = str(EXAMPLES / "ask_tell_simulator.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(*args, launcher=()):
        return subprocess.run([sys.executable, *launcher, script, "--rounds", "20", *args],
                              capture_output=True, text=True, timeout=180, env=env,
                              cwd=tmp_path)

    def lines(out):
        return [line.split("(")[0] for line in out.splitlines()
                if line.startswith(("round", "fitted"))]

    whole = run("--checkpoint", "whole.pt")
    crashed = run("--checkpoint", "crash.pt", "--crash-after", "13")
    resumed = run("--checkpoint", "crash.pt", "--resume")
    two = run("--checkpoint", "two.pt", launcher=("-m", "torch.distributed.run", "--standalone",
                                                  "--nproc-per-node=2"))
    assert whole.returncode == 0 and resumed.returncode == 0, whole.stderr + resumed.stderr
    assert crashed.returncode != 0 and "crashed while simulating round 13" in crashed.stderr
    assert "resumed at round 13" in resumed.stdout
    assert lines(whole.stdout)[-1] == lines(resumed.stdout)[-1]
    assert lines(whole.stdout)[1:] == lines(resumed.stdout)  # rounds 20 and the fit
    assert two.returncode == 0, two.stdout + two.stderr
    assert lines(two.stdout) == lines(whole.stdout) and "(2 processes)" in two.stdout
