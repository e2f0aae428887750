"""Estimator conformance, modelled on scikit-learn's estimator checks (``check_estimator``), over
every estimator of ``predictors/`` and ``synth/`` that claims the contract (DEVELOPERS.md):

* ``__init__`` stores its parameters and nothing else (``check_no_attributes_set_in_init``);
* ``fit`` returns self; the fitted attributes end in ``_``, exist only after ``fit``, and ``fit``
  leaves the parameters as they were (``check_dont_overwrite_parameters``); no public state
  outside them;
* ``sklearn.base.clone`` gives an unfitted copy with equal parameters (``check_estimators_overwrite_params``
  and clone's own identity check of every parameter);
* ``get_params`` / ``set_params`` round-trip, and ``set_params`` returns self;
* fitting twice on the same data gives the same fitted state (``check_fit_idempotent``).

Each estimator is fit on real calls: a generated coding-assistant workload ingested into a real
DuckDB store and read back with the fit's own queries (``fitting.profile_fit``).
"""
from __future__ import annotations

import copy
import pickle
from typing import Any, Callable

import pytest
from sklearn.base import clone

from fitting.profile_fit import _tool_rows_sql, idle_gap_calls, ok_calls
from predictors.idle_gap import IdleGapModel
from predictors.nat_trie import PredictionTrie
from predictors.output_length import OutputLengthIntervals
from predictors.remaining_tokens import RemainingTokens
from predictors.tool_latency import ToolLatencyModel
from store import ingest as ingest_mod
from store.duckdb_store import connect
from store.frames import query_frame
from store.workloads import generate, write_jsonl
from synth.remaining import RemainingWork
from synth.vomm import VariableOrderMarkov


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Any]:
    """The inputs each estimator is fit on in ``profiler fit``, from 80 generated workflows."""
    d = tmp_path_factory.mktemp("conformance")
    write_jsonl(generate("coding_assistant", 80, seed=5), d / "calls.jsonl")
    con = connect(d / "store.duckdb")
    try:
        ingest_mod.ingest(con, [d / "calls.jsonl"])
        calls = ok_calls(con)
        gaps = idle_gap_calls(con)
        tools = query_frame(con, _tool_rows_sql("workflow_type_id, workflow_id, tool_name, t_start, latency_s", con))
        trie = query_frame(con, "SELECT workflow_type_id, workflow_id, agent_id, request_id, call_index, "
                                "t_arrival, t_finish, output_tokens FROM calls WHERE status = 'ok' "
                                "ORDER BY workflow_type_id, workflow_id, call_index")
    finally:
        con.close()
    seqs = [list(g["agent_id"]) for _, g in calls.groupby("workflow_id", sort=True)]
    return {"calls": calls, "gaps": gaps, "tools": tools, "seqs": seqs, "trie": trie}


#: name -> (a fresh estimator as the fit builds it, how it is fit on ``data``)
ESTIMATORS: dict[str, tuple[Callable[[], Any], Callable[[Any, dict], Any]]] = {
    "OutputLengthIntervals": (lambda: OutputLengthIntervals(n_folds=3, cond_max_samples=500),
                              lambda e, d: e.fit(d["calls"])),
    "RemainingTokens": (lambda: RemainingTokens(cv_folds=3), lambda e, d: e.fit(d["calls"])),
    "ToolLatencyModel": (lambda: ToolLatencyModel(half_lives=(None, 0.5)), lambda e, d: e.fit(d["tools"])),
    "IdleGapModel": (lambda: IdleGapModel(folds=3), lambda e, d: e.fit(d["gaps"])),
    "PredictionTrie": (PredictionTrie, lambda e, d: e.fit(d["trie"])),
    "VariableOrderMarkov": (lambda: VariableOrderMarkov(max_order=4), lambda e, d: e.fit(d["seqs"])),
    "RemainingWork": (lambda: RemainingWork(order=4), lambda e, d: e.fit(d["seqs"])),
}


