"""An in-process Jupyter server with the extension in embedded mode over a simulated fleet, real ipykernels."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jupyter_gpualloc.server.kernelspecs import kernelspecs_for_offers


FLEET = Path(__file__).with_name("fleet.yaml")
OFFERS = [
    {"name": "mig-1g.5gb", "label": "MIG 1g.5gb", "spec": {"kind": "mig", "profile": "1g.5gb"}},
    {"name": "whole-a100", "label": "Whole A100", "spec": {"kind": "mig", "profile": "7g.40gb"}},
    {"name": "shared-8gb", "label": "Shared 8 GiB", "spec": {"kind": "shared", "memory_gib": 8, "model": "L4"}},
]
MIG_KERNEL, BIG_KERNEL, SHARED_KERNEL = ("gpualloc-" + o["name"] for o in OFFERS)


def extension_config(tmp_path: Path, **overrides) -> dict:
    ext = {"mode": "embedded", "fleet": str(FLEET), "process_dir": str(tmp_path / "gpu-processes"),
           "db_url": f"sqlite:///{tmp_path / 'gpualloc.sqlite'}", "report_interval": 0.3,
           "tick_interval": 0.2, "kernel_wait_timeout": 2.0}
    ext.update(overrides.pop("GpuAllocExtension", {}))
    config = {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpualloc.server": True}},
        "GpuAllocExtension": ext,
        "SchedulerPolicy": {"offers": OFFERS, "heartbeat_ttl": 30.0},
        "Watchdog": {"interval": 0.3, "grace": 1.0, "action": "report"},
    }
    for section, values in overrides.items():
        config.setdefault(section, {}).update(values)
    return config


@pytest.fixture
def jp_server_config(tmp_path):
    return extension_config(tmp_path)


@pytest.fixture
def gpu_kernelspecs(jp_kernel_dir):
    """The offers' kernelspecs in the test's data dir (as gpu_kernelspecs would install them)."""
    for name, spec in kernelspecs_for_offers(OFFERS).items():
        (jp_kernel_dir / name).mkdir(parents=True)
        (jp_kernel_dir / name / "kernel.json").write_text(json.dumps(spec))
    return sorted(kernelspecs_for_offers(OFFERS))


@pytest.fixture
def gpualloc(jp_serverapp, http_server_client, gpu_kernelspecs, jp_asyncio_loop):
    """The started extension (its periodic tasks running) on a listening server."""
    jp_asyncio_loop.run_until_complete(jp_serverapp.extension_manager.start_all_extensions())
    ext = jp_serverapp.extension_manager.extensions["jupyter_gpualloc.server"].extension_points["gpualloc"].app
    return ext


@pytest.fixture
def events(gpualloc):
    """Every gpualloc event emitted, as (type, data)."""
    seen: list[tuple[str, dict]] = []

    async def listener(event_type: str, data: dict) -> None:
        seen.append((event_type, data))

    remove = gpualloc.events.add_listener(listener)
    yield seen
    remove()


def kernel_env(km, kernel_id: str) -> dict[str, str]:
    """The environment the kernel's process really runs with."""
    pid = km.get_kernel(kernel_id).provisioner.pid
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


async def wait_for(predicate, timeout: float = 10.0, interval: float = 0.1):
    """Await until predicate() is truthy (it may be async); its value, or AssertionError on timeout."""
    import asyncio
    import inspect

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")
        await asyncio.sleep(interval)
