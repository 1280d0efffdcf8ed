"""Spawners for one machine: each server is a local process on its GPU slice.

- `GPULocalProcessSpawner`: JupyterHub's LocalProcessSpawner (one OS user per hub user).
- `GPUSameUserSpawner`: every server runs as the hub's own OS user, each with its own home
  under `home_dir_template` (like JupyterHub's SimpleLocalProcessSpawner): for demos and tests,
  never for production (users are not isolated from each other).

Both end what a server started (its kernels, terminals, jobs) when the server ends, before the
server counts as stopped: a kernel the server left behind would keep the GPU's
CUDA_VISIBLE_DEVICES while the slice went to someone else.
"""

from __future__ import annotations

import asyncio
import time

import psutil
from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner

from .mixin import GPUSpawnerMixin


def still_running(process: psutil.Process) -> bool:
    """Whether the process still runs (a zombie, waiting for its parent to reap it, does not)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def end_processes(processes: list[psutil.Process], term_timeout: float, kill_timeout: float) -> list[psutil.Process]:
    """SIGTERM, then SIGKILL what is left after `term_timeout` seconds; those still running after
    `kill_timeout` more (none, unless the kernel cannot end them)."""
    for signal_them, timeout in ((psutil.Process.terminate, term_timeout), (psutil.Process.kill, kill_timeout)):
        processes = [p for p in processes if still_running(p)]
        for process in processes:
            try:
                signal_them(process)
            except psutil.Error:
                pass
        deadline = time.monotonic() + timeout
        while processes and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            processes = [p for p in processes if still_running(p)]
        if not processes:
            break
    return processes


class EndsProcessTree(LocalProcessSpawner):
    """poll() reports a server stopped only once the processes it started have ended too.

    While the server runs, each poll notes its descendants; once it has ended (stopped, or died
    on its own), those still running get SIGTERM, then SIGKILL.
    """

    def _note_descendants(self) -> None:
        if not self.pid:
            return
        try:
            descendants = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return
        known = {p.pid: p for p in getattr(self, "_gpu_descendants", [])}
        known.update({p.pid: p for p in descendants})
        self._gpu_descendants = [p for p in known.values() if still_running(p)]

    async def _end_descendants(self) -> None:
        left = [p for p in getattr(self, "_gpu_descendants", []) if still_running(p)]
        if left:
            self.log.warning("%s: ending %d process(es) the server left running: %s", self._log_name, len(left),
                             ", ".join(str(p.pid) for p in left))
            left = await end_processes(left, self.term_timeout, self.kill_timeout)
            for process in left:
                self.log.error("%s: process %d does not end", self._log_name, process.pid)
        self._gpu_descendants = left

    async def poll(self):
        self._note_descendants()
        status = await super().poll()
        if status is not None:
            await self._end_descendants()
            if getattr(self, "_gpu_descendants", []):
                return None  # still running, as far as its GPU goes
        return status

    async def stop(self, now: bool = False):
        self._note_descendants()
        await super().stop(now=now)
        await self._end_descendants()


class GPULocalProcessSpawner(GPUSpawnerMixin, EndsProcessTree, LocalProcessSpawner):
    """LocalProcessSpawner whose servers run on GPU slices from the scheduler service."""


class GPUSameUserSpawner(GPUSpawnerMixin, EndsProcessTree, SimpleLocalProcessSpawner):
    """Demo spawner: servers on GPU slices, all run as the hub's OS user, one home each."""
