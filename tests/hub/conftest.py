"""The real demo hub (hub_config/jupyterhub_config.py) on free loopback ports, in a temporary dir."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.hubfixture import find_proxy, free_port
from tests.processes import start_logged, wait_until_ready

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "hub_config" / "jupyterhub_config.py"
ADMIN_SERVICE = "hub-test-admin"

# Short times so the tests see heartbeats, expiry and polling within seconds.
SERVICE_CONFIG = """
c.SchedulerPolicy.heartbeat_ttl = 10
c.GpuAllocService.tick_interval = 0.5
"""
EXTRA_CONFIG = """
c = get_config()  # noqa
c.JupyterHub.services.append({{"name": "{name}", "api_token": "{token}"}})
c.JupyterHub.load_roles.append({{
    "name": "hub-test-admin", "services": ["{name}"],
    "scopes": ["admin:users", "admin:servers", "admin:server_state", "tokens", "read:services"],
}})
c.JupyterHub.last_activity_interval = 2
c.Spawner.poll_interval = 2
c.Spawner.start_timeout = {start_timeout}
c.GPUSpawnerMixin.gpu_heartbeat_interval = 1
c.GPUSpawnerMixin.gpu_poll_interval = 0.3
c.GPUSpawnerMixin.gpu_start_reserve = 10
"""


class DemoHub:
    """One JupyterHub process running the demo config (or `command`), with its proxy, service and servers."""

    def __init__(self, workdir: Path, *, start_timeout: int = 60, command: list[str] | None = None,
                 extra_config: str = "", service_config: str = ""):
        self.workdir = Path(workdir)
        self.command = command or [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(CONFIG)]
        self.port, self.hub_port = free_port(), free_port()
        self.proxy_api_port, self.service_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_token = secrets.token_hex(16)
        (self.workdir / "service_extra.py").write_text(SERVICE_CONFIG + service_config)
        (self.workdir / "hub_extra.py").write_text(EXTRA_CONFIG.format(
            name=ADMIN_SERVICE, token=self.admin_token, start_timeout=start_timeout) + extra_config)
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "jupyterhub.log"
        self.server_pids: set[int] = set()
        self._tokens: dict[str, str] = {}

    def env(self) -> dict[str, str]:
        proxy = find_proxy()
        env = dict(os.environ)
        env.pop("JUPYTERHUB_API_TOKEN", None)
        env["PATH"] = os.pathsep.join([str(proxy.parent), str(Path(sys.executable).parent), env.get("PATH", "")])
        env.update({
            "GPUALLOC_DEMO_DIR": str(self.workdir), "GPUALLOC_DEMO_PORT": str(self.port),
            "GPUALLOC_DEMO_HUB_PORT": str(self.hub_port), "GPUALLOC_DEMO_PROXY_API_PORT": str(self.proxy_api_port),
            "GPUALLOC_DEMO_SERVICE_PORT": str(self.service_port),
            "GPUALLOC_DEMO_FLEET": str(REPO / "hub_config" / "demo-fleet.yaml"),
            "GPUALLOC_DEMO_SERVICE_CONFIG": str(self.workdir / "service_extra.py"),
            "GPUALLOC_DEMO_EXTRA_CONFIG": str(self.workdir / "hub_extra.py"),
        })
        return env

    def start(self, timeout: float = 60) -> "DemoHub":
        self.proc = start_logged(self.command, self.log_path, cwd=self.workdir, env=self.env())

        def ready() -> bool:
            return (requests.get(self.url + "/services/gpualloc/api/v1/health", timeout=2).status_code == 200
                    and requests.get(self.url + "/hub/api/", timeout=2).status_code == 200)

        wait_until_ready(self.proc, ready, "the demo hub", self.log_tail, timeout)
        return self

    def stop(self) -> None:
        """Stop the hub (SIGTERM: it stops its proxy and service; servers keep running)."""
        if self.proc is None:
            return
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        alive = [p for p in children if p.is_running() and p.pid not in self.server_pids]
        for child in alive:
            child.kill()
        psutil.wait_procs(alive, timeout=5)
        self.proc = None

    def kill_servers(self) -> None:
        for pid in self.server_pids:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass

    def log_tail(self, chars: int = 5000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    # ------------------------------------------------------------------ APIs
    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> requests.Response:
        return requests.request(method, self.url + "/hub/api" + path, json=body, timeout=30,
                                headers={"Authorization": f"token {token or self.admin_token}"})

    def token(self, user: str) -> str:
        """An API token of `user` (made once per user; users are created as needed)."""
        if user not in self._tokens:
            self.api("POST", "/users", {"usernames": [user]})
            reply = self.api("POST", f"/users/{user}/tokens", {"note": "test"})
            assert reply.status_code == 201, reply.text
            self._tokens[user] = reply.json()["token"]
        return self._tokens[user]

    def service(self, method: str, path: str, body: Any = None, user: str = "admin") -> requests.Response:
        """A call to the scheduler service through the proxy, as `user`."""
        return requests.request(method, self.url + "/services/gpualloc/api/v1/" + path, json=body, timeout=30,
                                headers={"Authorization": f"token {self.token(user)}"})

    def leases(self) -> list[dict]:
        reply = self.service("GET", "leases?all=1")
        assert reply.status_code == 200, reply.text
        return reply.json()["leases"]

    def server(self, user: str) -> dict | None:
        return self.api("GET", f"/users/{user}").json()["servers"].get("")

    def wait_ready(self, user: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            server = self.server(user)
            if server and server.get("ready"):
                self.server_pids.add(server["state"]["pid"])
                return server
            if server is None and time.monotonic() > deadline - timeout + 3:
                break
            time.sleep(0.3)
        raise AssertionError(f"the server of {user} did not become ready: {self.server(user)}\n{self.log_tail()}")

    def wait_stopped(self, user: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server(user) is None:
                return
            time.sleep(0.3)
        raise AssertionError(f"the server of {user} did not stop\n{self.log_tail()}")

    def progress(self, user: str, until: str, timeout: float = 30) -> list[dict]:
        """The spawn progress events of `user` up to the first whose message contains `until`."""
        events = []
        with requests.get(self.url + f"/hub/api/users/{user}/server/progress", stream=True, timeout=timeout,
                          headers={"Authorization": f"token {self.token(user)}"}) as reply:
            for line in reply.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    events.append(json.loads(line[5:]))
                    if until in events[-1].get("message", ""):
                        return events
        raise AssertionError(f"no progress event with {until!r}: {events}")


def server_environ(pid: int) -> dict[str, str]:
    """The environment a running process was started with (from /proc)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


