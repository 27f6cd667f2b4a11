"""The public surface is pinned: names, import paths, docstrings."""

import importlib
import pathlib

PUBLIC = {
    "functional_bfo": {
        "AdaptiveBFOHyperparams", "AdaptiveBFOState", "Ask", "AskFn", "BFOHyperparams", "BFOState",
        "BlackBoxResult", "BlackBoxState", "HybridBFOHyperparams", "HybridBFOState", "InitFn",
        "Key", "LossFn", "Optimizer", "Params", "PyTree", "TellFn", "UpdateFn", "adaptive_bfo",
        "bfo", "black_box", "black_box_search", "distributed", "evaluate", "hybrid_bfo", "load",
        "materialize", "metrics", "module_loss", "as_params", "random", "run", "save",
        "with_grad_mask", "with_hyperparams", "with_start_loss",
    },
    "functional_bfo.random": {
        "CPU_KERNEL", "bits", "fold_in", "key", "normal", "normal_rows", "split", "threefry2x32",
        "tree_normal_like", "uniform",
    },
    "functional_bfo.evaluate": {"Evaluator", "loop", "vmap"},
    "functional_bfo.distributed": {"DataParallel", "Sharded", "check_agreement", "check_replicas",
                                   "data_parallel", "disagreeing", "sharded"},
}

ALIASES = {"Key", "Params", "PyTree"}  # type aliases of Tensor / Any: documented in _base.py


def test_public_names_are_pinned():
    for module, names in PUBLIC.items():
        mod = importlib.import_module(module)
        assert set(mod.__all__) == names, module
        for name in names:
            assert getattr(mod, name) is not None


def test_every_public_callable_has_a_docstring():
    for module, names in PUBLIC.items():
        mod = importlib.import_module(module)
        for name in names:
            obj = getattr(mod, name)
            if callable(obj) and name not in ALIASES:
                assert (obj.__doc__ or "").strip(), f"{module}.{name} has no docstring"


def test_adapters_install_as_a_subpackage():
    adapters = importlib.import_module("functional_bfo.adapters")
    assert adapters.__name__ == "functional_bfo.adapters"
    assert set(adapters.__all__) == {"AdaptiveBFO", "BFO", "HybridBFO", "SwarmOptimizer",
                                     "evaluating_candidates"}
    for name in adapters.__all__:
        assert (getattr(adapters, name).__doc__ or "").strip(), name


def test_every_public_name_is_documented():
    docs = "\n".join(p.read_text() for p in pathlib.Path(__file__).parents[1].glob("docs/*.md"))
    missing = [f"{m}.{n}" for m, names in PUBLIC.items() for n in names
               if f"`{'fb.' + m.split('.', 1)[1] + '.' if '.' in m else 'fb.'}{n}" not in docs]
    assert not missing, f"public names missing from docs/: {missing}"


def test_the_library_decides_nothing_by_execution_mode_or_private_torch_api():
    """update is one program: no branch on compiling or transforms, no torch._ internals."""
    root = pathlib.Path(__file__).parents[1]
    offenders = []
    for path in [*root.glob("functional_bfo/*.py"), *root.glob("adapters/*.py")]:
        text = path.read_text()
        for needle in ("torch._", "is_compiling", "_python_dispatch", "functorch"):
            if needle in text:
                offenders.append(f"{path.name}: {needle}")
    assert not offenders, offenders


def test_the_variants_states_share_their_leading_fields():
    """The shared fields are declared in each NamedTuple (they have no field inheritance);
    this keeps the three declarations and the one place that fills them in step."""
    import torch

    import functional_bfo as fb
    from functional_bfo._population import initial_population

    shared = fb.BFOState._fields[:-1]
    assert fb.AdaptiveBFOState._fields[:len(shared)] == shared
    adaptive = fb.AdaptiveBFOState._fields[:-2]  # the hybrid learns no metric
    assert fb.HybridBFOState._fields[:len(adaptive)] == adaptive
    assert {c._fields[-1] for c in (fb.BFOState, fb.HybridBFOState)} == {"hyperparams"}
    assert fb.AdaptiveBFOState._fields[-2:] == ("hyperparams", "metric")
    start = initial_population({"x": torch.zeros(2)}, fb.random.key(0), 3, None, 1.0)
    filled = start.state_fields(1.0, {}, lambda: None)
    assert tuple(k for k in filled if k != "hyperparams") == shared


def test_the_api_reference_lists_every_public_name():
    """docs/api.md renders each public name (mkdocs build --strict in CI fails on a stale one)."""
    api = (pathlib.Path(__file__).parents[1] / "docs" / "api.md").read_text()
    missing = [n for n in PUBLIC["functional_bfo"] - ALIASES
               if f"::: functional_bfo.{n}\n" not in api]
    assert not missing, f"add to docs/api.md: {missing}"


def test_every_relative_link_in_the_docs_and_readme_points_at_a_file():
    """mkdocs checks links between pages; links out of docs/ (scripts, results) are checked
    here, so that a moved or deleted file breaks the build instead of the page."""
    import re

    root = pathlib.Path(__file__).parents[1]
    pages = [*root.glob("docs/*.md"), root / "README.md", root / "CONTRIBUTING.md"]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#")[0]
            if path and "://" not in path and not (page.parent / path).exists():
                broken.append(f"{page.name}: {target}")
    assert not broken, broken
