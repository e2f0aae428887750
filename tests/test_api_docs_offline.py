"""`/docs` works without internet: the Swagger UI page references only local assets, which the
sidecar and the gateway serve themselves (real servers on real ports), and a real browser
(headless Chromium) renders the operations from FastAPI's OpenAPI 3.1 schema (Swagger UI 4.x
showed "Unable to render this definition" there)."""
from __future__ import annotations

import re
import subprocess
import tempfile

import httpx
import pytest
from prometheus_client import CollectorRegistry

from serving_hooks.annotator import LocalAnnotator
from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.gateway import Gateway, create_gateway_app
from serving_hooks.server_thread import serve_in_thread
from serving_hooks.service import prediction_service
from serving_hooks.sidecar import create_sidecar_app
from serving_hooks.upstreams import RoundRobinRouter
from tests.serving_helpers import fit_generated_profile


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("docs"), 20, seed=3, min_calls=10)


def assert_offline_docs(base_url: str) -> None:
    page = httpx.get(base_url + "/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower()
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    urls += re.findall(r"""url:\s*['"]([^'"]+)['"]""", page.text)
    assert urls, page.text
    external = [u for u in urls if u.startswith(("http:", "https:", "//"))]
    assert external == [], f"/docs loads assets from the network: {external}"
    for asset in ("/docs-assets/swagger-ui-bundle.js", "/docs-assets/swagger-ui.css"):
        assert asset in page.text
        r = httpx.get(base_url + asset)
        assert r.status_code == 200 and len(r.content) > 10_000, asset
    assert httpx.get(base_url + "/openapi.json").json()["openapi"].startswith("3.")
    assert httpx.get(base_url + "/redoc").status_code in (404, 405)  # no CDN-only page offered


def rendered_docs(chromium: str, base_url: str) -> str:
    """The DOM of ``/docs`` after Swagger UI ran: Chromium with a virtual-time budget (it lets the
    page's scripts and its fetch of /openapi.json finish before the DOM is dumped)."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile_dir:
        out = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              "--disable-background-networking", "--disable-component-update",
                              f"--user-data-dir={profile_dir}", "--virtual-time-budget=20000",
                              "--dump-dom", base_url + "/docs"],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def assert_operations_rendered(chromium: str, base_url: str) -> None:
    """Every operation of the schema is listed on the page, and Swagger UI reports no error."""
    schema = httpx.get(base_url + "/openapi.json").json()
    assert schema["openapi"].startswith("3.1")
    dom = rendered_docs(chromium, base_url)
    assert "Unable to render this definition" not in dom
    shown = set(re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', dom))
    assert shown == set(schema["paths"]), (sorted(shown), sorted(schema["paths"]))


def test_sidecar_docs_are_served_offline(profile_root):
    registry = CollectorRegistry()
    service = prediction_service(profile_root, registry, "profiler_sidecar")
    with serve_in_thread(create_sidecar_app(service, registry=registry)) as server:
        assert_offline_docs(server.url)


def test_sidecar_docs_render_the_operations_in_a_real_browser(profile_root, chromium):
    registry = CollectorRegistry()
    service = prediction_service(profile_root, registry, "profiler_sidecar")
    with serve_in_thread(create_sidecar_app(service, registry=registry)) as server:
        assert_operations_rendered(chromium, server.url)
        assert "/v1/annotate" in httpx.get(server.url + "/openapi.json").json()["paths"]


def test_gateway_docs_are_served_offline_not_proxied(profile_root):
    upstream = FakeOpenAI()
    with serve_in_thread(upstream.app) as up:
        registry = CollectorRegistry()
        service = prediction_service(profile_root, registry, "profiler_gateway")
        gw = Gateway(RoundRobinRouter([up.url]), LocalAnnotator(service), registry=registry, service=service)
        with serve_in_thread(create_gateway_app(gw)) as server:
            assert_offline_docs(server.url)
    assert not [r.path for r in upstream.received if "docs" in r.path]


def test_gateway_docs_render_the_operations_in_a_real_browser(profile_root, chromium):
    upstream = FakeOpenAI()
    with serve_in_thread(upstream.app) as up:
        registry = CollectorRegistry()
        service = prediction_service(profile_root, registry, "profiler_gateway")
        gw = Gateway(RoundRobinRouter([up.url]), LocalAnnotator(service), registry=registry, service=service)
        with serve_in_thread(create_gateway_app(gw)) as server:
            assert_operations_rendered(chromium, server.url)
    assert not [r.path for r in upstream.received if "docs" in r.path or "openapi" in r.path]
