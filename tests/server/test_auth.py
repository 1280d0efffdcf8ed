"""Every handler of the extension refuses unauthenticated requests; authenticated ones work."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from jupyter_gpualloc.server.handlers import routes
from jupyter_gpualloc.service.app import ROUTES

SIDEBAR = [(path.replace("([^/]+)", "abc"), "POST" if path.endswith(("request", "release", "extend", "rerun")) else "GET")
           for path, _ in routes()]
PUBLIC_V1 = {"/health", "/openapi.json"}  # the service's own public endpoints stay public
V1 = [("/gpualloc/api/v1" + template.replace("{lease_id}", "abc").replace("{gpu_uuid}", "GPU-x"), method)
      for template, handler, _ in ROUTES if template not in PUBLIC_V1
      for method in ("GET", "POST", "DELETE") if hasattr(handler, method.lower())]


async def fetch(url: str, method: str, headers: dict | None = None):
    body = "{}" if method == "POST" else None
    try:
        return await AsyncHTTPClient().fetch(url, method=method, body=body, headers=headers or {})
    except HTTPClientError as err:
        return err.response


@pytest.mark.parametrize(("path", "method"), SIDEBAR + V1)
async def test_unauthenticated_requests_are_refused(gpualloc, jp_base_url, jp_http_port, path, method):
    url = f"http://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}{path}"
    response = await fetch(url, method)
    assert response.code in (401, 403), (path, method, response.code)
    wrong = await fetch(url, method, {"Authorization": "token not-the-servers-token"})
    assert wrong.code in (401, 403), (path, method, wrong.code)


async def test_authenticated_sidebar_and_api_calls(gpualloc, jp_fetch, jp_serverapp):
    offers = json.loads((await jp_fetch("gpualloc", "api", "offers", params={"no_track_activity": "1"})).body)
    assert [o["name"] for o in offers["offers"]] == ["mig-1g.5gb", "whole-a100", "shared-8gb"]
    before = jp_serverapp.web_app.settings.get("api_last_activity")
    granted = json.loads((await jp_fetch("gpualloc", "api", "request", method="POST",
                                         body=json.dumps({"offer": "shared-8gb"}),
                                         params={"no_track_activity": "1"})).body)
    assert granted["state"] == "granted" and granted["holder"] == "server"
    assert granted["caps"] == ["framework", "watchdog"]
    assert jp_serverapp.web_app.settings.get("api_last_activity") == before  # the sidebar is not activity
    slices = json.loads((await jp_fetch("gpualloc", "api", "slices")).body)["slices"]
    assert [s["id"] for s in slices] == [granted["id"]]
    v1 = json.loads((await jp_fetch("gpualloc", "api", "v1", "leases")).body)["leases"]
    assert [l["id"] for l in v1] == [granted["id"]]
    released = json.loads((await jp_fetch("gpualloc", "api", "release", method="POST",
                                          body=json.dumps({"lease_id": granted["id"]}))).body)
    assert released["state"] == "released"
    status = json.loads((await jp_fetch("gpualloc", "api", "status")).body)
    assert status["mode"] == "embedded" and status["watchdog"]["action"] == "report"
