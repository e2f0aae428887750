"""Re-judge a stored real-engine measurement with the simulator as it is now.

``python bench/engine_resimulate.py docs/measurements/engine-matrix-2026-11-29.json`` rebuilds each
condition's workload from the settings stored in the JSON (the same seeds, the same
deterministic preparation as ``bench/bench_engine.py``), fits the same profiles, rebuilds the
step-time model and server limits the run calibrated (``conditions.<c>.simulator.step`` /
``.limits``), replays every seed under every arm in the current simulator, and judges it
against the *measured* runs stored beside it (:func:`bench.engine_report.fidelity`).

Why: a change to the simulator's model of the engine (admission, preemption, the host tier) can
be checked against the engine's own figures without re-running the engine, which must run alone
for half an hour; a fix that does not move fidelity toward the measurement is not a fix.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engine import fit_profiles, parse_args  # noqa: E402
from bench.engine_conditions import EngineWorkload, prepare_workload  # noqa: E402
from bench.engine_report import fidelity, ratios, same_seed_ratios  # noqa: E402
from bench.engine_sim import CHATML, ChatTemplate, arm_summary, cluster, scaled_records, simulate_runs  # noqa: E402
from simulator.calibration import StepTimeModel  # noqa: E402
from simulator.config import ClusterConfig  # noqa: E402
from simulator.engine import SimResult  # noqa: E402

STEP_FIELDS = ("t0", "a", "a_ctx", "c", "e", "a_attn", "prefill_t0", "source")


def rebuild(cond: dict, rate: float | None = None, seeds: list[int] | None = None,
            ) -> tuple[dict, list[str], list[int], ClusterConfig, EngineWorkload]:
    """What the stored condition ``cond`` ran, rebuilt: its settings, arms, seeds, the cluster the
    run calibrated (step time and server limits) and the workload (the same deterministic
    preparation as ``bench/bench_engine.py``). ``rate`` / ``seeds`` replace the stored ones (a
    what-if on the same calibrated replica)."""
    st = dict(cond["settings"], **({"rate": rate} if rate is not None else {}))
    names = list(st["setups"])
    seeds = list(seeds) if seeds is not None else [int(s) for s in cond["seeds"]]
    # --estimate: a rebuild starts no server, so it must not need sglang-router installed (the
    # stored settings then reset every flag, ``estimate`` included)
    args = parse_args(["--condition", st["condition"], "--estimate"])
    for key, value in st.items():
        setattr(args, key, value)
    args.seeds = seeds
    stored = cond["simulator"]["step"]
    # a run stored before the flag existed was calibrated with --enable-cache-report on: its fit
    # saw the engine's cache hits, so its context term is paid by hits too
    step = StepTimeModel(**{k: stored[k] for k in STEP_FIELDS}, ctx_on_hits=stored.get("ctx_on_hits", True))
    cfg = cluster(cond["simulator"]["limits"], step, st["replicas"], not st.get("gpu"))
    return st, names, seeds, cfg, prepare_workload(st["condition"], seeds, args)


def stored_template(cond: dict) -> ChatTemplate:
    """The chat template the run measured (``conditions.<c>.simulator.template``), or, for a run
    stored before it was measured, the bench model's (:data:`bench.engine_sim.CHATML`)."""
    stored = cond["simulator"].get("template")
    return ChatTemplate(**stored) if stored else CHATML


def simulated_runs(cond: dict, rate: float | None = None, seeds: list[int] | None = None,
                   only: Collection[int] | None = None, shared_compute: bool = True,
                   ) -> tuple[dict[int, dict[str, SimResult]], list[str], list[int]]:
    """The simulator's whole run of every arm on every seed of the stored condition ``cond`` (or
    ``seeds``, at ``rate``; of those only ``only`` when given), on the replica the run calibrated
    (``shared_compute`` False: each replica with the host to itself):
    ``({seed: {arm: SimResult}}, arms, seeds run)``."""
    st, names, seeds, cfg, wl = rebuild(cond, rate, seeds)
    cfg = replace(cfg, shared_compute=cfg.shared_compute and shared_compute)
    template = stored_template(cond)
    seeds = [s for s in seeds if only is None or s in only]
    with tempfile.TemporaryDirectory() as tmp:
        profiles = fit_profiles(wl, Path(tmp))
        runs = {s: simulate_runs(scaled_records(wl.replay[s], 1.0, st["time_scale"]), profiles[s], cfg,
                                 st["concurrency"], names, preemption_threshold=st["preemption_threshold"],
                                 rate=st.get("rate"), seed=s, template=template)
                for s in seeds}
    return runs, names, seeds


