"""The maintainers' A/B harness runs fb.black_box exactly as benchmarks/quality.py does."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent


def test_ab_harness_reproduces_the_recorded_default_run(tmp_path):
    """With no settings changed, a variant's error is the recorded default's, digit for digit;
    a changed setting reaches fb.black_box. (It also fails when fb.black_box's default
    behaviour changed without benchmarks/quality.py's runs being recorded again.)"""
    out = tmp_path / "ab.md"
    proc = subprocess.run(
        [sys.executable, "dev/ab_black_box.py", "--suites", "eight", "--dims", "2",
         "--seeds", "1", "--functions", "griewank", "--variant", "same={}",
         "small={\"population_size\": 4}", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = next(line for line in out.read_text().splitlines() if line.startswith("| griewank"))
    _, name, peer, cma, default, same, small, _ = (cell.strip().rstrip("!")
                                                   for cell in row.split("|"))
    assert default == same and float(default) > 1e-8
    assert small != same
    assert "- same: beats every BFO peer in" in out.read_text()
