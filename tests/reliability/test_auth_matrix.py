"""Who may call what, for every route of both route tables, generated from the tables themselves.

The service's ROUTES (standalone and embedded), the server extension's sidebar routes and its
kernels' event relay (remote mode) are read at collection time, and a server in each mode is
asked what the extension registered: a route it serves that the matrix lacks fails. Every
method a handler implements is called with no credentials, with malformed ones, as another user
on every id-based route, as a plain user on every route whose handler can require the admin, and
in embedded mode with a foreign Host and a foreign Origin: each answer is a 4xx, never a 2xx, and
no answer (nor another user's event stream) shows the owner's lease or holder. The kernels' paths
(the event relay, a kernel's restart as a GPU kernel) answer only the token its server gave its
kernels: not the server's own, nor another user's.
"""

from __future__ import annotations

import http.client
import inspect
import re
import socket
import time

import pytest
import requests
from tornado import web
from tornado.routing import Router

from jupyter_gpualloc.server.handlers import SidebarHandler, routes as sidebar_routes
from jupyter_gpualloc.server.gpu_restart import RESTART_PATH, KernelRestartHandler
from jupyter_gpualloc.server.relay import EVENTS_PATH, RELAY_ROOT, KernelEventsHandler
from jupyter_gpualloc.service.app import ROUTES
from jupyter_gpualloc.service.handlers import ApiHandler

from tests.server.conftest import FLEET, extension_config
from tests.server.test_server_process import SERVER_TOKEN as REMOTE_SERVER_TOKEN, JupyterServerProcess

from .servers import ADMIN, OTHER, USER, EmbeddedServer, bearer, start_standalone

METHODS = ("get", "post", "put", "patch", "delete")
PUBLIC = {"/health", "/openapi.json"}
MALFORMED = [{"Authorization": "Bearer"}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic YTpi"},
             {"Authorization": "Bearer " + "x" * 5000}, {"Authorization": "token alice-token-0001 extra"},
             {"Cookie": "gpualloc=forged"}]
SECRET_HOLDER = "kernel:owner-secret-holder-7f3a"


def implemented(handler: type, base: type) -> list[str]:
    """The HTTP methods a handler class defines beyond its base."""
    return [m.upper() for m in METHODS if getattr(handler, m) is not getattr(base, m)]


def needs_admin(handler: type, method: str) -> bool:
    """Whether the handler's `method`, or a helper of its class that it calls, can require the
    allocator's admin (GET /reservations answers members; its POST needs the admin)."""
    source = inspect.getsource(getattr(handler, method.lower()))
    helpers = [f for name, f in vars(handler).items() if callable(f) and f"self.{name}(" in source]
    return any("require_admin" in inspect.getsource(f) for f in [getattr(handler, method.lower()), *helpers])


V1 = [(template, method, handler) for template, handler, _ in ROUTES for method in implemented(handler, ApiHandler)]
SIDEBAR = [(path, method) for path, handler in sidebar_routes()
           for method in implemented(handler, SidebarHandler)]
RELAY = [("/" + EVENTS_PATH, method) for method in implemented(KernelEventsHandler, web.RequestHandler)] + \
    [("/" + RELAY_ROOT + RESTART_PATH, method) for method in implemented(KernelRestartHandler, web.RequestHandler)]


def fill(template: str, ids: dict[str, str]) -> str:
    """A path template with its parameters filled from `ids` (an unknown one reads 'x')."""
    path = re.sub(r"\{([a-z_]+)\}", lambda m: ids.get(m.group(1), "x"), template)
    return re.sub(r"\([^)]*\)", "x", path).lstrip("/")


