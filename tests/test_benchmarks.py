"""The benchmark scripts' --quick smoke runs work and write JSON + Markdown (timings unchecked).

The smoke runs are marked ``bench``: README's test command leaves them out and CI runs them
as a step of their own (``python -m pytest -q -m bench``, .ci/run). The other tests here
(the problems, the tables, the peers' adapters) run with the rest of the suite.
"""

import itertools
import json
import os
import pathlib
import subprocess
import sys

import pytest

# One pytest-xdist worker runs them all, so that the smoke runs start once (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("benchmarks")

BENCHMARKS = pathlib.Path(__file__).parent.parent / "benchmarks"

QUICK = {"adapter_paths.py": "adapter_paths_quick",
         "update_overhead.py": "update_overhead_quick",
         "update_overhead.py --baseline ..": "update_overhead_baseline_quick",  # the core too
         "update_overhead.py --first-compile": "first_compile_quick",  # fresh processes
         "gpu_profile.py": "gpu_profile_quick",  # on the CPU: ops and host time, no kernels
         "speed.py": "speed_quick",
         "scaling.py": "scaling_quick",
         "distributed.py": "distributed_quick",
         "quality.py": "quality_quick",
         "quality.py --suite bbob": "quality_bbob_quick",
         "coco.py": "coco_quick",
         "black_box_speed.py": "black_box_speed_quick",
         "integrations.py": "integrations_quick"}


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory):
    """Every script's --quick run, all started at once (one thread each: timings unchecked),
    so the smoke runs share the machine's cores instead of queueing.

    Their compiles run Dynamo only (torch's TORCH_COMPILE_OVERRIDE_BACKENDS, backend eager):
    a graph break still fails ``fullgraph=True``, and Inductor's code generation, most of a
    cold compile on a CPU, is what the contract tests run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_COMPILE_OVERRIDE_BACKENDS": ">=0:eager"}
    runs = {}
    for script in QUICK:
        out = tmp_path_factory.mktemp(script.removesuffix(".py"))
        runs[script] = (out, subprocess.Popen(
            [sys.executable, *script.split(), "--quick", "--out", str(out)], cwd=BENCHMARKS,
            env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    yield runs
    for _, proc in runs.values():  # runs no test waited for: killed, their pipes closed
        proc.kill()
        proc.communicate()


def finished(runs, script):
    out, proc = runs[script]
    output = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, output[-3000:]
    return out


@pytest.mark.bench
@pytest.mark.parametrize("script", [s for s in QUICK if not s.startswith(
    ("quality.py", "coco.py")) and not s.endswith("--first-compile")])
def test_quick_run_writes_results(script, quick_runs):
    out = finished(quick_runs, script)
    stem = QUICK[script]
    result = json.loads((out / f"{stem}.json").read_text())
    assert result["quick"] is True and result["machine"]["torch"]
    assert (out / f"{stem}.md").read_text().startswith("# ")


@pytest.mark.bench
def test_first_compile_quick_run_times_each_program_in_a_fresh_process(quick_runs):
    """inductor's start-up, then the update and the shell's compiled step cold and warm; the
    probe and tracing within each."""
    out = finished(quick_runs, "update_overhead.py --first-compile")
    result = json.loads((out / "first_compile_quick.json").read_text())
    assert result["quick"] is True
    assert [(r["program"], r["process"]) for r in result["rows"]] == [
        ("one-op", "cold"), ("bfo", "cold"), ("bfo", "warm"), ("shell", "cold"),
        ("shell", "warm")]
    assert all(r["s"] >= r["probe_s"] >= 0 and r["trace_s"] >= 0 for r in result["rows"])
    assert (out / "first_compile_quick.md").read_text().startswith("# ")


@pytest.mark.bench
def test_quality_quick_run_writes_results(quick_runs):
    """Ours only where no peer is installed; the tables are built from the run log."""
    tmp_path = finished(quick_runs, "quality.py")
    result = json.loads((tmp_path / "quality_quick.json").read_text())
    assert result["quick"] is True
    cell = result["cells"]["sphere|2"]
    assert {"fb.bfo", "fb.adaptive_bfo", "fb.adaptive_bfo black-box", "fb.black_box"} <= set(cell)
    assert all(len(v["errors"]) == result["seeds"] for v in cell.values())
    runs = (tmp_path / "quality_quick_runs.jsonl").read_text().splitlines()
    # A second invocation resumes: every run is already logged, so nothing is appended.
    subprocess.run([sys.executable, "quality.py", "--quick", "--out", str(tmp_path),
                    "--optimizers", "fb.bfo"], cwd=BENCHMARKS, check=True,
                   capture_output=True, timeout=900)
    assert (tmp_path / "quality_quick_runs.jsonl").read_text().splitlines() == runs


@pytest.mark.bench
def test_coco_quick_run_writes_a_coco_data_set_and_its_ecdf(quick_runs):
    """cocoex's observer logs every run, a function per process, merged into one data set;
    cocopp draws the ECDF; docs/figures is untouched."""
    figures = BENCHMARKS.parent / "docs" / "figures"
    before = sorted(figures.glob("coco_ecdf_*"))
    out = finished(quick_runs, "coco.py")
    result = json.loads((out / "coco_quick.json").read_text())
    cell = result["summary"]["fb.black_box"]["2"]
    assert result["quick"] is True and cell["runs"] == 4 and 0 < cell["reached"] <= 1
    data_set = out / "coco" / "fb.black_box"
    assert sorted(p.name for p in data_set.iterdir()) == [
        "bbobexp_f1.info", "bbobexp_f5.info", "data_f1", "data_f5"]
    assert not (out / "coco" / "fb.black_box.parts").exists()
    assert (out / "coco" / "coco_ecdf_2D.png").stat().st_size > 0
    assert sorted(figures.glob("coco_ecdf_*")) == before


@pytest.fixture
def benchmarks_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))


@pytest.mark.parametrize("dim", [2, 10, 30])
def test_problems_are_errors_zero_at_the_optimum_and_positive_elsewhere(dim, benchmarks_on_path):
    import torch
    from problems import BOXES, make, optimum

    generator = torch.Generator().manual_seed(dim)
    for name, half_width in BOXES.items():
        for rotate in (False, True):
            loss, (low, high) = make(name, dim, seed=3, rotate=rotate)
            best = optimum(name, dim, seed=3)
            assert low <= float(best.min()) and float(best.max()) <= high, name
            assert abs(float(loss({"x": best}))) < 1e-9, (name, rotate)
            assert float(loss({"x": best + 1e-2})) > 0, (name, rotate)
            x = (torch.rand(200, dim, generator=generator, dtype=torch.float64) * 2 - 1)
            values = torch.stack([loss({"x": row * half_width}) for row in x])
            assert float(values.min()) > -1e-9, (name, rotate)


def test_quality_summary_counts_cells_beaten_against_bfo_peers_only(benchmarks_on_path):
    from quality import FRACTIONS, summarize

    def run(optimizer, function, error, seed):
        return {"optimizer": optimizer, "function": function, "dim": 10, "seed": seed,
                "error": error, "seconds": 1.0, "curve": [error] * len(FRACTIONS)}

    runs = [run(o, f, e, s) for s in range(3) for o, f, e in [
        ("ours", "a", 1e-3), ("mealpy.ABFO", "a", 1e-2), ("cma.CMAES", "a", 1e-9),
        ("ours", "b", 1e-12), ("mealpy.ABFO", "b", 1e-10)]]  # b: a tie at the 1e-8 floor
    summary = summarize(runs, ["ours", "mealpy.ABFO", "cma.CMAES"], ["a", "b"], [10], 3,
                        ours=("ours",))
    verdict = summary["verdict"]["ours"]
    assert verdict["cells_beating_every_bfo_peer"] == 1  # CMA-ES is not a BFO peer; ties lose
    assert verdict["cells_with_bfo_peers"] == 2
    assert verdict["cells_where_cma_es_is_better"] == 1
    assert verdict["mean_log10_error_d10"] == pytest.approx((-3 + -8) / 2)
    assert summary["verdict"]["mealpy.ABFO"]["mean_log10_error_d10"] == pytest.approx(-5)


@pytest.mark.bench
def test_quality_bbob_quick_run_scores_coco_problems(quick_runs):
    """The BBOB suite runs through cocoex; errors are f - f_opt, so never below 0."""
    tmp_path = finished(quick_runs, "quality.py --suite bbob")
    result = json.loads((tmp_path / "quality_bbob_quick.json").read_text())
    assert result["suite"] == "bbob"
    assert set(result["cells"]) == {f"{name}|{dim}" for name in ("f01 sphere",
                                                                   "f02 ellipsoid-separable")
                                    for dim in (2, 5)}
    runs = [json.loads(line) for line in
            (tmp_path / "quality_bbob_quick_runs.jsonl").read_text().splitlines()]
    budget = result["budget_per_dim"]  # a smoke run's: 200 x D
    assert runs and all(0 <= r["error"] and r["evals"] <= budget * r["dim"] for r in runs)
    sphere = result["cells"]["f01 sphere|2"]["fb.black_box"]["median"]
    assert sphere < 0.1, sphere  # COCO's f_opt, in [-1000, 1000], was taken off


def test_bbob_offsets_hand_over_coco_values_and_report_the_same_errors(benchmarks_on_path):
    """With offsets the optimizers see COCO's f(x) (minimum f(x*) != 0); value - optimum is
    the error the suite reports without them."""
    import numpy as np
    import torch
    from quality import problem

    x = np.linspace(-4, 4, 10)
    for name in ("f01 sphere", "f15 rastrigin"):
        plain, offset = problem("bbob", name, 10, 2), problem("bbob", name, 10, 2, offset=True)
        assert plain.optimum == 0.0 and offset.optimum != 0.0
        assert offset.f(x) - offset.optimum == pytest.approx(plain.f(x), rel=1e-12, abs=1e-9)
        assert float(offset.loss({"x": torch.from_numpy(x)})) == pytest.approx(offset.f(x))


@pytest.mark.bench
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="runs where there is none")
def test_the_gpu_script_says_it_needs_cuda():
    run = subprocess.run([sys.executable, "gpu.py", "--quick"], cwd=BENCHMARKS, text=True,
                         capture_output=True, timeout=300)
    assert run.returncode != 0 and "gpu.py needs a CUDA device" in run.stderr


def test_the_gpu_tables_render_the_recorded_run(benchmarks_on_path):
    """gpu.py's Markdown from its JSON: every recorded row appears in the committed table."""
    import gpu

    result = json.loads((BENCHMARKS / "results" / "gpu_cuda.json").read_text())
    lines = gpu.markdown(result)
    assert lines[1:] == (BENCHMARKS / "results" / "gpu_cuda.md").read_text().splitlines()[1:]
    rows = [line for line in lines if line.startswith("| bfo | 65536 |")]
    assert len(rows) == 3 and len(result["updates"]) + 3 <= len(lines)


