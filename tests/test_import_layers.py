"""The layers point one way: the import-linter contracts of pyproject.toml hold, cover every
module, and break when an arrow runs back up (docs/architecture.md "Layers")."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))

pytestmark = pytest.mark.skipif(not Path(LINT).exists(), reason="import-linter not installed (test extra)")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the packages under ``root`` with ``root``'s pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT, "--no-cache", str(root / "pyproject.toml")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


def layer_modules() -> list[str]:
    (layers,) = [c for c in CONFIG["contracts"] if c["id"] == "layers"]
    return [m.strip().strip("()") for layer in layers["layers"] for m in layer.replace("|", ":").split(":")]


def test_contracts_hold() -> None:
    res = lint(REPO)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "BROKEN" not in res.stdout and "0 broken" in res.stdout


def test_every_module_sits_in_a_layer() -> None:
    """A module no layer names is checked by nothing: a new module must be given a layer."""
    listed = layer_modules()
    missing = []
    for package in CONFIG["root_packages"]:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if module in CONFIG["root_packages"]:
                continue  # a package's own __init__: re-exports only
            if not any(module == m or module.startswith(m + ".") for m in listed):
                missing.append(module)
    assert not missing, f"add these modules to a layer in pyproject.toml [tool.importlinter]: {missing}"


def test_one_layer_list() -> None:
    """The layer order lives in one contract: no second `layers` contract to disagree with it."""
    assert [c["id"] for c in CONFIG["contracts"] if c["type"] == "layers"] == ["layers"]


def test_every_folder_sits_in_the_layer_list_in_folder_order() -> None:
    """Every package is named in the list, and the folders read top to bottom in one order
    (the runtime facade of `predictors/` is the one folder split around another: above `fitting`)."""
    assert sorted(p for p in CONFIG["root_packages"] if (REPO / p / "__init__.py").exists()) == \
        sorted(CONFIG["root_packages"])
    folders = []
    for module in layer_modules():
        folder = module.split(".")[0]
        if folder not in folders:
            folders.append(folder)
    assert folders == ["profiler", "scoring", "simulator", "serving_hooks", "policies", "predictors", "fitting",
                       "synth", "store"]
    assert sorted(folders) == sorted(CONFIG["root_packages"])


@pytest.mark.parametrize("module, line, contracts", [
    # models importing the CLI: the layers and the models-stay-down contract both break
    ("synth/pfa.py", "import profiler.cli", ("synth and predictors never import", "Layers point one way")),
    # a policy importing an HTTP client
    ("policies/capacity.py", "import httpx", ("policies are free of SGLang and HTTP",)),
    # the facade reaching pandas
    ("predictors/sessions.py", "import pandas", ("never imports pandas",)),
    # a cycle between two store modules
    ("store/faults.py", "import store.duckdb_store", ("no import cycles",)),
    # the ground floor reaching up: to the CLI's package, and to the fit
    ("store/ingest.py", "import scoring.evaluation",
     ("the store imports no other package", "Layers point one way")),
    ("store/profile_artifact.py", "import fitting.profile_fit",
     ("the store imports no other package", "Layers point one way")),
    # an estimator importing the fit that calls it
    ("predictors/output_length.py", "import fitting.profile_fit",
     ("synth and predictors never import", "Layers point one way")),
    # the fit importing the serving layer
    ("fitting/profile_fit.py", "import serving_hooks.refit", ("Layers point one way",)),
    # the folder order inside what was one serving layer: scoring > simulator > serving > policies
    ("simulator/sources.py", "import scoring.evaluation", ("Layers point one way",)),
    ("serving_hooks/refit.py", "import simulator", ("Layers point one way",)),
    ("policies/capacity.py", "import serving_hooks.routing", ("Layers point one way",)),
    # the runtime facade and the fit never import each other, either way
    ("fitting/profile_fit.py", "import predictors.compiled", ("Layers point one way",)),
    ("predictors/compiled.py", "import fitting.profile_fit", ("synth and predictors never import",)),
    # synth below the predictors' models
    ("synth/pfa.py", "import predictors.contract", ("Layers point one way",)),
])
def test_a_back_arrow_breaks_a_contract(tmp_path: Path, module: str, line: str, contracts: tuple[str, ...]) -> None:
    """Plant one bad import in a copy of the tree: lint-imports must fail and name each contract."""
    for name in (*CONFIG["root_packages"], "pyproject.toml"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, tmp_path / name)
    target = tmp_path / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")
    res = lint(tmp_path)
    assert res.returncode != 0, res.stdout[-3000:]
    broken = res.stdout.split("Broken contracts")[-1]
    for contract in contracts:
        assert contract in broken, (contract, res.stdout[-3000:])
