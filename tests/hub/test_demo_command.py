"""`make demo` (`jupyter-gpualloc demo`): listens where GPUALLOC_DEMO_PORT says, and stopping it
stops the servers it started."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil

from tests.hubfixture import FAKE_SERVER

from .conftest import DemoHub


def test_the_demo_listens_on_its_port_and_stops_its_servers(tmp_path):
    fake = tmp_path / "fake_server.py"  # a light stand-in for jupyterhub-singleuser
    fake.write_text(FAKE_SERVER)
    hub = DemoHub(tmp_path, command=[str(Path(sys.executable).parent / "jupyter-gpualloc"), "demo"],
                  extra_config=f"c.Spawner.cmd = [{sys.executable!r}, {str(fake)!r}, {str(tmp_path)!r}]\n")
    hub.start()  # waits for http://127.0.0.1:<GPUALLOC_DEMO_PORT>/hub/api/
    try:
        reply = hub.api("POST", "/users/alice/server", {"user_options": {"gpu": "none"}}, token=hub.token("alice"))
        assert reply.status_code in (201, 202), reply.text
        server = psutil.Process(hub.wait_ready("alice")["state"]["pid"])
    finally:
        hub.stop()
    try:
        deadline = time.monotonic() + 10
        while running(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not running(server), "the demo left alice's server running"
    finally:
        hub.kill_servers()


def running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
