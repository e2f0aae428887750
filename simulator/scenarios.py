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
"""
from __future__ import annotations

from dataclasses import dataclass, field


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

    @property
    def replicas(self) -> int:
        return int(sum(self.pool_replicas.values()))

    def to_dict(self) -> dict:
        return {"name": self.name, "workload": self.workload, "gpu": self.gpu, "model": self.model,
                "tp": self.tp, "kv_capacity_tokens": self.kv_capacity_tokens,
                "host_ratio": self.host_ratio, "pool_replicas": dict(self.pool_replicas),
                "agent_pool": dict(self.agent_pool), "burst_workflows": self.burst_workflows,
                "burst_s": self.burst_s}


PYTHIA_LIKE = Scenario(
    name="pythia-like", workload="coding-assistant", gpu="h100-sxm", model="llama-3.1-8b", tp=1,
    kv_capacity_tokens=150_000, host_ratio=2.0,
    pool_replicas={"code": 4, "explore": 2, "review": 2},
    agent_pool={"engineer": "code", "explorer": "explore", "chronicler": "explore",
                "planner": "review", "architect": "review", "reviewer": "review",
                "verifier": "review"},
    burst_workflows=600, burst_s=60.0,
)

SCENARIOS: dict[str, Scenario] = {PYTHIA_LIKE.name: PYTHIA_LIKE}


def get_scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"--scenario {name!r}: use one of {', '.join(SCENARIOS)}")
    return SCENARIOS[name]
