"""Interactive API docs served from the package itself, so ``/docs`` works offline.

FastAPI's default ``/docs`` page loads Swagger UI's JavaScript and CSS from a CDN; on a GPU
cluster without internet access that page is blank. :func:`mount_local_docs` serves Swagger UI
from the ``fastapi-offline`` wheel (a core dependency, which vendors swagger-ui-dist 5.x) under
``/docs-assets`` and points the HTML at it.

The Swagger UI version matters: FastAPI emits OpenAPI **3.1**, and Swagger UI only reads 3.1
from 5.0 on; the 4.x bundle this module served before showed "Unable to render this
definition" instead of the operations. ``tests/test_api_docs_offline.py`` loads the page in
headless Chromium and checks that the operations are listed. ``/redoc`` is not offered; the
schema itself is always at ``/openapi.json``.
"""
from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

#: URL prefix of the vendored Swagger UI files.
ASSETS_PREFIX = "/docs-assets"

#: The Swagger UI 5.x files inside the ``fastapi-offline`` wheel (package data, no import of
#: its FastAPI subclass: the sidecar and the gateway build their own apps).
SWAGGER_UI_DIR = files("fastapi_offline") / "static"

#: ``FastAPI(...)`` keyword arguments that switch off the CDN-backed default pages.
NO_CDN_DOCS = {"docs_url": None, "redoc_url": None}


def mount_local_docs(app: FastAPI) -> None:
    """Serve ``/docs`` (Swagger UI) with every asset from ``/docs-assets``: no network needed."""
    app.mount(ASSETS_PREFIX, StaticFiles(directory=str(SWAGGER_UI_DIR)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} — API docs",
            swagger_js_url=f"{ASSETS_PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PREFIX}/favicon.png",
        )