class Browser:
    """A person with a browser: logs in through the login form and submits the spawn form."""

    def __init__(self, hub: DemoHub, user: str):
        self.hub, self.user = hub, user
        self.session = requests.Session()

    def xsrf(self, html: str) -> str:
        match = re.search(r'name="_xsrf" value="([^"]+)"', html) or re.search(r'_xsrf=([^"&]+)"', html)
        assert match, html[:2000]
        return match.group(1)

    def login(self) -> None:
        page = self.session.get(self.hub.url + "/hub/login", timeout=30)
        reply = self.session.post(self.hub.url + "/hub/login", timeout=30, allow_redirects=False,
                                  data={"username": self.user, "password": "any", "_xsrf": self.xsrf(page.text)})
        assert reply.status_code == 302, reply.text[:2000]

    def spawn_form(self) -> str:
        page = self.session.get(self.hub.url + "/hub/spawn", timeout=30)
        assert page.status_code == 200, page.text[:2000]
        return page.text

    def submit(self, gpu: str) -> requests.Response:
        html = self.spawn_form()
        action = re.search(r'id="spawn_form"\s+action="([^"]+)"', html).group(1).replace("&amp;", "&")
        return self.session.post(self.hub.url + action, timeout=60, allow_redirects=False, files={"gpu": (None, gpu)})


@pytest.fixture(scope="module")
def demo_hub(tmp_path_factory):
    hub = DemoHub(tmp_path_factory.mktemp("demo-hub")).start()
    try:
        yield hub
    finally:
        hub.stop()
        hub.kill_servers()
