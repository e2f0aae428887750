"""Simulator fidelity for ``bench/bench_engine.py``: the simulator, calibrated to the real replicas,
replays the same trace under every set-up of the bench.

* **Step time** — measured, not assumed: a calibration replay (``profiler replay``'s call
  records, sent straight to one plain replica, first one workflow at a time, then two) is fitted
  with :func:`simulator.calibration.fit_step_time` after :func:`~simulator.calibration.mark_concurrency`
  (calls served alone fit the prefill, every call the decode), with a prefill intercept (the
  fixed cost of a call on a small engine).
* **Cluster** — what the servers report at start-up (``max_total_num_tokens``,
  ``chunked_prefill_size``, ``max_running_requests`` from their log), the bench's replicas; a
  host tier of 2 × the pool for the arms whose replicas run HiCache (:data:`HICACHE_ARMS`:
  hints and its ablations, ``--hicache-ratio 2``), none for the plain ones; the replicas share
  the host's cores, each slowing the other's step by :data:`COMPUTE_SHARE` (a plain pair 0.5,
  measured on the engine's per-call decode time; a HiCache pair 1.0, full sharing).
* **Trace** — the replayed records with the replay's scaling: token counts as
  ``serving_hooks.replay_plan.load_plan`` scales them, every timestamp × ``time_scale`` (so the
  gaps and root offsets shrink as in the replay); a closed population of ``concurrency``
  workflows, released in the same order; the prompts are the replay's own, counted as the engine
  counts them: :func:`replay_prefixes` replays the rule of ``serving_hooks.replay_prompts`` with the
  engine's chat template (:class:`ChatTemplate`, measured by :func:`fit_chat_template`), so a
  prompt has the engine's length and shares what the replay shared (a whole context, its prompt
  alone, or a shorter start).
* **Set-ups** — round robin → ``sglang-rr`` (FCFS, round robin, LRU); sglang-router →
  :class:`RouterCacheAware032` (FCFS, LRU, the simulator's ``sglang-default`` router with the
  two rules sglang-router 0.3.2 changed: a prompt below the cache threshold goes to the
  *least-loaded* worker, not the one with the smallest tree, and the tree is trimmed every
  60 s, not 120 s); the gateway
  with the plugin → ``ours`` with priority preemption at the hints replicas' threshold (the
  bench's ``--preemption-threshold``), no pre-prefill (the SGLang plugin has none) and the
  plugin's prefetch into that host tier; the ablations: ``routing-only`` → ``ours`` with only
  its capacity router on (FCFS, LRU),
  ``no-priority`` → ``ours-no-priority``, ``no-retention`` → ``ours-no-keepdrop``,
  ``no-prefetch`` → ``ours-no-prefetch`` (the host tier without staging), ``no-host-tier`` → the same
  without a host tier (HiCache off), ``no-routing`` →
  ``ours-no-capacity`` (round-robin routing). The profile is the bench's own (per seed where the
  condition fits one per seed).

Every workflow counts (no warm-up window), as in the measured replay.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

import numpy as np

from predictors.predictor import Predictor
from simulator.baselines import BASELINES
from simulator.baselines.caches import LRU
from simulator.baselines.routers import CacheAware
from simulator.baselines.schedulers import FCFS
from simulator.calibration import SWE_AGENT_GLM45, StepTimeModel, fit_step_time, mark_concurrency
from simulator.config import ClusterConfig
from simulator.engine import SimResult, Simulator
from simulator.metrics import summarize
from simulator.ours import OursOptions, build_ours
from simulator.policy import Policy
from simulator.workload import Workload, workload_from_records
from serving_hooks.replay import arrival_offsets

#: bench set-up -> simulator policy
SIM_POLICIES = {"round-robin": "sglang-rr", "router": "sglang-router-0.3.2", "hints": "ours",
                "routing-only": "ours-routing-only", "no-priority": "ours-no-priority",
                "no-retention": "ours-no-keepdrop", "no-prefetch": "ours-no-prefetch",
                "no-host-tier": "ours-no-prefetch", "no-routing": "ours-no-capacity"}
#: what the engine arms have that the simulator's ``ours`` switches separately: the SGLang plugin
#: has no pre-prefill (only the simulator does), and "routing-only" is the gateway's capacity
#: routing in front of plain SGLang (FCFS, LRU, no keep/drop, no prefetch)
ENGINE_OPTIONS = {"preprefill": False}
#: arms whose replicas run HiCache with a host tier 2 x the device pool (bench_engine's PAIRS with
#: ``--enable-hierarchical-cache --hicache-ratio 2``): simulated with that host tier and prefetch
HICACHE_ARMS = frozenset({"hints", "no-priority", "no-retention", "no-prefetch", "no-routing"})
HICACHE_RATIO = 2.0
#: How much a replica's step slows the other's on the two shared cores
#: (``ClusterConfig.compute_share``: an iteration takes ``1 + share`` times its calibrated step
#: while the other replica is mid-iteration). Plain replicas: 0.5 — their step is not all on both
#: cores (the scheduler's Python runs on one); chosen on the engine's per-call decode time per
#: token of session 11's open-loop pair, seeds 0-4 (4.09 vs 4.17 ms; full sharing gave 5.51), and
#: held on seeds 5-9 (4.28 vs 4.16 ms). HiCache replicas: full sharing (1.0), as before — their
#: records do not pin a share (0.9 fits seeds 0-4, under 0.7 seeds 5-9), and any share below 1.0
#: makes the hints arm faster than the engine on three of the four stored pairs, whose wait before
#: the first token the simulator still lacks. docs/sglang.md, session 12.
COMPUTE_SHARE = {"plain": 0.5, "hicache": 1.0}
ROUTING_ONLY = {"priority": False, "keep_drop": False, "prefetch": False}


class RouterCacheAware032(CacheAware):
    """``sglang-router`` 0.3.2's ``cache_aware`` (``select_worker_with_text``, HTTP path): as the
    simulator's :class:`~simulator.baselines.routers.CacheAware` (imbalance → least loaded;
    match share > ``cache_threshold`` → the worker holding the match), but a miss goes to the
    worker with the fewest requests in flight (first such worker on ties) instead of the one
    with the smallest tree, and the tree is trimmed every 60 s (``eviction_interval_secs``)."""

    def __init__(self) -> None:
        super().__init__(eviction_interval_s=60.0)

    def _on_miss(self, reps: list, loads: list[int]) -> int:
        """0.3.2 sends a miss to the worker with the fewest requests in flight (first on ties)."""
        return reps[loads.index(min(loads))].idx


def _policy(name: str, profile_dir: Path, opts: OursOptions) -> Policy:
    if name == "sglang-router-0.3.2":
        return Policy(name, RouterCacheAware032(), FCFS(), LRU(), "sglang-router 0.3.2 cache_aware, FCFS, LRU")
    if name == "ours-routing-only":
        return build_ours(Predictor(profile_dir), "ours", replace(opts, **ROUTING_ONLY))
    if name.startswith("ours"):
        return build_ours(Predictor(profile_dir), name, opts)
    return BASELINES[name]()


#: The step time the bench assumes before it has calibrated (``--estimate`` and the wall-time
#: estimate printed before a run): on CPU the tiny model's calibration on this 2-core machine
#: (docs/sglang.md, smoke run 2: decode 2.74 ms + 1.1e-7 s per KV token, prefill 16.3 ms +
#: 0.029 ms per prompt token); on GPU the SWE-agent/GLM-4.5 fit the simulator ships (an
#: H100-class serving engine; replaced by the calibration as soon as a run calibrates).
REFERENCE_STEP = {
    "cpu": StepTimeModel(t0=2.74e-3, a=2.9e-5, a_ctx=0.0, c=1.1e-7, prefill_t0=16.3e-3,
                         source="reference CPU step time (tiny model, docs/sglang.md)"),
    "gpu": SWE_AGENT_GLM45,
}
#: what the servers would report at start-up, before one has (the pool and running cap come from
#: the bench's own settings): the chunked-prefill size SGLang 0.5.23 logged on CPU
REFERENCE_LIMITS = {"chunked_prefill_size": 4096}
_LIMITS = re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), .*?max_running_requests=(\d+)")


def server_limits(log_text: str) -> dict[str, int]:
    """KV pool, chunked-prefill size and running cap the SGLang server logged at start-up."""
    m = _LIMITS.search(log_text)
    if m is None:
        raise ValueError("the SGLang log has no 'max_total_num_tokens=…, chunked_prefill_size=…' line")
    pool, chunk, running = map(int, m.groups())
    return {"kv_capacity_tokens": pool, "chunked_prefill_size": chunk if chunk > 0 else 1 << 30,
            "max_running_requests": running}


def calibrate(call_records: list[dict], source: str) -> StepTimeModel:
    """Step-time model of one replica from its replayed calls (ok calls with a first token)."""
    ok = [r for r in call_records if r.get("status") == "ok" and r.get("t_first_token") is not None]
    return fit_step_time(mark_concurrency(ok), source=source, prefill_intercept=True)


def scaled_records(records: list[dict], token_scale: float, time_scale: float) -> list[dict]:
    """The records as the replay sends them: tokens scaled like ``load_plan``, times × time_scale."""
    out = []
    for r in records:
        s = dict(r)
        s["input_tokens"] = max(0, round(r["input_tokens"] * token_scale))
        s["output_tokens"] = max(1, round(r["output_tokens"] * token_scale))
        for k in ("t_arrival", "t_first_token", "t_finish"):
            if s.get(k) is not None:
                s[k] = float(s[k]) * time_scale
        out.append(s)
    return out


@dataclass(frozen=True)
class ChatTemplate:
    """What the engine's chat template adds to a replayed prompt, in the engine's tokens.

    ``profiler replay`` sizes a prompt from the engine's own count of the context it continues
    plus :data:`~serving_hooks.replay_prompts.MESSAGE_OVERHEAD` per message, while the engine
    renders every message through its chat template (ChatML on the bench's model:
    ``<|im_start|>role\\n … <|im_end|>\\n``, then ``<|im_start|>assistant\\n``). So the engine
    counts more prompt tokens than were recorded, and a context the recorded tokens would fit often
    does not fit the replay's room: it shares only that context's prompt, or a shorter start of it
    (sized by the replay's word estimate). :func:`replay_prefixes` replays that sizing with these
    numbers; :func:`fit_chat_template` measures them from a replay's call records."""

    #: tokens the template adds per message (role markers; the first word of a message, with no
    #: space before it, counts here too)
    msg_tokens: int = 6
    #: tokens of the generation prompt that ends every prompt (``<|im_start|>assistant\\n``)
    gen_tokens: int = 3
    #: words per reply token, as the replay's estimate of a shorter start counts a reply's text (a
    #: reply of random tokens holds fewer spaces than tokens)
    reply_words: float = 0.5
    source: str = ""


#: the template of the bench's model folders (ChatML, the tokenizer of ``tests/sglang/real_server``):
#: measured with :func:`fit_chat_template` on the session-10 runs' call records (docs/sglang.md,
#: "session 11"); ``bench_engine.py`` can measure its own from the calibration replay
CHATML = ChatTemplate(source="ChatML of the bench's model (fitted on the session-10 call records)")
#: the replay's own per-message estimate (serving_hooks.replay_prompts.MESSAGE_OVERHEAD)
REPLAY_OVERHEAD = 4


def replay_prefixes(wl: Workload, template: ChatTemplate = CHATML) -> Workload:
    """Re-draw ``wl``'s prompts the way ``profiler replay`` builds them and the engine counts them.

    Each call's prompt is a list of messages, each message one segment: the replay continues the
    largest context that fits its room (recorded prompt − 4) among its parents and its agent's
    previous call, trying for each of them, longest first, the whole context (prompt + reply,
    sized as the engine's prompt count + the reply + 4), its prompt alone (the engine's count),
    then ever shorter starts of its messages (sized by the replay's estimate: words + 4 per
    message), and adds one user message with the rest of the room in words; else it starts a
    fresh conversation. The engine then counts every message with the template's tokens
    (``template``), so a call's prompt (``input_tokens``) becomes the engine's count, and its path
    is the messages it shares plus its own new message; its own segment is the generation prompt
    and the reply (what the engine's radix tree holds of it after it finished). The end markers
    of a continued reply are not in the tree (the reply's tokens are): they count with the next
    message."""
    tok = wl.seg_tokens
    kind, consumers = wl.seg_kind, wl.seg_consumers
    end_tokens = template.msg_tokens - template.gen_tokens
    words: dict[int, float] = {}                 # segment -> words the replay's estimate counts
    replies: set[int] = set()                    # segments that are a reply (assistant message)
    msgs: dict[int, tuple[int, ...]] = {}        # call -> its prompt's messages (segments)
    last_of_agent: dict[tuple[int, str], int] = {}

    def new_seg(tokens: int, n_words: float) -> int:
        tok.append(tokens)
        kind.append(3)
        consumers.append([])
        words[len(tok) - 1] = n_words
        return len(tok) - 1

    for c in wl.calls:                           # workflow order: parents come first
        room = c.input_tokens - REPLAY_OVERHEAD
        prev = last_of_agent.get((c.wf, c.agent))
        best: tuple[int, tuple[int, ...]] | None = None
        for k in dict.fromkeys([*c.parents, *([prev] if prev is not None else [])]):
            base = wl.calls[k]
            prompt = base.input_tokens           # already the engine's count (set below)
            starts = [(msgs[k] + (base.own_seg,), prompt + base.output_tokens + REPLAY_OVERHEAD),
                      (msgs[k], prompt)]
            starts += [(msgs[k][:j], sum(round(words[s]) + REPLAY_OVERHEAD for s in msgs[k][:j]))
                       for j in range(len(msgs[k]) - 1, 0, -1)]
            for path, size in starts:
                if size <= room:
                    if best is None or size > best[0]:
                        best = (size, path)
                    break
        shared, size = (best[1], best[0]) if best is not None else ((), 0)
        n_words = max(1, room - size)
        after_reply = bool(shared) and shared[-1] in replies
        user = new_seg(n_words + template.msg_tokens + (end_tokens if after_reply else 0), n_words)
        msgs[c.idx] = shared + (user,)
        c.path = msgs[c.idx]
        c.own_prompt_tokens = template.gen_tokens
        c.input_tokens = sum(tok[s] for s in c.path) + template.gen_tokens
        c.own_seg = new_seg(template.gen_tokens + c.output_tokens, template.reply_words * c.output_tokens)
        replies.add(c.own_seg)
        last_of_agent[(c.wf, c.agent)] = c.idx
    n = len(tok)
    wl.seg_consumers = [[] for _ in range(n)]
    wl.seg_parent, wl.seg_wf = [-1] * n, [-1] * n
    for c in wl.calls:
        before = -1
        for s in c.path:
            wl.seg_consumers[s].append(c.idx)
            wl.seg_parent[s], wl.seg_wf[s] = before, c.wf
            before = s
        wl.seg_parent[c.own_seg], wl.seg_wf[c.own_seg] = before, c.wf
    return wl


def fit_chat_template(plan: list[dict], replayed: list[dict], gen_tokens: int = CHATML.gen_tokens,
                      msg_tokens: Iterable[int] = range(2, 13),
                      reply_words: Iterable[float] = (0.25, 0.5, 0.75, 1.0, 1.5)) -> ChatTemplate:
    """The :class:`ChatTemplate` that best reproduces the engine's prompt counts of a replay.

    ``plan``: the records the replay sent (tokens as it sent them: ``scaled_records``);
    ``replayed``: its call records (``input_tokens`` = the engine's ``usage.prompt_tokens``;
    request ids with the replay's run tag after a last ``-`` are matched too). Every combination
    of ``msg_tokens`` × ``reply_words`` is replayed by :func:`replay_prefixes` and the one with the
    smallest mean absolute error per call wins (``gen_tokens`` only moves where a prompt ends and
    the reply starts, not a prompt's count: it is given, the template's generation prompt)."""
    counted: dict[str, int] = {}
    for r in replayed:
        if r.get("status", "ok") == "ok" and r.get("input_tokens") is not None:
            counted[str(r["request_id"])] = int(r["input_tokens"])
    ids = [str(r["request_id"]) for r in plan]
    tagged = {rid.rsplit("-", 1)[0]: n for rid, n in counted.items() if "-" in rid}
    pairs = [(i, counted.get(rid, tagged.get(rid))) for i, rid in enumerate(ids)]
    pairs = [(i, n) for i, n in pairs if n is not None]
    if len(pairs) < 10:
        raise ValueError(f"the replay's records match {len(pairs)} of the plan's {len(plan)} calls; "
                         f"the template fit needs at least 10 with the engine's prompt count")
    best: tuple[float, ChatTemplate] | None = None
    for m in msg_tokens:
        for w in reply_words:
            tpl = ChatTemplate(int(m), int(gen_tokens), float(w))
            wl = replay_prefixes(workload_from_records(plan, name="template-fit", conversation_lineage=False), tpl)
            by_id = {c.request_id: c.input_tokens for c in wl.calls}
            err = float(np.mean([abs(by_id[ids[i]] - n) for i, n in pairs]))
            if best is None or err < best[0] - 1e-9:
                best = (err, tpl)
    err, tpl = best
    return replace(tpl, source=f"fitted on {len(pairs)} replayed calls (mean error {err:.1f} tokens per prompt)")


def simulate_setups(records: list[dict], profile_dir: Path, cfg: ClusterConfig, concurrency: int,
                    setups: list[str], preemption_threshold: int = 10, rate: float | None = None,
                    seed: int = 0, template: ChatTemplate = CHATML) -> dict[str, dict]:
    """Simulated avg/P95 JCT and GPU-tier hit share of each bench set-up on ``records``
    (``preemption_threshold``: the hints replicas' ``--priority-scheduling-preemption-threshold``;
    ``rate``: open loop, the workflows released at the replay's own Poisson times for ``seed``,
    :func:`serving_hooks.replay.arrival_offsets`, instead of a closed population; ``template``:
    the engine's chat template, :func:`replay_prefixes`)."""
    return {name: arm_summary(name, res) for name, res in simulate_runs(
        records, profile_dir, cfg, concurrency, setups, preemption_threshold, rate, seed, template).items()}


def arm_summary(name: str, res: SimResult) -> dict:
    """One set-up's simulated run as the bench reports an arm: avg/P95 JCT, GPU-tier hit share,
    preemptions and makespan."""
    row = summarize(res)
    return {"policy": SIM_POLICIES[name], "jct_avg_s": row["avg_jct_s"], "jct_p95_s": row["p95_jct_s"],
            "cached_fraction": row["gpu_hit_ratio"], "preemptions": row["preemptions"],
            "makespan_s": len(res.wf_arrival) / row["workflows_per_min"] * 60.0 if row["workflows_per_min"] else 0.0}


def simulate_runs(records: list[dict], profile_dir: Path, cfg: ClusterConfig, concurrency: int,
                  setups: list[str], preemption_threshold: int = 10, rate: float | None = None,
                  seed: int = 0, template: ChatTemplate = CHATML) -> dict[str, SimResult]:
    """The simulator's whole run of each bench set-up on ``records`` (every call's times, replica
    and cache hits), as :func:`simulate_setups` summarises it; ``bench/engine_calls.py`` sets it
    call by call beside the engine's records."""
    wl = replay_prefixes(workload_from_records(records, name="bench-engine", conversation_lineage=False), template)
    n = len(wl.workflows)
    arrivals = arrival_offsets(n, rate, 1.0, seed) if rate else np.zeros(n)
    concurrency = None if rate else concurrency
    out = {}
    for name in setups:
        hicache = name in HICACHE_ARMS
        opts = OursOptions(prefetch=hicache, preemption_threshold=preemption_threshold, **ENGINE_OPTIONS)
        policy = _policy(SIM_POLICIES[name], profile_dir, opts)
        arm_cfg = replace(cfg, host_ratio=HICACHE_RATIO if hicache else 0.0,
                          compute_share=COMPUTE_SHARE["hicache" if hicache else "plain"])
        out[name] = Simulator(wl, policy, arm_cfg, arrivals, None, concurrency).run()
    return out


def cluster(limits: dict[str, int], step: StepTimeModel, replicas: int = 2,
            shared_compute: bool = True) -> ClusterConfig:
    """The bench's replicas as the simulator sees them: the replay sends ``max_tokens`` = the
    recorded output with ``ignore_eos``, so admission reserves each call's whole output; and the
    replicas share one device (``shared_compute``: every CPU replica shares the host's cores, and
    GPU replicas share a GPU when there are fewer GPUs than replicas), while the step time was
    calibrated on one replica alone."""
    return ClusterConfig(replicas=replicas, host_ratio=0.0, step=step, fixed_length_requests=True,
                         shared_compute=shared_compute and replicas > 1, **limits)