def simulate_condition(cond: dict, rate: float | None = None, seeds: list[int] | None = None,
                       ) -> tuple[dict[int, dict], list[str], list[int]]:
    """Every seed of the stored condition ``cond`` (or ``seeds``, at ``rate``) under every arm in
    the current simulator, summarised as the bench reports an arm: ``({seed: {arm: row}}, arms,
    seeds)``."""
    runs, names, seeds = simulated_runs(cond, rate, seeds)
    return {s: {n: arm_summary(n, res) for n, res in r.items()} for s, r in runs.items()}, names, seeds


def resimulate_condition(cond: dict) -> dict:
    """The stored condition ``cond`` replayed in the current simulator: per seed and arm, the arm
    means, the ratios and the fidelity against the stored measured runs."""
    sim, names, seeds = simulate_condition(cond)
    arms = {n: float(np.mean([sim[s][n]["jct_avg_s"] for s in seeds])) for n in names}
    measured_arms = {n: cond["arms"][n]["jct_avg_s"] for n in names}
    simulated = same_seed_ratios(sim, names, cond["ratios"])
    return {"seeds": sim, "arms": arms, "ratios": simulated,
            "fidelity": fidelity(cond["ratios"], simulated, measured_arms, arms)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measurement", type=Path, help="a bench_engine.py --out JSON with its simulator section")
    ap.add_argument("--condition", nargs="+", help="only these conditions (default: every one with a simulator)")
    ap.add_argument("--out", type=Path, help="write the re-simulated sections here (JSON)")
    ap.add_argument("--rate", type=float, help="what-if: replay open loop at this rate (workflows/s) instead of "
                    "the stored one, on the replica the run calibrated; prints the predicted ratios, no fidelity")
    ap.add_argument("--seeds", type=int, nargs="+", help="what-if: these seeds instead of the stored ones")
    a = ap.parse_args(argv)
    data = json.loads(a.measurement.read_text())
    out = {}
    for name, cond in data["conditions"].items():
        if "simulator" not in cond or (a.condition and name not in a.condition):
            continue
        if a.rate is not None or a.seeds is not None:
            sim, names, seeds = simulate_condition(cond, a.rate, a.seeds)
            out[name] = {"seeds": sim, "ratios": ratios(sim, names)}
            print(f"== {name} what-if: rate {a.rate if a.rate is not None else cond['settings'].get('rate')}, "
                  f"{len(seeds)} seeds, the step time and limits this run calibrated")
            for key, v in out[name]["ratios"].items():
                print(f"  {key:>24}: avg JCT {v['mean_avg']:.3f} (per seed {' '.join(f'{x:.2f}' for x in v['avg'])}), "
                      f"P95 {v['mean_p95']:.3f}")
            continue
        new = out[name] = resimulate_condition(cond)
        old = cond["fidelity"]
        print(f"== {name} ({len(cond['seeds'])} seeds)")
        for arm, v in new["fidelity"]["arms"].items():
            before = old["arms"].get(arm, {})
            print(f"  {arm:>12}: measured {v['measured']:.2f}s; simulated before {before.get('simulated', float('nan')):.2f}s "
                  f"({before.get('rel_error', float('nan')):+.0%}), now {v['simulated']:.2f}s ({v['rel_error']:+.0%})")
        for key, v in new["fidelity"]["ratios"].items():
            before = old["ratios"].get(key, {})
            meas = "refused" if v["measured"] is None else f"{v['measured']:.3f}"
            print(f"  {key:>24}: measured {meas}; simulated before {before.get('simulated', float('nan')):.3f}, "
                  f"now {v['simulated']:.3f}")
        print(f"  fidelity pass: before {old.get('pass')}, now {new['fidelity']['pass']}")
    if a.out:
        a.out.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
