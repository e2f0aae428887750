"""FitOptions: one typed declaration per knob; a misspelt knob is an error, never a silent default."""
from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from fitting.profile_fit import FitOptions

ROOT = Path(__file__).resolve().parent.parent
CORE = ["coverage", "prune", "seed", "min_calls", "conditional", "ks_threshold", "ttl_quantile",
        "max_ttl_s", "max_output_tokens"]


def test_a_misspelt_knob_is_refused() -> None:
    with pytest.raises(TypeError, match="alergia_alpah"):
        FitOptions(alergia_alpah=0.3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"manifest X: unknown fit option\(s\) 'alergia_alpah'.*known: .*alergia_alpha"):
        FitOptions.from_dict({"coverage": 0.9, "alergia_alpah": 0.3}, source="manifest X")


def test_the_manifest_record_keeps_its_shape() -> None:
    """The core knobs always, in order; every other knob only where it was changed (so a
    default fit records exactly what it recorded before the knobs were declared)."""
    assert list(FitOptions().as_dict()) == CORE
    opts = FitOptions(order_only=True, group_by="workflow_id", min_calls=5)
    assert opts.as_dict() == {**FitOptions(min_calls=5).as_dict(), "order_only": True,
                              "group_by": "workflow_id"}
    assert list(opts.as_dict())[len(CORE):] == ["order_only", "group_by"]


def test_round_trip_through_the_manifest() -> None:
    opts = FitOptions(coverage=0.95, drift=False, loop_quantiles=(0.05, 0.95), synth_max_workflows=0)
    as_json = {k: list(v) if isinstance(v, tuple) else v for k, v in opts.as_dict().items()}
    assert FitOptions.from_dict(as_json) == opts
    assert FitOptions.from_dict({}) == FitOptions()


def _keys_read(path: Path) -> set[str]:
    """The string keys a section builder reads from its ``options`` dict."""
    keys = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and node.args and isinstance(node.args[0], ast.Constant)
                and "options" in ast.unparse(node.func.value)):
            keys.add(node.args[0].value)
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                and ast.unparse(node.value) == "options"):
            keys.add(node.slice.value)
    return keys


@pytest.mark.parametrize("builder", ["synth/profile_section.py", "predictors/nat_trie.py"])
def test_every_key_a_builder_reads_is_a_declared_knob(builder: str) -> None:
    read = _keys_read(ROOT / builder)
    assert read, f"no options read found in {builder}: the scan is broken"
    assert read <= set(FitOptions().knobs()), read - set(FitOptions().knobs())
    assert set(FitOptions().knobs()) == {f.name for f in fields(FitOptions)}


def test_refit_refuses_an_unknown_recorded_option(tmp_path: Path) -> None:
    from serving_hooks.refit import options_from_profile
    from store.profile_artifact import write_profile

    write_profile(tmp_path / "p", {}, {"options": {**FitOptions(coverage=0.9).as_dict()}})
    assert options_from_profile(tmp_path / "p") == FitOptions(coverage=0.9)
    write_profile(tmp_path / "q", {"x": 1}, {"options": {"coverage": 0.9, "covrage": 0.5}})
    with pytest.raises(ValueError, match="unknown fit option.*'covrage'"):
        options_from_profile(tmp_path / "q")
