"""The benchmark scripts' --quick smoke runs work and write JSON + Markdown (timings unchecked)."""

import json
import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).parent.parent / "benchmarks"


@pytest.mark.parametrize("script,stem", [("adapter_paths.py", "adapter_paths_quick"),
                                         ("update_overhead.py", "update_overhead_quick"),
                                         ("speed.py", "speed_quick"),
                                         ("scaling.py", "scaling_quick")])
def test_quick_run_writes_results(script, stem, tmp_path):
    subprocess.run([sys.executable, script, "--quick", "--out", str(tmp_path)],
                   cwd=BENCHMARKS, check=True, capture_output=True, timeout=600)
    result = json.loads((tmp_path / f"{stem}.json").read_text())
    assert result["quick"] is True and result["machine"]["torch"]
    assert (tmp_path / f"{stem}.md").read_text().startswith("# ")