def test_the_gpu_tables_say_which_floor_a_run_used_and_its_gpu_times(benchmarks_on_path):
    """A run with five different populations as its floor reports the GPU times of the
    compiled rows; a run recorded before says its floor was one population five times."""
    import gpu

    result = json.loads((BENCHMARKS / "results" / "gpu_cuda.json").read_text())
    assert "computes it once" in "\n".join(gpu.markdown(result))
    row = {**result["updates"][1], "gpu_us": 151.4, "floor_gpu_us": 46.4, "kernels": 30.6,
           "longest": [["radix_sort", 33.0], ["unit_rows", 20.3]]}
    text = "\n".join(gpu.markdown({**result, "floor": "5 populations", "updates": [row]}))
    assert "5 vmapped evaluations of 5 populations" in text
    assert ("| bfo | 65536 | 151.4 | 46.4 | 3.26 | 31 | `radix_sort` 33.0; `unit_rows` 20.3 |"
            in text)


def test_the_gpu_script_runs_only_the_rows_asked_for(benchmarks_on_path):
    import gpu

    assert gpu.plan(False, "'hybrid_bfo', 65536") == [
        ("update", ("hybrid_bfo", 65536, mode)) for mode in gpu.MODES]
    assert gpu.plan(True) == gpu.plan(True, "") and ("glue", ()) in gpu.plan(True)


