"""The docstring examples of the adapters run here, as the core's run by --doctest-modules.

The adapters are installed as ``functional_bfo.adapters`` from the folder ``adapters/``,
which pytest's collection cannot import by that name; each module is imported by its
installed name and its examples run with ``doctest``, under the suite's warning filters.
"""

from __future__ import annotations

import doctest
import importlib
import pathlib
import pkgutil
import re
import textwrap
import warnings

import pytest
import torch

import functional_bfo as fb
import functional_bfo.adapters as adapters

MODULES = sorted(m.name for m in pkgutil.iter_modules(adapters.__path__))
# Importing a framework can warn inside the framework itself (fastai's torch.jit.script).
FRAMEWORK_WARNINGS = (DeprecationWarning,)


def load(name: str):
    with warnings.catch_warnings():
        for category in FRAMEWORK_WARNINGS:
            warnings.simplefilter("ignore", category)
        try:
            return importlib.import_module(f"functional_bfo.adapters.{name}")
        except ImportError as e:  # a framework not installed: its glue says which extra
            pytest.skip(str(e))


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_of_each_adapter_module_run(name):
    module = load(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"


def test_every_module_with_examples_is_found():
    assert {"optimizers", "fastai", "loggers", "_candidates", "scipy", "optuna",
            "nevergrad"} <= set(MODULES)


def run_example(page_name: str, marker: str, space: dict | None = None,
                **replace: str) -> dict:
    """Run the python block of ``docs/page_name`` that holds ``marker``, as a user pastes it
    (``replace``: old text -> new, e.g. a smaller budget); return its names, and its text
    as ``__example__``."""
    page = pathlib.Path(__file__).parents[1] / "docs" / page_name
    example = next(block for block in re.findall(r"```python\n(.*?)```", page.read_text(),
                                                  re.S) if marker in block)
    for old, new in replace.items():
        example = example.replace(old, new)
    space = {} if space is None else space
    space["__example__"] = example
    exec(compile(textwrap.dedent(example), str(page), "exec"), space)
    return space


def test_the_scipy_example_of_the_integrations_page_runs():
    """docs/integrations.md's minimize example, as a user pastes it (no torch in it)."""
    space = run_example("integrations.md", "adapters.scipy import")
    assert "torch" not in space["__example__"]
    assert space["res"].fun - 7.0 < 1e-8 and space["res"].nfev <= 5000


def test_the_optuna_example_of_the_integrations_page_runs():
    """docs/integrations.md's sampler example, as a user pastes it, four workers."""
    pytest.importorskip("optuna")
    space = run_example("integrations.md", "adapters.optuna import", **{"print(": "("})
    best = space["study"].best_params
    assert best["layers"] == 3 and abs(best["dropout"] - 0.2) < 1e-9
    assert space["study"].best_value < 0.5 + 1e-3


def test_the_nevergrad_example_of_the_integrations_page_runs():
    """docs/integrations.md's registry example, as a user pastes it (a third of its budget)."""
    pytest.importorskip("nevergrad")
    space = run_example("integrations.md", "adapters import nevergrad",
                        **{"print(": "(", "budget=3000": "budget=1000"})
    best = space["best"]
    assert space["simulate"](*best.args, **best.kwargs) - 7.0 < 1e-4


def test_the_vmap_over_seeds_recipe_of_the_concepts_page_runs():
    """docs/concepts.md's recipe, as a newcomer pastes it: eight runs, one best each."""
    space = run_example("concepts.md", "fb.random.split", {"torch": torch, "fb": fb})
    assert space["states"].best_loss.shape == (8,)
    assert bool((space["states"].best_loss < space["loss_fn"](
        space["params"], space["x"], space["y"])).all())


def test_the_readme_first_example_ends_near_its_minimum():
    """README's "Ten lines" as a reader runs it: the comment's 2.016 against a minimum of 2."""
    readme = pathlib.Path(__file__).parents[1] / "README.md"
    first = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)[0]
    space: dict = {}
    quiet = first.replace("progress=True", "progress=False").replace("print(", "(")
    exec(compile(quiet, str(readme), "exec"), space)
    assert 2.0 <= float(space["state"].best_loss) < 2.02
