"""`jupyter-gpualloc serve` as a JupyterHub managed service, driven with real hub tokens.

Users: alice and bob (ordinary), ada (holds the custom scope custom:gpualloc:admin). One more
token is made without the service's access scope. A spawned single-user server's own token is
accepted for its user, and a browser gets in through JupyterHub's OAuth.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
import urllib.request

import pytest

from jupyter_gpualloc import client as gc
from tests.hubfixture import (GPUALLOC_ADMIN_SCOPE, GPUALLOC_CUSTOM_SCOPES, Hub, gpualloc_roles, gpualloc_service,
                              http_json)

from .conftest import FLEET

MIG = {"kind": "mig", "profile": "1g.5gb"}
OPERATOR_TOKEN = "operator-" + "7" * 32
WATCHER_TOKEN = "watcher-" + "5" * 32

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("hub")
    service = gpualloc_service(workdir, FLEET, "--tick-interval", "1")
    # two scripts registered as JupyterHub services: an operator's (admin scope) and a plain one
    scripts = [{"name": "operator", "api_token": OPERATOR_TOKEN}, {"name": "watcher", "api_token": WATCHER_TOKEN}]
    roles = [*gpualloc_roles(admins=["ada"]),
             {"name": "gpualloc-operator", "scopes": [GPUALLOC_ADMIN_SCOPE, "access:services!service=gpualloc"],
              "services": ["operator"]},
             {"name": "gpualloc-watcher", "scopes": ["access:services!service=gpualloc"], "services": ["watcher"]}]
    the_hub = Hub(workdir, services=[service, *scripts], roles=roles,
                  custom_scopes=GPUALLOC_CUSTOM_SCOPES).start()
    try:
        the_hub.add_users("alice", "bob", "ada")
        the_hub.wait_for_service("gpualloc")
        yield the_hub
    finally:
        the_hub.stop()


@pytest.fixture(scope="module")
def tokens(hub):
    made = {name: hub.token(name) for name in ("alice", "bob", "ada")}
    made["no-access"] = hub.token("bob", scopes=["read:users:name!user"])
    return made


def api(hub, method, path, token, body=None):
    return http_json(method, hub.url + "/services/gpualloc/api/v1/" + path, body, token)


def test_users_get_their_own_leases_and_admins_hold_the_custom_scope(hub, tokens):
    assert api(hub, "GET", "user", tokens["alice"]) == (200, {"user": "alice", "admin": False, "groups": []})
    assert api(hub, "GET", "user", tokens["ada"])[1]["admin"] is True
    status, lease = api(hub, "POST", "leases", tokens["alice"], {"spec": MIG, "holder": "kernel:a1"})
    assert status == 201 and lease["user"] == "alice"
    path = f"leases/{lease['id']}"
    assert api(hub, "GET", path, tokens["alice"])[0] == 200
    for method, sub in (("GET", ""), ("DELETE", ""), ("POST", "/touch")):
        assert api(hub, method, path + sub, tokens["bob"], {} if method == "POST" else None)[0] == 404
    assert api(hub, "GET", "leases", tokens["bob"]) == (200, {"leases": []})
    assert api(hub, "GET", "leases?all=1", tokens["bob"])[0] == 403
    assert api(hub, "GET", "metrics", tokens["bob"])[0] == 403
    gpu = api(hub, "GET", "inventory", tokens["bob"])[1]["nodes"][0]["gpus"][0]["uuid"]
    assert api(hub, "POST", f"gpus/{gpu}/drain", tokens["bob"])[0] == 403
    # the administrator
    assert [l["id"] for l in api(hub, "GET", "leases?all=1", tokens["ada"])[1]["leases"]] == [lease["id"]]
    status, metrics = api(hub, "GET", "metrics", tokens["ada"])
    assert status == 200 and 'gpualloc_leases{state="granted"} 1.0' in metrics
    assert api(hub, "POST", f"gpus/{gpu}/drain", tokens["ada"]) == (200, {"gpu": gpu, "drained": True})
    assert api(hub, "DELETE", f"gpus/{gpu}/drain", tokens["ada"])[1]["drained"] is False
    status, ended = api(hub, "DELETE", path, tokens["ada"])
    assert status == 200 and ended["state"] == "released" and ended["reason"] == "released by ada"


def test_tokens_without_access_or_unknown_are_refused(hub, tokens):
    status, body = api(hub, "GET", "leases", tokens["no-access"])
    assert status == 403 and "access:services!service=gpualloc" in body["error"]
    assert api(hub, "GET", "leases", "0" * 32)[0] == 401
    assert api(hub, "GET", "leases", None)[0] == 401
    assert api(hub, "GET", "health", None)[0] == 200


def test_a_service_token_with_the_admin_scope_administers_and_one_without_is_refused(hub, tokens):
    status, lease = api(hub, "POST", "leases", tokens["bob"], {"spec": MIG, "holder": "kernel:b-ops"})
    assert status == 201
    assert api(hub, "GET", "user", OPERATOR_TOKEN) == (200, {"user": "service:operator", "admin": True, "groups": []})
    assert lease["id"] in [l["id"] for l in api(hub, "GET", "leases?all=1", OPERATOR_TOKEN)[1]["leases"]]
    assert api(hub, "GET", "metrics", OPERATOR_TOKEN)[0] == 200
    status, ended = api(hub, "DELETE", f"leases/{lease['id']}", OPERATOR_TOKEN)
    assert status == 200 and ended["reason"] == "released by service:operator"
    status, body = api(hub, "GET", "leases", WATCHER_TOKEN)
    assert status == 403 and "service watcher" in body["error"] and GPUALLOC_ADMIN_SCOPE in body["error"]


def test_a_single_user_servers_own_token_acts_for_its_user(hub, tokens):
    env = hub.spawn("alice")
    server_token = env["JUPYTERHUB_API_TOKEN"]
    assert server_token not in tokens.values()
    with gc.SyncGpuAllocClient(env=env) as kernel_side:
        assert kernel_side.url == hub.url + "/services/gpualloc/"
        assert kernel_side.whoami()["user"] == "alice"
        lease = kernel_side.request_lease(MIG, "server", wait=5)
        assert lease["state"] == "granted" and lease["user"] == "alice"
    assert api(hub, "GET", f"leases/{lease['id']}", tokens["alice"])[1]["holder"] == "server"
    assert api(hub, "GET", f"leases/{lease['id']}", tokens["bob"])[0] == 404
    assert api(hub, "DELETE", f"leases/{lease['id']}", server_token)[0] == 200
    hub.api("DELETE", "/users/alice/server")


def test_a_browser_logs_in_through_jupyterhub_oauth(hub, tokens):
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = browser.open(hub.url + "/hub/login", timeout=30).read().decode()
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', form).group(1)
    login = urllib.parse.urlencode({"username": "bob", "password": "x", "_xsrf": xsrf}).encode()
    browser.open(hub.url + "/hub/login", data=login, timeout=30).read()
    landing = browser.open(hub.url + "/services/gpualloc/", timeout=30)
    assert landing.url == hub.url + "/services/gpualloc/"
    assert json.loads(landing.read())["user"] == "bob"
    leases = browser.open(hub.url + "/services/gpualloc/api/v1/leases", timeout=30)
    assert json.loads(leases.read()) == {"leases": []}
    # a cookie-authenticated write without JupyterHub's XSRF token is refused
    request = urllib.request.Request(hub.url + "/services/gpualloc/api/v1/heartbeat", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        browser.open(request, timeout=30)
    assert refused.value.code == 403