def assert_refused(response, *, what: str, allowed=(401, 403, 404, 405)) -> None:
    assert 400 <= response.status_code < 500 and response.status_code in allowed, (what, response.status_code,
                                                                                    response.text[:300])
    assert SECRET_HOLDER not in response.text and "owner-secret" not in response.text, what


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    service, api = start_standalone(tmp_path_factory.mktemp("matrix"))
    lease = api.call("POST", "leases", {"spec": {"kind": "shared", "memory_gib": 1}, "holder": SECRET_HOLDER},
                     headers=api.user).json()
    job = api.call("POST", "jobs", {"spec": {"kind": "shared", "memory_gib": 1}, "workdir": "/tmp",
                                    "source": {"kind": "cell", "code": "print('owner-secret')"}}, headers=api.user)
    gpu = api.call("GET", "inventory", headers=api.admin).json()["nodes"][0]["gpus"][0]["uuid"]
    ids = {"lease_id": lease["id"], "gpu_uuid": gpu, "job_id": job.json().get("id", "x")}
    yield api, ids
    service.kill()


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """A Jupyter server with its token, and one with authentication off (the DNS-rebinding target)."""
    servers = [EmbeddedServer(tmp_path_factory.mktemp("embedded")),
               EmbeddedServer(tmp_path_factory.mktemp("open"), token="")]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.mark.parametrize(("template", "method", "handler"), V1, ids=[f"{m} {t}" for t, m, _ in V1])
def test_standalone_route_refuses_the_wrong_caller(standalone, template, method, handler):
    api, ids = standalone
    path = fill(template, ids)
    body = {} if method in ("POST", "PUT", "PATCH") else None
    if template not in PUBLIC:
        for headers in [{}, *MALFORMED]:
            response = api.call(method, path, body, headers)
            assert_refused(response, what=(method, path, headers), allowed=(401, 403))
    if re.search(r"\{(lease|job)_id\}", template):
        response = api.call(method, path, body, bearer(OTHER))
        assert_refused(response, what=(method, path, "another user"), allowed=(400, 404, 405))
    if needs_admin(handler, method):
        response = api.call(method, path, body, bearer(OTHER), params={"all": "1"})
        assert_refused(response, what=(method, path, "not an admin"), allowed=(400, 403, 404, 405))


def test_lists_and_events_show_a_user_only_their_own(standalone):
    api, ids = standalone
    for path in ("leases", "inventory", "jobs", "offers", "usage", "heartbeat"):
        method = "POST" if path == "heartbeat" else "GET"
        response = api.call(method, path, {} if method == "POST" else None, bearer(OTHER))
        assert response.status_code == 200, (path, response.text[:300])
        assert ids["lease_id"] not in response.text and SECRET_HOLDER not in response.text, path
    for reader, sees in ((bearer(OTHER), False), (api.user, True)):
        made: list[dict] = []
        holder = f"{SECRET_HOLDER}-{len(reader)}-{sees}"

        def grant_and_release() -> None:
            made.append(api.call("POST", "leases", {"spec": {"kind": "shared", "memory_gib": 1}, "holder": holder},
                                 headers=api.user).json())
            api.call("DELETE", f"leases/{made[0]['id']}", headers=api.user)

        events = read_events(api, reader, grant_and_release)
        assert ": connected" in events
        assert (made[0]["id"] in events) is sees and (holder in events) is sees, events[-500:]


def read_events(api, headers: dict, act, seconds: float = 1.5) -> str:
    """What an event stream carries while `act()` runs, read for `seconds`."""
    host, port = re.match(r"http://([^:/]+):(\d+)", api.url).groups()
    path = api.url.split(f":{port}", 1)[1] + "events"
    connection = http.client.HTTPConnection(host, int(port), timeout=seconds)
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    act()
    chunks, deadline = [], time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            data = response.fp.read1(65536)
            if not data:
                break
            chunks.append(data)
    except (socket.timeout, TimeoutError):
        pass
    finally:
        connection.close()
    return b"".join(chunks).decode(errors="replace")


EMBEDDED = [("gpualloc/api/v1" + template, method) for template, method, _ in V1] + SIDEBAR


@pytest.mark.parametrize(("path", "method"), EMBEDDED, ids=[f"{m} {p}" for p, m in EMBEDDED])
def test_embedded_route_refuses_foreign_hosts_origins_and_strangers(embedded, path, method):
    guarded, open_server = embedded
    url_path = fill(path, {})
    body = b"{}" if method in ("POST", "PUT", "PATCH") else None
    for server in (guarded, open_server):
        api = server.api()
        for headers in ({"Host": "evil.example"}, {"Host": "evil.example:80", "Origin": "http://evil.example"}):
            response = api.session.request(method, server.url + url_path, data=body,
                                           headers={**api.user, **headers, "Content-Type": "application/json"},
                                           timeout=30)
            assert_refused(response, what=(method, path, headers), allowed=(403,))
    origin = open_server.api().session.request(
        method, open_server.url + url_path, data=body, timeout=30,
        headers={"Origin": "http://evil.example", "Content-Type": "application/json"})
    assert_refused(origin, what=(method, path, "foreign Origin"), allowed=(403,))
    if path.removeprefix("gpualloc/api/v1") in PUBLIC:
        return
    for headers in [{}, *MALFORMED]:
        response = guarded.api().session.request(method, guarded.url + url_path, data=body,
                                                 headers={**headers, "Content-Type": "application/json"}, timeout=30)
        assert_refused(response, what=(method, path, headers), allowed=(401, 403))



