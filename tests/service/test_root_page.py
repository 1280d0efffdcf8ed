"""The service's root: the page for a browser, the caller as JSON for an API client, chosen by Accept."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from jupyter_gpualloc.service.admin_page import wants_page

from .conftest import ALICE, ROOT

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


def get(service, path: str, accept: str | None = None, token: str | None = None):
    request = urllib.request.Request(service.url.removesuffix("api/v1/") + path.lstrip("/"))
    if accept is not None:
        request.add_header("Accept", accept)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.headers, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read().decode()


@pytest.mark.parametrize("accept, page", [
    (BROWSER, True), ("text/html", True), ("text/html;q=0.9, application/json", False),
    ("application/json", False), ("*/*", False), ("", False), ("application/json, text/html", True),
    ("text/html;q=0", False), ("text/*, application/json;q=0.5", False),
])
def test_a_page_for_browsers_json_for_api_clients(accept, page):
    assert wants_page(accept) is page


def test_an_api_client_gets_who_it_is_and_a_link_that_answers(service):
    status, headers, body = get(service, "/", token=ROOT)
    assert status == 200 and headers["Content-Type"].startswith("application/json") and headers["Vary"] == "Accept"
    answer = json.loads(body)
    assert answer["user"] == "root" and answer["admin"] is True
    status, _, document = get(service, answer["api"], token=ROOT)
    assert status == 200 and json.loads(document)["openapi"] == "3.1.0"
    assert get(service, "/", accept="application/json")[0] == 401


def test_a_browser_gets_the_page_without_a_token_and_no_data_in_it(service):
    service.call("POST", "leases", {"spec": {"profile": "1g.5gb"}, "holder": "kernel:seen"}, ALICE)
    status, headers, html = get(service, "/", accept=BROWSER)
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"] and headers["Cache-Control"] == "no-store"
    assert 'data-auth="token"' in html and 'data-api="/api/v1/"' in html and "alice" not in html
    script = html.split('<script type="module" src="')[1].split('"')[0]
    status, headers, code = get(service, script)
    assert status == 200 and headers["Content-Type"] == "text/javascript" and "sessionStorage" in code
    assert get(service, "/static/../app.py")[0] in (403, 404)
