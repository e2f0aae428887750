"""Multi-model workflows at the gateway: routing by the model a call names, and the priority's
idle-downstream term fed from each pool's queue depth (issue 16, item 4; Pythia alg. 3).

Real ports: two fake OpenAI servers, one per model pool, each reporting its waiting requests on
``/v1/loads``; the gateway polls them (``--routing capacity``) and the real ``openai`` client
calls through it."""
from __future__ import annotations

import itertools

import openai
import pytest

from predictors.contract import Annotation
from serving_hooks.fake_openai import FakeOpenAI
from policies.pools import ModelPools, NoReplicaForModel, pool_queue_depths
from policies.priority import PriorityPolicy
from serving_hooks.server_thread import serve_in_thread
from serving_hooks.dialects import parse_upstream
from serving_hooks.upstreams import CapacityRouting, RoundRobinRouter
from tests.serving_helpers import fit_generated_profile, metric, running_gateway, wait_for

WT = "coding_assistant"
_ids = itertools.count()


# ----------------------------------------------------------------------------- pure parts
def test_candidates_follow_the_model_and_unpooled_replicas_serve_the_rest():
    pools = ModelPools({"a": "big", "b": "big", "c": "small", "d": None})
    assert pools.pooled
    assert pools.candidates("big") == ["a", "b"]
    assert pools.candidates("small") == ["c"]
    assert pools.candidates("other") == ["d"] and pools.candidates(None) == ["d"]
    only_pooled = ModelPools({"a": "big"})
    with pytest.raises(NoReplicaForModel, match="'other'"):
        only_pooled.candidates("other")
    assert not ModelPools({"a": None}).pooled


def test_pool_depth_is_the_sum_of_its_replicas_and_unknown_until_all_report():
    members = {"big": ["a", "b"], "small": ["c"]}
    assert pool_queue_depths({"a": 1, "b": 3, "c": 0}, members) == {"big": 4, "small": 0}
    assert pool_queue_depths({"a": 1, "c": 2}, members) == {"small": 2}   # b never reported


def test_agent_pools_are_learned_per_workflow_type_and_bounded():
    pools = ModelPools({"a": "big", "c": "small"}, max_agents=2)
    pools.note_agent("t1", "planner", "big")
    pools.note_agent("t1", "verifier", "small")
    pools.note_agent("t2", "planner", "small")          # a third entry evicts the oldest
    assert dict(pools.agent_pools("t1")) == {"verifier": "small"}
    assert dict(pools.agent_pools("t2")) == {"planner": "small"}
    pools.note_agent("t1", "verifier", None)
    assert dict(pools.agent_pools("t1")) == {}


def test_idle_downstream_term_by_hand():
    """w1/(1 + R) + w2/E[D_m] for each idle pool m: 1/(1+3) + 1/2 = 0.75 -> 750 (scale 1000)."""
    ann = Annotation.from_dict({"known": True, "expected_remaining_calls": 3.0,
                                "expected_distance": {"verifier": 2.0, "coder": 1.0},
                                "session_age_s": 0.0})
    pol = PriorityPolicy(aging_per_s=0.0, remaining_unit="calls")

    def prio(ann, **pools):       # the gateway's priority, as SGLang's integer
        return pol.to_sglang(pol.call_priority(ann, **pools))

    assert prio(ann) == 250                                            # no queues known
    assert prio(ann, queue_depth={"small": 0}, agent_model={"verifier": "small"}) == 750
    assert prio(ann, queue_depth={"small": 5}, agent_model={"verifier": "small"}) == 250  # busy
    # both pools idle: + 1/2 (verifier's pool) + 1/1 (coder's pool)
    both = prio(ann, queue_depth={"small": 1, "code": 0},
                agent_model={"verifier": "small", "coder": "code"})
    assert both == 1750


def test_upstream_pool_option_parses_and_names_bad_options():
    spec = parse_upstream("http://127.0.0.1:1,dialect=vllm,pool=qwen-coder")
    assert (spec.dialect, spec.pool) == ("vllm", "qwen-coder")
    with pytest.raises(ValueError, match="pool= needs"):
        parse_upstream("http://127.0.0.1:1,pool=")


def test_round_robin_turns_within_each_pool():
    pools = ModelPools({"http://a:1": "big", "http://b:1": "big", "http://c:1": "small"})
    rr = RoundRobinRouter(["http://a:1", "http://b:1", "http://c:1"], pools=pools)
    got = [rr.choose_upstream(str(i), {"model": m}, None, None)
           for i, m in enumerate(["big", "small", "big", "big", "small"])]
    assert got == ["http://a:1", "http://c:1", "http://b:1", "http://a:1", "http://c:1"]


# ------------------------------------------------------------------------ on real ports
@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("pools"), 60, seed=7, min_calls=20)


@pytest.fixture()
def two_pools():
    big, small = FakeOpenAI(model="big"), FakeOpenAI(model="small")
    with serve_in_thread(big.app) as s_big, serve_in_thread(small.app) as s_small:
        big.url, small.url = s_big.url, s_small.url
        yield big, small


def _call(client: openai.OpenAI, model: str, agent: str) -> None:
    meta = {"workflow_type_id": WT, "workflow_id": f"p-{next(_ids)}", "agent_id": agent}
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "go"}],
                                   extra_body={"app_metadata": meta})


def test_gateway_routes_by_model_and_raises_priority_when_a_downstream_pool_idles(
        two_pools, profile_root):
    big, small = two_pools
    pools = ModelPools({big.url: "big", small.url: "small"})
    router = CapacityRouting([big.url, small.url], pools=pools, poll_interval_s=0.05)
    with running_gateway([big.url, small.url], profile_root, router=router, pools=pools,
                         dialect="sglang") as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        # the verifier calls the small model: routed there, and the gateway learns its pool
        _call(client, "small", "verifier")
        assert len(small.received) == 1 and not big.received
        assert dict(pools.agent_pools(WT)) == {"verifier": "small"}
        with pytest.raises(openai.NotFoundError, match="served by no upstream") as err:
            _call(client, "no-such-model", "planner")
        assert err.value.body["type"] == "model_not_found"

        def planner_priority(small_waiting: int) -> tuple[int, dict]:
            small.waiting_requests = small_waiting
            assert wait_for(lambda: router.queue_depths().get(small.url) == small_waiting)
            _call(client, "big", "planner")              # a new workflow's first call
            body = big.received[-1].body
            return body["priority"], body["sys_annotations"]

        busy, ann_busy = planner_priority(5)
        idle, ann_idle = planner_priority(0)
        assert "verifier" in ann_idle["expected_distance"]
        pol = PriorityPolicy()
        expected = pol.to_sglang(pol.call_priority(Annotation.from_dict(ann_idle),
                                                   queue_depth={"big": 0, "small": 0},
                                                   agent_model=dict(pools.agent_pools(WT))))
        assert idle == expected and idle > busy
        # the whole difference is the small pool's term: w2 / E[D_verifier], times the scale
        gap = 1000 / max(1.0, ann_idle["expected_distance"]["verifier"])
        assert idle - busy == pytest.approx(gap, abs=1)
        assert ann_busy["expected_distance"] == ann_idle["expected_distance"]
        assert metric(gw.url, "profiler_gateway_idle_downstream_boosts_total") >= 1
