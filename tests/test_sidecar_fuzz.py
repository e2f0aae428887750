"""Fuzzing the sidecar on a real port: no input may produce a 5xx.

Two parts, both with a fixed seed (``derandomize``) and a small budget so they run in CI:

* **schemathesis** generates requests from the sidecar's own OpenAPI document — conforming ones
  (positive) and ones that break the schema (negative: wrong types, missing fields, out-of-range
  values) — for every operation, and sends them over HTTP;
* **raw JSON** that schemathesis cannot produce because it only writes valid JSON: ``NaN``,
  ``Infinity``, ``1e400``, lone UTF-16 surrogates (escaped and raw), deep nesting, in the places
  the schema has numbers and strings. Each must get a clean 4xx.
"""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.errors import Unsatisfiable

from tests.serving_helpers import fit_generated_profile

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402

EXAMPLES = 40     # per operation and generation mode: ~25 s on a 2-core machine
SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    from prometheus_client import CollectorRegistry

    from serving_hooks.server_thread import serve_in_thread
    from serving_hooks.service import prediction_service
    from serving_hooks.sidecar import create_sidecar_app

    root = fit_generated_profile(tmp_path_factory.mktemp("fuzz"), 30, seed=3, min_calls=10)
    registry = CollectorRegistry()
    service = prediction_service(root, registry, "profiler_sidecar", reload_every_s=0)
    app = create_sidecar_app(service, registry=registry)
    with serve_in_thread(app) as server:
        yield server.url, app


def _operations(app):
    schema = schemathesis.openapi.from_dict(app.openapi())
    ops = [result.ok() for result in schema.get_all_operations()]
    assert len(ops) >= 8
    return ops


@pytest.mark.slow
def test_schemathesis_finds_no_server_error(sidecar):
    url, app = sidecar
    seen: dict[str, int] = {}
    server_errors: list[str] = []
    unsendable = [0]
    with httpx.Client(base_url=url, timeout=30) as client:
        for op in _operations(app):
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                @SETTINGS
                @given(case=op.as_strategy(generation_mode=mode))
                def run(case) -> None:
                    kwargs = case.as_transport_kwargs(base_url=url)
                    try:
                        r = client.request(kwargs["method"], kwargs["url"], params=kwargs.get("params"),
                                           headers=kwargs.get("headers"), json=kwargs.get("json"),
                                           content=kwargs.get("data") if isinstance(kwargs.get("data"), (bytes, str)) else None)
                    except (httpx.LocalProtocolError, httpx.InvalidURL, UnicodeEncodeError):
                        unsendable[0] += 1   # e.g. a header value HTTP cannot carry: never sent
                        return
                    seen[op.label] = seen.get(op.label, 0) + 1
                    if r.status_code >= 500:
                        server_errors.append(f"{op.label} {r.status_code}: {kwargs.get('json')!r:.200}")

                try:
                    run()
                except Unsatisfiable:  # nothing to break (an operation without parameters)
                    assert mode == GenerationMode.NEGATIVE
    print(f"schemathesis: {sum(seen.values())} requests sent ({seen}), {unsendable[0]} unsendable, "
          f"{len(server_errors)} 5xx")
    assert sum(seen.values()) >= 8 * EXAMPLES, seen
    assert not server_errors, server_errors


# -- raw JSON schemathesis cannot write ------------------------------------------------------------
BAD_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]
BAD_STRINGS = [r'"\ud800"', r'"\udfff"', r'"a\udc00b"', r'"\ud83d"']


def _annotate(number: str = "1", string: str = '"s-1"') -> bytes:
    return (b'{"app_metadata": {"workflow_type_id": "coding_assistant", "workflow_id": ' +
            string.encode() + b', "agent_id": "planner", "x": ' + number.encode() + b'}}')


def _observe(number: str = "5", string: str = '"s-1"') -> bytes:
    return (b'{"app_metadata": {"workflow_type_id": "coding_assistant", "workflow_id": "s-1", '
            b'"agent_id": "planner"}, "output_tokens": 5, "t_finish": ' + number.encode() +
            b', "response_text": ' + string.encode() + b'}')


@pytest.mark.parametrize("body", [
    *[_annotate(number=n) for n in BAD_NUMBERS],
    *[_annotate(string=s) for s in BAD_STRINGS],
    *[_observe(number=n) for n in BAD_NUMBERS],
    *[_observe(string=s) for s in BAD_STRINGS],
    '{"app_metadata": {"workflow_id": "\ud800"}}'.encode("utf-8", "surrogatepass"),  # raw surrogate
    b"[" * 5000 + b"]" * 5000,
    b'{"app_metadata": ' + b'{"a": ' * 2000 + b"1" + b"}" * 2000 + b"}",
])
def test_non_interoperable_json_gets_400(sidecar, body):
    url, _ = sidecar
    path = "/v1/observe" if b"output_tokens" in body else "/v1/annotate"
    r = httpx.post(url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text[:200])
    assert r.json()["detail"]


@SETTINGS
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                       st.text(alphabet=st.characters(categories=["Cs", "Lu", "Nd"]), max_size=8),
                       st.integers(min_value=-2**70, max_value=2**70)),
       where=st.sampled_from(["workflow_id", "agent_id", "input_tokens", "output_tokens", "t_finish",
                              "response_text", "extra"]))
def test_raw_values_anywhere_never_5xx(sidecar, value, where):
    url, _ = sidecar
    meta = {"workflow_type_id": "coding_assistant", "workflow_id": "w", "agent_id": "planner"}
    body = {"app_metadata": meta}
    if where in ("workflow_id", "agent_id", "extra"):
        meta[where] = value
    else:
        body[where] = value
    path = "/v1/observe" if where in ("output_tokens", "t_finish", "response_text") else "/v1/annotate"
    raw = json.dumps(body).encode()   # NaN/Infinity literals and \udXXX escapes as Python writes them
    r = httpx.post(url + path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code < 500, (r.status_code, raw[:200], r.text[:200])
