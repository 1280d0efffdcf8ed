"""The API under test, both ways it is served: a standalone service and a Jupyter server in embedded mode.

Each is a real subprocess over the test fleets, reached over HTTP with `requests`; `Api.call`
sends raw bytes when asked, so tests can say what no JSON encoder would (lone surrogates,
NaN spelled out, deep nesting).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from tests.hubfixture import free_port
from tests.processes import start_logged, wait_until_ready
from tests.server.conftest import FLEET as SERVER_FLEET, OFFERS
from tests.service.conftest import TOKENS, ServiceProcess

USER, OTHER, ADMIN = "alice-token-0001", "bob-token-000002", "root-token-00005"
SERVER_TOKEN = "server-token-123456"


@dataclass
class Api:
    """Where REST API v1 is served, and the credentials of its callers."""

    mode: str  # "standalone" or "embedded"
    url: str  # ends with /api/v1/
    user: dict[str, str]  # headers of a plain user
    admin: dict[str, str]  # headers of an allocator admin
    other: dict[str, str] | None  # headers of a second user (standalone only: a Jupyter server has one)
    session: requests.Session = field(default_factory=requests.Session)

    def call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, *,
             raw: bytes | None = None, params: dict | None = None) -> requests.Response:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent = {"Content-Type": "application/json"} if data is not None else {}
        return self.session.request(method, self.url + path.lstrip("/"), data=data, params=params,
                                    headers={**sent, **(headers or {})}, timeout=60)

    def release_all(self) -> None:
        """End every active lease, so the next check starts from an empty fleet."""
        for lease in self.call("GET", "leases", params={"all": "1"}, headers=self.admin).json()["leases"]:
            self.call("DELETE", f"leases/{lease['id']}", headers=self.admin)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def start_standalone(workdir: Path) -> tuple[ServiceProcess, Api]:
    # holders are names, not processes: nothing reports them gone, so released slices are free at once
    config = ("c.SchedulerPolicy.heartbeat_ttl = 3600\nc.SchedulerPolicy.wait_for_holders = False\n"
              "c.GpuAllocService.max_wait = 1.0\n")
    service = ServiceProcess(workdir, config=config).start()
    return service, Api("standalone", service.url, bearer(USER), bearer(ADMIN), bearer(OTHER))


class EmbeddedServer:
    """`jupyter server` with the extension in embedded mode; `token=""` turns its authentication off.

    `admin`: whether its owner administers the allocator; `debug`: log every request (2xx included).
    """

    def __init__(self, workdir: Path, token: str = SERVER_TOKEN, *, admin: bool = True, debug: bool = False):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.debug = debug
        self.port = free_port()
        config = {
            "ServerApp": {"jpserver_extensions": {"jupyter_gpualloc.server": True}},
            "GpuAllocExtension": {"mode": "embedded", "fleet": str(SERVER_FLEET),
                                  "db_url": f"sqlite:///{self.workdir / 'gpualloc.sqlite'}",
                                  "process_dir": str(self.workdir / "gpu-processes"),
                                  "owner": "owner", "owner_is_admin": admin},
            "SchedulerPolicy": {"offers": OFFERS, "heartbeat_ttl": 3600.0, "wait_for_holders": False},
            "Watchdog": {"enabled": False},
        }
        (self.workdir / "config").mkdir(exist_ok=True)
        (self.workdir / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUALLOC_", "JUPYTERHUB_", "JUPYTER_"))}
        self.env = {**clean, "JUPYTER_CONFIG_DIR": str(self.workdir / "config"),
                    "JUPYTER_DATA_DIR": str(self.workdir / "data"),
                    "JUPYTER_RUNTIME_DIR": str(self.workdir / "runtime"),
                    "PYTHONPATH": os.pathsep.join(sys.path)}
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}/"

    def start(self, timeout: float = 60) -> "EmbeddedServer":
        self.proc = start_logged(
            [sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser", f"--port={self.port}",
             "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={self.workdir}", *(["--debug"] if self.debug else [])],
            self.workdir / "server.log", env=self.env, cwd=self.workdir)
        wait_until_ready(self.proc, lambda: requests.get(self.url + "gpualloc/api/v1/health", timeout=5).ok,
                         "jupyter server", self.log_tail, timeout)
        return self

    @property
    def log_file(self) -> Path:
        return self.workdir / "server.log"

    def log_tail(self) -> str:
        return self.log_file.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def api(self) -> Api:
        owner = {"Authorization": f"token {self.token}"} if self.token else {}
        return Api("embedded", self.url + "gpualloc/api/v1/", owner, owner, None)

