"""The adapter examples run (a few steps each, so the suite stays fast)."""

import importlib.util
import math
import pathlib

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