def fitted_names(est: Any) -> set[str]:
    """Public fitted attributes: sklearn's convention, a trailing underscore (not dunder)."""
    return {k for k in vars(est) if k.endswith("_") and not k.startswith("_")}


def same(a: Any, b: Any) -> bool:
    """Equality of fitted state (numpy arrays and NaN included): compared through pickle."""
    return pickle.dumps(a, protocol=5) == pickle.dumps(b, protocol=5)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_init_stores_its_parameters_and_nothing_else(name):
    make, _ = ESTIMATORS[name]
    est = make()
    params = est.get_params()
    assert set(vars(est)) == set(params), f"{name}.__init__ sets {set(vars(est)) ^ set(params)}"
    assert not fitted_names(est)
    assert est.set_params(**params) is est
    assert est.get_params() == params


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_fit_returns_self_sets_only_fitted_attributes_and_keeps_the_parameters(name, data):
    make, fit = ESTIMATORS[name]
    est = make()
    params = copy.deepcopy(est.get_params())
    before = set(vars(est))
    assert fit(est, data) is est
    added = set(vars(est)) - before
    public = {k for k in added if not k.startswith("_")}
    assert public, f"{name}.fit set no fitted attribute"
    assert public == fitted_names(est), f"{name}.fit sets state outside fitted attributes: " \
                                        f"{sorted(public - fitted_names(est))}"
    assert est.get_params() == params, f"{name}.fit changed its parameters"


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_clone_is_unfitted_with_equal_parameters(name, data):
    make, fit = ESTIMATORS[name]
    est = fit(make(), data)
    twin = clone(est)
    assert type(twin) is type(est) and twin is not est
    assert twin.get_params() == est.get_params()
    assert not fitted_names(twin), f"clone of {name} carries {fitted_names(twin)}"
    # a parameter changed on the clone leaves the original alone
    key = next(iter(sorted(est.get_params())), None)
    if key is not None:
        other = copy.deepcopy(est.get_params()[key])
        twin.set_params(**{key: other})
        assert twin.get_params()[key] == other


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_fitting_twice_gives_the_same_fitted_state(name, data):
    make, fit = ESTIMATORS[name]
    a = fit(make(), data)
    b = fit(fit(make(), data), data)
    for attr in sorted(fitted_names(a)):
        assert same(getattr(a, attr), getattr(b, attr)), f"{name}.{attr} differs on a refit"


def test_every_estimator_of_predictors_and_synth_is_checked():
    """A new class with a ``fit`` method in predictors/ or synth/ must join ESTIMATORS."""
    import importlib
    import inspect
    import pkgutil

    import predictors
    import synth

    found = set()
    for pkg in (predictors, synth):
        for mod in pkgutil.iter_modules(pkg.__path__):
            module = importlib.import_module(f"{pkg.__name__}.{mod.name}")
            for cname, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == module.__name__ and callable(getattr(cls, "fit", None)):
                    found.add(cname)
    assert found == set(ESTIMATORS), f"not checked: {sorted(found - set(ESTIMATORS))}"


def test_checks_fail_on_a_broken_estimator():
    """The checks can fail: an estimator that sets a public non-fitted attribute in fit, and one
    whose __init__ changes a parameter, are caught."""
    class Sloppy(RemainingWork):
        def fit(self, sequences, weights=None, timings=None):
            super().fit(sequences, weights, timings)
            self.cache = {}
            return self

    est = Sloppy(order=2)
    est.fit([["a", "b"], ["a", "c"]])
    assert "cache" in set(vars(est)) - fitted_names(est) - set(est.get_params())

    class Rewrites(VariableOrderMarkov):
        def __init__(self, max_order: int = 8, escape: float = 1.0, min_count: int = 1,
                     max_contexts: int = 20_000, min_context: float = 1.0) -> None:
            super().__init__(max_order, escape, min_count, max_contexts, min_context)
            self.max_contexts = self.max_contexts + 1

    with pytest.raises(RuntimeError):
        clone(Rewrites())
