"""A real Jupyter server with the extension in embedded mode (simulated fleet), its job runner polling fast."""

from __future__ import annotations

import pytest

from tests.server.conftest import extension_config, gpu_kernelspecs, gpualloc, wait_for  # noqa: F401 (fixtures)

PREEMPT_GRACE = 1.0


@pytest.fixture
def jp_server_config(tmp_path):
    return extension_config(tmp_path, GpuAllocExtension={"job_poll_interval": 0.2},
                            SchedulerPolicy={"preempt_grace": PREEMPT_GRACE})


@pytest.fixture
def workdir(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    return folder


@pytest.fixture
def jobs_client(gpualloc, jp_asyncio_loop):
    """The extension's own client of the embedded API (the server's token), the runner stopped at the end."""
    yield gpualloc.client
    jp_asyncio_loop.run_until_complete(gpualloc.runner.close())


async def job_ends(client, job_id: str, timeout: float = 60.0) -> dict:
    """Await the job's end; its final JSON."""
    async def ended():
        job = await client.job(job_id)
        return job if job["state"] not in ("queued", "running") else None
    return await wait_for(ended, timeout, interval=0.2)


def sleeps_on_first_attempt(marker: str, says: str, seconds: int) -> str:
    """A job cell that counts its attempts in the file `marker`, prints `<says> <n>`, and sleeps on the first."""
    return f"""
import pathlib, time
marker = pathlib.Path({marker!r})
n = int(marker.read_text()) + 1 if marker.exists() else 1
marker.write_text(str(n))
print({says!r}, n, flush=True)
if n == 1:
    time.sleep({seconds})
"""


def cell_job(workdir, code: str, spec=None, **extra) -> dict:
    return {"spec": spec or {"kind": "shared", "memory_gib": 4, "model": "L4"}, "workdir": str(workdir),
            "source": {"kind": "cell", "code": code, **extra.pop("source", {})}, **extra}


@pytest.fixture
def notebook_kernel(jp_serverapp, gpualloc, workdir, jp_asyncio_loop):
    """A kernel started by the server in `workdir` (the notebook's directory), %gpu loaded; run(code) -> (out, err)."""
    km = jp_serverapp.kernel_manager
    kernel_id = jp_asyncio_loop.run_until_complete(km.start_kernel(path=str(workdir)))
    kc = km.get_kernel(kernel_id).client()
    kc.start_channels()
    jp_asyncio_loop.run_until_complete(kc.wait_for_ready(timeout=60))

    async def run(code: str, timeout: float = 60.0) -> tuple[str, str]:
        out: list[str] = []
        err: list[str] = []

        def hook(msg):
            content = msg["content"]
            if msg["msg_type"] == "stream":
                (out if content["name"] == "stdout" else err).append(content["text"])
            elif msg["msg_type"] == "error":
                err.append("\n".join(content["traceback"]))
            elif msg["msg_type"] in ("display_data", "execute_result"):
                out.append(content["data"].get("text/plain", "") + "\n")

        await kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        return "".join(out), "".join(err)

    yield run
    kc.stop_channels()
    jp_asyncio_loop.run_until_complete(km.shutdown_kernel(kernel_id, now=True))
