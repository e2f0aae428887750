"""Named scenarios of ``profiler simulate --scenario``: a workload, a cluster, pools and arrivals.

``pythia-like`` — the setting of the Pythia paper's evaluation, rebuilt from what the simulator
has (the issue's "Pythia-like run"):

* **workload**: the generated ``coding-assistant`` workflows (7 agents: planner, explorer,
  chronicler, architect, engineer, reviewer, verifier; fan-out and review loops), profile fit on
  workflows generated with another seed;
* **models and pools**: Llama-3.1-8B (bf16) on one H100 SXM per replica, roofline step time
  (:mod:`simulator.hardware`); 8 replicas in three pools sized to the agents' share of the work
  (input + 20 × output tokens on 300 generated workflows: engineer 60 %, explorer 17 %, reviewer
  13 %, the rest 10 %) — ``code`` (engineer) 4 replicas, ``explore`` (explorer, chronicler) 2,
  ``review`` (planner, architect, reviewer, verifier) 2. A workflow moves between pools as its
  agents change, so a pool may idle while another queues: the case the idle-downstream term of
  the priority rule is for;
* **KV**: 150,000 tokens per replica (the issue's Pythia-like run; less than the ≈ 396k an
  H100 holds for the 8B model at mem fraction 0.9: a node shared with other work, or a longer
  context budget per request), host tier 2× (SGLang's ``--hicache-ratio``);
* **arrivals**: a burst — 600 workflows arriving uniformly within 60 s (one campaign of agent
  runs submitted together); every workflow is measured (the burst is the load; nothing settles).

``agent-platform`` — one cluster serving six agent applications at once (issue 21, item 4):

* **mix** (:data:`PLATFORM_MIX`, share of the replayed workflows): single-agent coding with long
  contexts — SWE-agent/GLM-4.5 (10 %, real tokens and times) and mini-SWE-agent/gemini-3 (10 %,
  real tokens, 1 s timestamps); a generated 7-agent ``coding-assistant`` (15 %); the short
  Agentless localize → repair pipeline (25 %, real tokens and times); Who&When group chats,
  Magentic-One and CaptainAgent (20 %, real order, synthetic times, estimated tokens); generated
  ``deep-research`` (20 %). Each application is split on its own
  (:func:`simulator.sources.mixed`); the profile is fit on the union of the train sides;
* **pools**: 8 × Llama-3.1-8B on one H100 each, ``coder`` 5 (the coding applications) and
  ``general`` 3 (group chats, deep research), sized to their share of the replayed work (input +
  20 × output tokens: 67 % / 33 %); pools are chosen by workflow type (:data:`PLATFORM_TYPE_POOL`);
* **KV**: 150,000 tokens per replica, host tier 2× (as ``pythia-like``);
* **arrivals**: 720 workflows within 60 s (a burst, all measured); ``agent-platform-bursty``:
  1,440 workflows, open loop, gamma inter-arrivals of CV 4 at ``low`` load (0.5 × the
  KV-saturated drain rate on average; the clumps overload the cluster for a while: at ``peak``
  the backlog grows for the whole run and the window's figure depends on its length).
``agent-platform-interactive``: the mix plus interactive coding sessions (:data:`INTERACTIVE_MIX`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from simulator.hardware import H100_SXM, LLAMA31_8B, kv_capacity_tokens

#: GPU KV tokens of Llama-3.1-8B on one H100 80 GB at mem fraction 0.9 (≈ 396k).
_H100_8B_KV = kv_capacity_tokens(H100_SXM, LLAMA31_8B)
#: The repository root: a mix names its logs relative to it (``datasets/real/…``, the bundled
#: copies of the real traces, ``datasets/real/README.md``).
ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "datasets" / "real"


@dataclass(frozen=True)
class Scenario:
    name: str
    workload: str
    gpu: str
    model: str
    tp: int
    kv_capacity_tokens: int
    host_ratio: float
    pool_replicas: dict[str, int] = field(default_factory=dict)
    agent_pool: dict[str, str] = field(default_factory=dict)
    burst_workflows: int = 600
    burst_s: float = 60.0
    #: A mix of applications (``(app, workload, share of the replayed workflows)``; workload a
    #: generated name or a log file relative to the repository root): ``workload`` is then
    #: only a label.
    mix: tuple[tuple[str, str, float], ...] = ()
    #: Workflow type → pool (an application's model), for agents no ``agent_pool`` names.
    type_pool: dict[str, str] = field(default_factory=dict)
    #: ``burst`` (``burst_workflows`` within ``burst_s``), or an open-loop mode of
    #: ``simulator.runner.arrival_times`` (``gamma``, ``poisson``) at ``load`` with ``cv``.
    arrivals: str = "burst"
    load: str = "peak"
    cv: float = 1.0
    #: Generated applications of a mix: workflows generated (another seed) for the fit.
    n_train_generated: int = 60

    @property
    def replicas(self) -> int:
        return int(sum(self.pool_replicas.values()))

    def overrides(self) -> dict[str, str]:
        """The ``profiler simulate`` options (parameter names) this scenario sets itself, each
        with what it uses instead: ``simulate`` announces every one the user gave."""
        pools = ", ".join(f"{p} {n}" for p, n in self.pool_replicas.items())
        cluster = (f"its cluster: {self.replicas} x {self.model} on {self.gpu} tp{self.tp}, "
                   f"pools {pools}, {self.kv_capacity_tokens:,} KV tokens per replica, roofline "
                   "step model")
        out = {name: cluster for name in (
            "replicas", "gpu", "model", "tp", "step_model", "kv_capacity_tokens", "host_ratio",
            "pcie_s_per_token", "chunked_prefill_size", "max_running_requests", "calibrate")}
        out["workflows"] = f"{self.burst_workflows} workflows"
        out["train_share"] = "its own train split"
        out["arrivals"] = f"{self.arrivals} arrivals"
        if self.mix:
            out["train_workflows"] = (f"{self.n_train_generated} generated train workflows per "
                                      "generated application")
        if self.arrivals == "burst":
            burst = f"a burst of {self.burst_workflows} workflows in {self.burst_s:g} s, all measured"
            out.update(load=burst, arrival_cv=burst, warmup=burst, tail=burst)
        else:
            out.update(load=f"load {self.load}", arrival_cv=f"CV {self.cv:g}")
        return out

    def to_dict(self) -> dict:
        return {"name": self.name, "workload": self.workload, "gpu": self.gpu, "model": self.model,
                "tp": self.tp, "kv_capacity_tokens": self.kv_capacity_tokens,
                "host_ratio": self.host_ratio, "pool_replicas": dict(self.pool_replicas),
                "agent_pool": dict(self.agent_pool), "burst_workflows": self.burst_workflows,
                "burst_s": self.burst_s, "mix": [list(m) for m in self.mix],
                "type_pool": dict(self.type_pool), "arrivals": self.arrivals,
                "load": self.load if self.arrivals != "burst" else None,
                "cv": self.cv if self.arrivals == "gamma" else None}


PYTHIA_LIKE = Scenario(
    name="pythia-like", workload="coding-assistant", gpu="h100-sxm", model="llama-3.1-8b", tp=1,
    kv_capacity_tokens=150_000, host_ratio=2.0,
    pool_replicas={"code": 4, "explore": 2, "review": 2},
    agent_pool={"engineer": "code", "explorer": "explore", "chronicler": "explore",
                "planner": "review", "architect": "review", "reviewer": "review",
                "verifier": "review"},
    burst_workflows=600, burst_s=60.0,
)

#: Applications of ``agent-platform``: (name, workload, share of the workflows). See the module
#: docstring for what each stands for and where its tokens and times come from.
PLATFORM_MIX: tuple[tuple[str, str, float], ...] = (
    ("swe-agent", "datasets/swe_agent/swe_agent_glm45_bs4.jsonl", 0.10),
    ("mini-swe-agent", "datasets/real/mini_swe_agent_gemini3.jsonl", 0.10),
    ("coding-assistant", "coding-assistant", 0.15),
    ("agentless", "datasets/real/agentless_pr28.jsonl", 0.25),
    ("group-chat", "datasets/real/seq_whowhen_magentic_captain.jsonl", 0.20),
    ("deep-research", "deep-research", 0.20),
)
PLATFORM_POOLS = {"coder": 5, "general": 3}
PLATFORM_TYPE_POOL = {"swe_agent": "coder", "mini_swe_agent": "coder",
                      "coding_assistant": "coder", "agentless_localize": "coder",
                      "agentless_repair": "coder", "captain_agent": "general",
                      "magentic_one": "general", "deep_research": "general"}

AGENT_PLATFORM = Scenario(
    name="agent-platform", workload="agent-platform mix", gpu="h100-sxm", model="llama-3.1-8b",
    tp=1, kv_capacity_tokens=150_000, host_ratio=2.0, pool_replicas=dict(PLATFORM_POOLS),
    type_pool=dict(PLATFORM_TYPE_POOL), burst_workflows=720, burst_s=60.0, mix=PLATFORM_MIX,
)
AGENT_PLATFORM_BURSTY = Scenario(
    name="agent-platform-bursty", workload="agent-platform mix", gpu="h100-sxm",
    model="llama-3.1-8b", tp=1, kv_capacity_tokens=150_000, host_ratio=2.0,
    pool_replicas=dict(PLATFORM_POOLS), type_pool=dict(PLATFORM_TYPE_POOL), burst_workflows=1440,
    mix=PLATFORM_MIX, arrivals="gamma", load="low", cv=4.0,
)

#: ``agent-platform-interactive``: the agent-platform mix (80 % of the workflows, in its own
#: shares) plus interactive coding sessions with a person at the keyboard (20 %): generated
#: ``claude-code-interactive`` and ``codex-interactive`` sessions (``store/workload_specs``:
#: human waits of seconds to minutes around the importers' fixtures' medians, 57.4 s and 12.3 s;
#: every turn's last call ``wait_after: human``), on the coder pool.
INTERACTIVE_MIX: tuple[tuple[str, str, float], ...] = (
    *((app, w, share * 0.8) for app, w, share in PLATFORM_MIX),
    ("claude-code", "claude-code-interactive", 0.10),
    ("codex", "codex-interactive", 0.10),
)
AGENT_PLATFORM_INTERACTIVE = Scenario(
    name="agent-platform-interactive", workload="agent-platform mix + interactive coding",
    gpu="h100-sxm", model="llama-3.1-8b", tp=1, kv_capacity_tokens=150_000, host_ratio=2.0,
    pool_replicas=dict(PLATFORM_POOLS),
    type_pool={**PLATFORM_TYPE_POOL, "claude_code": "coder", "codex": "coder"},
    burst_workflows=720, burst_s=60.0, mix=INTERACTIVE_MIX,
)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (PYTHIA_LIKE, AGENT_PLATFORM,
                                                        AGENT_PLATFORM_BURSTY,
                                                        AGENT_PLATFORM_INTERACTIVE)}


def get_scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"--scenario {name!r}: use one of {', '.join(SCENARIOS)}")
    return SCENARIOS[name]