@pytest.mark.parametrize("name", ["mealpy.OriginalBFO", "mealpy.ABFO", "niapy.BFO",
                                  "pymetaheuristic.BFO", "cma.CMAES"])
def test_each_installed_peer_runs_at_a_tiny_budget(name, benchmarks_on_path):
    """The peers' adapters call the peers' APIs: the next API change fails here, not in a
    benchmark run (skipped where the peer is not installed: pip install -e ".[bench]")."""
    import math

    import peers

    assert name in peers.PEERS
    if name not in peers.available():
        pytest.skip(f"{name.split('.')[0]} is not installed")
    out = peers.run_peer(name, lambda x: float((x**2).sum()), 2, -5.0, 5.0, 300, 10, 0)
    assert 0 < out["evals"] <= 300 and math.isfinite(out["best"])


def markdown_tables(text: str) -> list[tuple[str, list[str]]]:
    """Each Markdown table of ``text``: its header row and its body rows, stripped."""
    tables, lines = [], [line.strip() for line in text.splitlines()]
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and lines[i + 1].startswith("|---"):
            body = itertools.takewhile(lambda row: row.startswith("|"), lines[i + 2:])
            tables.append((line, list(body)))
    return tables


def test_docs_tables_that_copy_a_record_hold_its_rows():
    """A table of docs/benchmarks.md whose header is a recorded table's (or one with a D
    column before it, the records' tables per D side by side) holds only rows of the records'
    tables under that header: a row pasted under another table's header (as BBOB rows once
    landed in the Optuna table), a stale row or a figure edited by hand fails here."""
    recorded: dict[str, set[str]] = {}
    for path in sorted((BENCHMARKS / "results").glob("*.md")):
        for header, body in markdown_tables(path.read_text()):
            recorded.setdefault(header, set()).update(body)
    docs, copies = BENCHMARKS.parent / "docs" / "benchmarks.md", []
    for header, body in markdown_tables(docs.read_text()):
        if header.startswith("| D |") and (per_d := header.removeprefix("| D ")) in recorded:
            header, body = per_d, ["|" + row.split("|", 2)[2] for row in body]  # D tables
        if header in recorded:
            copies.append((header, body))
    assert len(copies) >= 15  # the quality, COCO, speed, GPU and integrations tables
    strays = [row for header, body in copies for row in body if row not in recorded[header]]
    assert not strays, f"docs/benchmarks.md rows in no record's table: {strays[:5]}"