def extension_routes(router: Router) -> set[tuple[str, str]]:
    """(path regex, method) of every route a server's web app serves with a handler of this package."""
    found: set[tuple[str, str]] = set()
    for rule in getattr(router, "rules", []):
        target = rule.target
        if isinstance(target, Router):
            found |= extension_routes(target)
        elif isinstance(target, type) and target.__module__.startswith("jupyter_gpualloc."):
            found |= {(rule.matcher.regex.pattern, m) for m in implemented(target, web.RequestHandler)}
    return found


@pytest.fixture(params=["embedded", "remote"])
def jp_server_config(request, tmp_path):
    """An in-process server with the extension in each mode (remote: a service that need not answer)."""
    if request.param == "embedded":
        return extension_config(tmp_path)
    return extension_config(tmp_path, GpuAllocExtension={"mode": "remote", "service_url": "http://127.0.0.1:9/",
                                                         "service_token": USER, "fleet": str(FLEET)})


def test_the_matrix_holds_every_route_the_extension_registers(jp_serverapp):
    base = jp_serverapp.base_url
    called = {(base + fill(path, {}), method) for path, method in EMBEDDED + RELAY}
    registered = extension_routes(jp_serverapp.web_app.default_router)
    assert registered, "no route of the extension found: the walk of tornado's routers is wrong"
    missing = [(pattern, method) for pattern, method in sorted(registered)
               if not any(m == method and re.fullmatch(pattern, path) for path, m in called)]
    assert not missing, f"routes the auth matrix does not call: {missing}"


@pytest.fixture(scope="module")
def remote(standalone, tmp_path_factory):
    """A Jupyter server in remote mode, its kernels given the plain user's token for the service."""
    api, _ = standalone
    server = JupyterServerProcess(tmp_path_factory.mktemp("remote"), {},
                                  env={"GPUALLOC_URL": api.url[:-len("api/v1/")], "GPUALLOC_TOKEN": USER})
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.mark.parametrize(("path", "method"), RELAY, ids=[f"{m} {p}" for p, m in RELAY])
def test_relay_answers_only_the_token_its_server_gave_its_kernels(remote, path, method):
    url = remote.url + fill(path, {})
    strangers = [{}, *MALFORMED, {"Authorization": f"token {REMOTE_SERVER_TOKEN}"}, bearer(OTHER), bearer(ADMIN),
                 {"Host": "evil.example"}, {"Origin": "http://evil.example"}]
    for headers in strangers:
        response = requests.request(method, url, headers=headers, timeout=30)
        assert_refused(response, what=(method, path, headers), allowed=(401,))
    for foreign in ({"Host": "evil.example"}, {"Host": "evil.example:80"}):  # the right token, a rebound name
        response = requests.request(method, url, headers={**bearer(USER), **foreign}, timeout=30)
        assert_refused(response, what=(method, path, foreign), allowed=(403,))
        assert response.json()["field"] == "Host"
    if path.endswith("/restart"):  # a kernel restarting as a GPU kernel: this server has no kernel "x"
        response = requests.request(method, url, headers=bearer(USER), json={"spec": {"kind": "shared", "memory_gib": 1}},
                                    timeout=30)
        assert response.status_code == 404 and response.json()["field"] == "kernel_id", response.text[:300]
    else:
        with requests.request(method, url, headers=bearer(USER), stream=True, timeout=30) as response:
            assert response.status_code == 200, response.text[:300]
            assert next(response.iter_lines()) == b": connected"
    for other in sorted({m.upper() for m in METHODS} - {m for p, m in RELAY if p == path}):
        response = requests.request(other, url, headers=bearer(USER), timeout=30)
        assert_refused(response, what=(other, path), allowed=(403, 405))  # 403: the server's XSRF check
