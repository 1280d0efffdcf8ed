"""A standalone `jupyter-gpualloc serve` subprocess over the test fleet, driven over real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.hubfixture import free_port
from tests.processes import start_logged, wait_until_ready

FLEET = Path(__file__).with_name("fleet.yaml")
TOKENS = {
    "alice-token-0001": {"user": "alice"},
    "bob-token-000002": {"user": "bob", "groups": ["students"]},
    "carol-token-0003": {"user": "carol"},
    "dave-token-00004": {"user": "dave"},
    "root-token-00005": {"user": "root", "admin": True},
}
ALICE, BOB, CAROL, DAVE, ROOT = TOKENS
# The tests' holders are names, not processes: nothing reports them gone, so a released slice is
# free at once here (tests/service/test_holders_gone.py turns the wait for holders back on).
POLICY = """
c.SchedulerPolicy.quotas = {"carol": {"slices": 1}}
c.SchedulerPolicy.heartbeat_ttl = 3600
c.SchedulerPolicy.wait_for_holders = False
"""


class Response:
    def __init__(self, status: int, headers, raw: bytes):
        self.status = status
        self.headers = headers
        self.text = raw.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.text)

    def __repr__(self) -> str:
        return f"<{self.status} {self.text[:300]}>"


class ServiceProcess:
    """One service process with its config, database and audit log in `workdir`."""

    def __init__(self, workdir: Path, *, tokens: dict = TOKENS, config: str = POLICY, args: tuple = (),
                 fleet: Path = FLEET):
        self.workdir = Path(workdir)
        self.fleet = fleet
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/v1/"
        self.db = f"sqlite:///{self.workdir / 'gpualloc.sqlite'}"
        self.audit_log = self.workdir / "audit.jsonl"
        self.config_path = self.workdir / "gpualloc_config.py"
        self.config_path.write_text(f"c.GpuAllocService.api_tokens = {tokens!r}\n{config}")
        self.args = args
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "jupyter_gpualloc.cli", "serve", "--port", str(self.port),
                "--fleet", str(self.fleet), "--db", self.db, "-f", str(self.config_path),
                "--audit-log", str(self.audit_log), *self.args]

    def start(self, timeout: float = 30) -> "ServiceProcess":
        self.proc = start_logged(self.command(), self.workdir / "service.log", cwd=self.workdir,
                                 env={**os.environ, "JUPYTERHUB_API_TOKEN": ""})
        wait_until_ready(self.proc, lambda: self.call("GET", "health").status == 200, "the service",
                         self.log_tail, timeout)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(15)
        self.proc = None

    def log_tail(self) -> str:
        return (self.workdir / "service.log").read_text(errors="replace")[-3000:]

    def call(self, method: str, path: str, body: Any = None, token: str | None = None, *,
             raw: bytes | None = None, timeout: float = 30) -> Response:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return Response(response.status, response.headers, response.read())
        except urllib.error.HTTPError as err:
            return Response(err.code, err.headers, err.read())


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A running standalone service shared by one test module."""
    svc = ServiceProcess(tmp_path_factory.mktemp("service")).start()
    yield svc
    svc.kill(signal.SIGTERM)


@pytest.fixture
def fresh_service(tmp_path):
    """A service of its own for one test (killed at the end)."""
    made: list[ServiceProcess] = []

    def make(**options) -> ServiceProcess:
        made.append(ServiceProcess(tmp_path / f"svc{len(made)}", **options))
        return made[-1]

    yield make
    for svc in made:
        svc.kill()


@pytest.fixture(autouse=True)
def _release_everything(request):
    """Tests sharing the module's service start from an empty fleet."""
    yield
    if "service" in request.fixturenames:
        svc = request.getfixturevalue("service")
        if svc.proc is not None:
            for lease in svc.call("GET", "leases?all=1", token=ROOT).json()["leases"]:
                svc.call("DELETE", f"leases/{lease['id']}", token=ROOT)
            for node in svc.call("GET", "inventory", token=ROOT).json()["nodes"]:
                for gpu in node["gpus"]:
                    if gpu["drained"]:
                        svc.call("DELETE", f"gpus/{gpu['uuid']}/drain", token=ROOT)
