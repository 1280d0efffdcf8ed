"""A standalone `jupyter-gpualloc serve` over a small simulated fleet, and real ipykernel kernels.

Kernels are started with jupyter_client's KernelManager (the environment a provisioner would give
them: GPUALLOC_URL and GPUALLOC_TOKEN) and cells run through a blocking client; each cell's
stdout, stderr, displays, display updates, widget comm messages and error come back as a `Cell`.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
from jupyter_client import KernelManager

from tests.hubfixture import free_port

FLEET = Path(__file__).with_name("fleet.yaml")
TOKENS = {
    "alice-kernel-tok": {"user": "alice"},
    "bob-kernel-token": {"user": "bob"},
    "carol-kernel-tok": {"user": "carol"},
    "root-kernel-tok1": {"user": "root", "admin": True},
}
ALICE, BOB, CAROL, ROOT = TOKENS
POLICY = 'c.SchedulerPolicy.quotas = {"carol": {"slices": 1}}\n'


class Service:
    """One service process with its config, database and log in `workdir`."""

    def __init__(self, workdir: Path, policy: str = POLICY):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        config = workdir / "gpualloc_config.py"
        config.write_text(f"c.GpuAllocService.api_tokens = {TOKENS!r}\n{policy}")
        self.command = [sys.executable, "-m", "jupyter_gpualloc.cli", "serve", "--port", str(self.port),
                        "--fleet", str(FLEET), "--db", f"sqlite:///{workdir / 'gpualloc.sqlite'}",
                        "-f", str(config), "--audit-log", ""]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> "Service":
        with open(self.workdir / "service.log", "ab") as log:
            self.proc = subprocess.Popen(self.command, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, env={**os.environ, "JUPYTERHUB_API_TOKEN": ""})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited: {(self.workdir / 'service.log').read_text()[-2000:]}")
            try:
                self.call("GET", "health")
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("service did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(15)

    def call(self, method: str, path: str, body: Any = None, token: str = ROOT) -> Any:
        """One API call as `token`'s user: the decoded JSON answer (HTTPError on an error answer)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}api/v1/{path}", data=data, method=method,
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def leases(self) -> list[dict]:
        return self.call("GET", "leases?all=1")["leases"]

    def release_all(self) -> None:
        for lease in self.leases():
            self.call("DELETE", f"leases/{lease['id']}?holder_gone=true")  # the tests' holders are gone


@dataclass
class Cell:
    """What one executed cell sent back."""

    stdout: str = ""
    stderr: str = ""
    displays: list[dict] = field(default_factory=list)   # display_data / execute_result data bundles
    updates: list[dict] = field(default_factory=list)    # update_display_data bundles
    comm_opens: list[dict] = field(default_factory=list)
    comm_msgs: list[dict] = field(default_factory=list)
    error: dict | None = None
    status: str = ""

    @property
    def texts(self) -> list[str]:
        return [d.get("text/plain", "") for d in self.displays + self.updates]


class Kernel:
    """A real ipykernel kernel started by jupyter_client, with the extension loaded."""

    def __init__(self, env: dict[str, str], cwd: Path):
        # named as jupyter_server's kernel managers name them: kernel-<kernel id>.json
        self.kernel_id = str(uuid.uuid4())
        self.manager = KernelManager(kernel_name="python3", connection_file=str(cwd / f"kernel-{self.kernel_id}.json"))
        self.manager.start_kernel(env=env, cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        cell = self.run("%load_ext jupyter_gpualloc")
        assert cell.status == "ok" and not cell.stderr, cell

    def submit(self, code: str) -> str:
        return self.client.execute(code, allow_stdin=False)

    def send_comm_msg(self, comm_id: str, data: dict) -> str:
        """What a frontend sends when a widget is used, e.g. a button click."""
        msg = self.client.session.msg("comm_msg", {"comm_id": comm_id, "data": data})
        self.client.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def collect(self, msg_id: str, timeout: float = 30, until: Callable[[Cell], bool] | None = None) -> Cell:
        """iopub output of one request until the kernel is idle again (or `until` holds)."""
        cell = Cell()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no idle after {timeout} s: {cell}")
            try:
                msg = self.client.get_iopub_msg(timeout=left)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    cell.stdout += content["text"]
                else:
                    cell.stderr += content["text"]
            elif kind in ("display_data", "execute_result"):
                cell.displays.append(content["data"])
            elif kind == "update_display_data":
                cell.updates.append(content["data"])
            elif kind == "comm_open":
                cell.comm_opens.append(content)
            elif kind == "comm_msg":
                cell.comm_msgs.append(content)
            elif kind == "error":
                cell.error = content
            elif kind == "status" and content["execution_state"] == "idle":
                cell.status = "error" if cell.error else "ok"
                return cell
            if until is not None and until(cell):
                return cell

    def run(self, code: str, timeout: float = 30) -> Cell:
        return self.collect(self.submit(code), timeout)

    def interrupt(self) -> None:
        self.manager.interrupt_kernel()

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def kernel_env(service: Service, token: str = ALICE, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUALLOC_", "JUPYTERHUB_", "CUDA_"))}
    env.update(GPUALLOC_URL=service.url, GPUALLOC_TOKEN=token, PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = Service(tmp_path_factory.mktemp("service")).start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def start_kernel(service, tmp_path_factory):
    """Start kernels for this module (shut down at its end): start_kernel(token=..., **env)."""
    started: list[Kernel] = []
    cwd = tmp_path_factory.mktemp("kernels")

    def start(token: str = ALICE, **extra: str) -> Kernel:
        started.append(Kernel(kernel_env(service, token, **extra), cwd))
        return started[-1]

    yield start
    for kernel in started:
        kernel.shutdown()


def assert_one_line_error(cell: Cell, expected: str) -> None:
    """The cell failed the way the magic should: one stderr line, no traceback, no error reply."""
    assert cell.status == "ok" and cell.error is None, cell
    assert "Traceback" not in cell.stderr + cell.stdout, cell
    lines = cell.stderr.strip().splitlines()
    assert len(lines) == 1, cell
    assert lines[0].startswith("gpu: ") and expected in lines[0], lines[0]
