"""Interactive API docs served from the package itself, so ``/docs`` works offline.

FastAPI's default ``/docs`` page loads Swagger UI's JavaScript and CSS from a CDN; on a GPU
cluster without internet access that page is blank. :func:`mount_local_docs` serves the same
Swagger UI from the ``swagger-ui-bundle`` wheel (a core dependency) under ``/docs-assets`` and
points the HTML at it. ReDoc has no maintained offline wheel, so ``/redoc`` is not offered; the
schema itself is always at ``/openapi.json``.
"""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

#: URL prefix of the vendored Swagger UI files.
ASSETS_PREFIX = "/docs-assets"

#: ``FastAPI(...)`` keyword arguments that switch off the CDN-backed default pages.
NO_CDN_DOCS = {"docs_url": None, "redoc_url": None}


def mount_local_docs(app: FastAPI) -> None:
    """Serve ``/docs`` (Swagger UI) with every asset from ``/docs-assets``: no network needed."""
    app.mount(ASSETS_PREFIX, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} — API docs",
            swagger_js_url=f"{ASSETS_PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PREFIX}/favicon-32x32.png",
        )
