"""functional_bfo.distributed with real processes: gloo on localhost, every launch under a
hard timeout so that a hang fails the test instead of stalling CI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import distributed_worker as worker
import optree
import pytest
import torch

import functional_bfo as fb

WORKER = Path(worker.__file__)
HANG = 120  # seconds a whole launch may take


def launch(scenario: str, world: int, folder: Path) -> tuple[list[int], list[str], dict]:
    """Run ``world`` ranks of a scenario; their exit codes, outputs and saved results."""
    folder.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), scenario, str(rank), str(world),
                               str(folder)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
             for rank in range(world)]
    deadline, outputs = time.monotonic() + HANG, []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{scenario} on {world} ranks hung for {HANG} s")
    results = {}
    for rank in range(world):
        path = folder / f"rank{rank}.pt"
        results[rank] = torch.load(path, weights_only=True) if path.exists() else None
    return [p.returncode for p in procs], outputs, results


def assert_bitwise(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y)
        else:
            assert x == y


@pytest.mark.parametrize("world", [2, 3])  # 7 bacteria: 4 + 3, 3 + 2 + 2; 8: 4 + 4, 3 + 3 + 2
def test_sharded_world_sizes_give_the_one_process_trajectory(world, tmp_path):
    codes, outputs, results = launch("variants", world, tmp_path / "run")
    assert codes == [0] * world, outputs
    alone = worker.run_variants(lambda grads: None)  # no distributed evaluator at all
    for rank in range(world):
        for name, leaves in alone.items():
            assert_bitwise(results[rank][name], leaves)


def test_the_whole_update_compiles_with_the_collectives_inside(tmp_path):
    codes, outputs, results = launch("compiled", 2, tmp_path / "run")
    assert codes == [0, 0], outputs
    alone = worker.run_variants(lambda grads: None)
    for name, leaves in results[0].items():
        assert_bitwise(leaves, results[1][name])  # identical on every rank
        for x, y in zip(leaves, alone[name]):  # and eager's to the compiler's rounding
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_data_parallel_is_one_process_on_all_the_data(tmp_path):
    codes, outputs, results = launch("data_parallel", 2, tmp_path / "run")
    assert codes == [0, 0], outputs
    torch.manual_seed(0)
    data = torch.randn(23, 5)
    population = {"w": torch.randn(6, 5, generator=torch.Generator().manual_seed(1))}

    def mean_loss(params, x):
        return ((x - params["w"]) ** 2).sum(dim=1).mean()

    losses = fb.evaluate.vmap()(mean_loss, population, data)
    grads = torch.func.vmap(torch.func.grad(mean_loss), in_dims=(0, None))(population, data)
    for rank in (0, 1):
        torch.testing.assert_close(results[rank]["losses"].float(), losses, rtol=1e-6, atol=0)
        torch.testing.assert_close(results[rank]["grads"], grads["w"], rtol=1e-6, atol=1e-7)
    assert_bitwise(results[0]["state"], results[1]["state"])  # identical on every rank


@pytest.mark.parametrize("scenario", ["failing", "killed", "stuck"])
def test_a_failing_rank_ends_every_rank_quickly_and_clearly(scenario, tmp_path):
    codes, outputs, results = launch(scenario, 2, tmp_path / "run")
    survivor = results[0]
    assert survivor["error"] is not None, outputs
    # A rank that dies ends the others at once; one that hangs, at the group's timeout.
    assert survivor["seconds"] < (3 * worker.TIMEOUTS["stuck"] if scenario == "stuck" else 10)
    assert "could not get the other ranks' losses" in survivor["message"]
    if scenario == "failing":
        assert results[1]["error"] == "KeyError"  # the user's exception keeps its type
    elif scenario == "killed":
        assert codes[1] == -9 and results[1] is None


def test_a_checkpoint_resumes_at_another_world_size(tmp_path):
    for i, world in enumerate([2, 1, 3]):  # 3 updates each, through one checkpoint file
        codes, outputs, results = launch("resume", world, tmp_path / f"run{i}")
        assert codes == [0] * world, outputs
    opt = fb.adaptive_bfo(population_size=7, min_population_size=2, chemotaxis_steps=2,
                          stagnation_steps=1)
    state = opt.init({"w": torch.zeros(5)}, key=fb.random.key(3))
    for _ in range(9):
        state = opt.update(state, worker.loss, worker.X)
    for rank in range(3):
        assert_bitwise(results[rank]["state"], optree.tree_leaves(state))


def test_the_guides_ddp_loop_ends_with_identical_parameters(tmp_path):
    codes, outputs, results = launch("guide_ddp", 2, tmp_path / "run")
    assert codes == [0, 0], outputs
    assert_bitwise(results[0]["params"], results[1]["params"])
    assert results[0]["best"] == results[1]["best"]


def test_vmap_over_runs_is_refused_clearly(tmp_path):
    codes, outputs, results = launch("under_vmap", 2, tmp_path / "run")
    assert results[0]["error"] is not None, outputs
    assert "vmap" in results[0]["message"]


def test_the_shell_takes_the_distributed_evaluators(tmp_path):
    runs = {}
    for world in (1, 2):
        codes, outputs, results = launch("adapters", world, tmp_path / f"run{world}")
        assert codes == [0] * world, outputs
        runs[world] = results
    for name, params in runs[2][0].items():
        if isinstance(params, list):
            assert_bitwise(params, runs[2][1][name])  # every rank ends identical
        else:
            assert params == runs[2][1][name]
        if name.startswith("sharded"):  # and sharding changes nothing
            assert_bitwise(params, runs[1][0][name])


def test_drifting_replicas_are_caught_on_every_rank(tmp_path):
    codes, outputs, results = launch("replicas", 2, tmp_path / "run")
    assert codes == [0, 0], outputs
    for rank in (0, 1):
        assert results[rank]["same"] is None
        assert "ranks [1] disagree with rank 0" in results[rank]["own"]
        assert "ranks [1] disagree with rank 0" in results[rank]["shell"]


def test_ranks_that_score_other_candidates_are_named_by_every_reader(tmp_path):
    """The candidates' checksum rides in the losses' collective: the state records the
    disagreeing ranks, fb.metrics shows them, and fb.run, check_agreement and the shell
    raise on every rank naming them; with one key nothing is recorded."""
    codes, outputs, results = launch("disagreeing", 3, tmp_path / "run")
    assert codes == [0, 0, 0], outputs
    for rank in range(3):
        got = results[rank]
        for how in ("sharded", "data_parallel"):
            for name in ("bfo", "adaptive_bfo", "hybrid_bfo"):
                assert got[f"{how}-{name}-same-mask"] == 0
                assert got[f"{how}-{name}-same-check"] is None
                assert got[f"{how}-{name}-same-run"] is None
                assert got[f"{how}-{name}-own-mask"] == 0b110  # ranks 1 and 2
                for reader in ("check", "run"):
                    assert "ranks [1, 2] disagree with rank 0" in got[f"{how}-{name}-own-{reader}"]
        assert "ranks [1, 2] disagree with rank 0" in got["shell"]
        assert got["shell_kept"]
        for how in ("sharded", "data_parallel"):  # params edited on rank 1 between steps:
            assert "ranks [1] disagree with rank 0" in got[f"shell_edited-{how}"]  # rescored


def test_check_replicas_needs_a_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        fb.distributed.check_replicas({"w": torch.zeros(2)})


def test_destroy_process_group_frees_the_group_after_a_gradient_run(tmp_path):
    """torch.func's first gradient imports torch.distributed.nn, whose functions take the
    default group as a default argument. After init_process_group that kept the group alive
    past destroy_process_group, and its gloo threads then raced the interpreter's exit
    (SIGABRT, "terminate called without an active exception")."""
    script = f"""
import sys, torch, torch.distributed as dist
import functional_bfo as fb
dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
group = dist.group.WORLD
opt = fb.hybrid_bfo(population_size=2, grad_mask=True, evaluator=fb.distributed.sharded(grads=True))
opt.update(opt.init({{"w": torch.zeros(3)}}, key=fb.random.key(0)), lambda p: (p["w"] ** 2).sum())
dist.destroy_process_group()
print("references", sys.getrefcount(group) - 1)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=HANG)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["references", "1"], run.stdout + run.stderr
