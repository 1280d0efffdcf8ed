"""The job runner in the owner's Jupyter server: runs each granted job with nbclient in a fresh kernel.

Every `interval` it lists the owner's jobs submitted through this server (their `runner` is this
server: one user's named servers each run their own), heartbeats the leases of the queued and
running ones, claims (`start`) each queued job whose slice is granted, deletes the pickled inputs
of those that ended for good, and stops the local attempts the core no longer counts as running:
a preempted one gets SIGINT, SIGTERM after the job's preempt_grace, then SIGKILL; a cancelled one
is stopped at once. When its server stops, it tells the service first (`runner_gone`): its jobs
then wait for it without a slice until its heartbeats name them again. An attempt runs in
`<workdir>` under the lease's env (CUDA_VISIBLE_DEVICES and the memory caps, as a kernel slice), streams its outputs to
`.gpualloc/jobs/<id>/job.log`, saves `executed.ipynb` and reports how it ended (`finish`), which
ends the lease, whatever happened to the kernel.

`run_in_pod` is the same runner for one attempt in a Kubernetes Job's pod (`jupyter-gpualloc job
run ID`, service/job_pods.py): it claims the job as 'pod' with the job's token, runs it the same
way (the device plugin chose the pod's devices), heartbeats its lease, deletes the pickled inputs
of a job that ended for good, and on SIGTERM (its pod deleted: cancelled or preempted) passes
SIGTERM on to the kernel and stops without a report.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, DeadKernelError

from ..client import GpuAllocClient, GpuAllocError, ServiceUnavailable
from ..client import Availability
from ..core.holders import job_holder
from ..holder import Keepalive
from ..holder_lease import HolderLease
from ..lease_env import SLICE_ENV_NAMES
from ..job_folder import INPUTS_DIR, JobFolder, inside
from .notebook import job_notebook

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
CANCEL_GRACE = 2.0
SHUTDOWN_WAIT = 10.0


class LoggingNotebookClient(NotebookClient):
    """nbclient's client, also appending each output to the job's log as it arrives."""

    def __init__(self, nb, log_file, **kwargs: Any):
        super().__init__(nb, **kwargs)
        self.log_file = log_file

    def output(self, outs, msg, display_id, cell_index):
        out = super().output(outs, msg, display_id, cell_index)
        content, kind = msg["content"], msg["msg_type"]
        text = ""
        if kind == "stream":
            text = content.get("text", "")
        elif kind == "error":
            text = ANSI.sub("", "\n".join(content.get("traceback", []))) + "\n"
        elif kind in ("execute_result", "display_data"):
            text = content.get("data", {}).get("text/plain", "") + "\n"
        if text:
            self.log_file.write(text)
            self.log_file.flush()
        return out


@dataclass
class Attempt:
    """One attempt of a job running here: its lease, its kernel and its task."""

    job_id: str
    number: int
    lease: HolderLease
    km: AsyncKernelManager | None = None
    task: asyncio.Task | None = None
    stopping: str = ""  # why the runner stops it (then the core has already moved the job on)
    ready: bool = False  # its kernel answers: cells run (before, there is nothing to interrupt)
    stopper: asyncio.Task | None = field(default=None, repr=False)


class JobRunner:
    """Claims and runs the owner's jobs; `poll()` is called every `interval` seconds by the server."""

    def __init__(self, client: GpuAllocClient, *, service_url: str, mps: bool = False,
                 on_activity: Callable[[], None] | None = None, log: logging.Logger | None = None,
                 availability: Availability | None = None, visible_devices: bool = True):
        self.client = client
        self.service_url = service_url
        self.mps = mps
        self.visible_devices = visible_devices  # False in a pod: the device plugin chose its devices
        self.on_activity = on_activity
        self.log = log or logging.getLogger(__name__)
        self.availability = availability or Availability(client.url, self.log)
        self.attempts: dict[str, Attempt] = {}
        self._recovered = False
        self._cleaned: set[str] = set()  # ended jobs whose inputs are deleted
        self._unreported: dict[str, tuple[int, str, str]] = {}  # job id: (attempt, outcome, reason) to report again
        self._unreturned: dict[str, HolderLease] = {}  # leases of stopped attempts whose slices are to be returned again
        self.keepalive = Keepalive(client.heartbeat, log=self.log)  # the owner's jobs', beaten by poll()

    async def poll(self) -> None:
        """One round: recover once, heartbeat, stop what must stop, claim what may start."""
        try:
            for job_id, report in list(self._unreported.items()):
                await self._finish(job_id, *report)
            for lease in list(self._unreturned.values()):
                await self._return_slice(lease)
            mine = [j for j in await self.client.jobs() if j.get("runner", "server") == self.client.server]
            jobs = [j for j in mine if j["state"] in ("queued", "running")]
            self._delete_inputs([j for j in mine if j["state"] not in ("queued", "running")])
            if not self._recovered:
                await self._recover(jobs)
                self._recovered = True
                return  # the interrupted jobs are queued again: the next round sees them so
            self.keepalive.keep_only({job_holder(j["id"]) for j in jobs})
            if self.keepalive.kept:
                await self.keepalive.beat(strict=True)
                if self.on_activity is not None:
                    self.on_activity()
            by_id = {j["id"]: j for j in jobs}
            for attempt in list(self.attempts.values()):
                self._check(attempt, by_id.get(attempt.job_id))
            for job in jobs:
                if job["state"] == "queued" and job["position"] == 0 and job["id"] not in self.attempts:
                    await self._claim(job)
        except GpuAllocError as err:
            self.availability.failed(err)
        else:
            self.availability.answered()

    def _delete_inputs(self, ended: list[dict]) -> None:
        """Delete the pickled inputs of jobs that ended for good (once per job; the outputs stay)."""
        for job in ended:
            if job["id"] in self._cleaned:
                continue
            self._cleaned.add(job["id"])
            source = job.get("source") or {}
            if source.get("kind") != "cell" or not source.get("inputs_file"):
                continue
            try:
                path = inside(job["workdir"], source["inputs_file"])
            except ValueError:
                continue
            if path.parent == Path(job["workdir"]) / INPUTS_DIR:  # only what %%gpu job wrote there
                path.unlink(missing_ok=True)

    async def _recover(self, jobs: list[dict]) -> None:
        """Running jobs no attempt here runs belong to a runner that died: report them interrupted."""
        for job in jobs:
            if job["state"] == "running" and job["id"] not in self.attempts:
                await self._finish(job["id"], job["attempts"], "interrupted", "the server running it restarted")

    def _check(self, attempt: Attempt, job: dict | None) -> None:
        """Stop a local attempt the core has moved on from (cancelled, preempted, lease lost)."""
        if attempt.stopping or (job is not None and job["state"] == "running" and job["attempts"] == attempt.number):
            return
        if job is None:
            attempt.stopping, grace = "cancelled or ended", CANCEL_GRACE
        else:  # preempted, or its lease was lost: back in the queue
            attempt.stopping, grace = job.get("reason") or "requeued", float(job.get("preempt_grace", 60.0))
        self.log.info("gpualloc jobs: stopping job %s attempt %d (%s)", attempt.job_id, attempt.number,
                      attempt.stopping)
        attempt.stopper = asyncio.ensure_future(self._stop(attempt, grace))

    async def _claim(self, job: dict) -> None:
        try:
            job = await self.client.start_job(job["id"])
        except GpuAllocError as err:  # another runner took it, or it moved on meanwhile
            self.log.info("gpualloc jobs: job %s not started: %s", job["id"], err)
            return
        attempt = self.attempt_of(job)
        attempt.task = asyncio.ensure_future(self._run(job, attempt))
        attempt.task.add_done_callback(lambda _: self.attempts.pop(job["id"], None))

    def attempt_of(self, job: dict) -> Attempt:
        """The attempt a claimed job (`start`) begins here, holding the job's lease."""
        attempt = Attempt(job["id"], job["attempts"], HolderLease(self.client, job_holder(job["id"])))
        attempt.lease.adopt(job["lease"])
        self.attempts[job["id"]] = attempt
        return attempt

    def env_for(self, job: dict, attempt: Attempt) -> dict[str, str]:
        """The server's env, minus its own slice, plus the job lease's slice env."""
        env = {k: v for k, v in os.environ.items() if k not in SLICE_ENV_NAMES}
        env.update(attempt.lease.env(service_url=self.service_url, mps=self.mps, visible_devices=self.visible_devices))
        env["GPUALLOC_JOB_ID"] = job["id"]
        return env

    async def _run(self, job: dict, attempt: Attempt) -> str:
        """One attempt, start to report; the report ends the lease. Its outcome ('stopped' if stopped)."""
        folder = JobFolder(job["workdir"], job["id"])
        folder.path.mkdir(parents=True, exist_ok=True)
        outcome, reason = "failed", ""
        nb = None
        with folder.log.open("a", encoding="utf-8") as log_file:
            log_file.write(f"--- attempt {attempt.number} of job {job['id']} ({job['name']}) on "
                           f"{self._slice_text(job['slice'])} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            log_file.flush()
            try:
                nb = job_notebook(job)
                await self._execute(job, nb, attempt, log_file)
                outcome, reason = "succeeded", "all cells ran"
            except asyncio.TimeoutError:
                outcome, reason = "timed_out", f"still running after {job['timeout']:g} s"
            except CellExecutionError as err:
                reason = f"{err.ename}: {err.evalue}" if getattr(err, "ename", "") else str(err).splitlines()[0]
            except DeadKernelError:
                reason = "the kernel died"
            except Exception as err:  # whatever broke, the attempt is reported and its lease ends
                reason = f"{type(err).__name__}: {err}"
            except asyncio.CancelledError:
                if not attempt.stopping:
                    raise
            finally:
                await self._shutdown(attempt)
            if attempt.stopping:
                log_file.write(f"--- attempt {attempt.number} stopped: {attempt.stopping}\n")
            else:
                log_file.write(f"--- attempt {attempt.number} {outcome.replace('_', ' ')}: {reason}\n")
        if nb is not None:
            nbformat.write(nb, folder.executed)
        if not attempt.stopping:
            await self._finish(job["id"], attempt.number, outcome, reason)
            return outcome
        if self.visible_devices:  # in a pod, the pod's end returns the slice
            await self._return_slice(attempt.lease)
        return "stopped"

    def _slice_text(self, slice_: dict) -> str:
        """The slice as the log names it: its devices here; in a pod, where the device plugin chose
        them, its shape and node."""
        if self.visible_devices:
            return slice_["visible_devices"]
        shape = slice_.get("profile") or (f"{slice_['memory_mib']} MiB share" if slice_["kind"] == "shared"
                                          else f"{len(slice_['gpu_uuids'])} whole GPU")
        return f"{slice_['kind']} {shape} of {slice_.get('model') or 'a GPU'} on node {slice_['node']}"

    async def _return_slice(self, lease: HolderLease) -> None:
        """A stopped attempt's kernel is gone: its ended lease's slice may go to someone else now
        (told again at the next rounds while the service cannot take it)."""
        lease_id = lease.lease_id
        self._unreturned.pop(lease_id, None)
        try:
            if await lease.release(gone=True) is None:  # already returned (its heartbeats stopped, a restart found it gone)
                self.log.info("gpualloc jobs: the slice of lease %s was returned already", lease_id)
        except ServiceUnavailable:
            self._unreturned[lease_id] = lease
        except GpuAllocError as err:
            self.log.info("gpualloc jobs: the slice of lease %s was not returned: %s", lease_id, err)

    async def _execute(self, job: dict, nb, attempt: Attempt, log_file) -> None:
        km = AsyncKernelManager(kernel_name=job["kernel_name"])
        attempt.km = km
        await km.start_kernel(env=self.env_for(job, attempt), cwd=job["workdir"])
        client = LoggingNotebookClient(nb, log_file, km=km, kernel_name=job["kernel_name"], timeout=None,
                                       resources={"metadata": {"path": job["workdir"]}})
        await client.async_start_new_kernel_client()
        attempt.ready = True
        try:
            client.reset_execution_trackers()
            cells = asyncio.ensure_future(self._execute_cells(client, nb))
            try:
                done, _ = await asyncio.wait([cells], timeout=job.get("timeout"))
            finally:
                if not cells.done():
                    cells.cancel()  # nbclient turns this into DeadKernelError: the timeout is told apart here
                    await asyncio.gather(cells, return_exceptions=True)
            if not done:
                raise asyncio.TimeoutError
            cells.result()
        finally:
            client.kc.stop_channels()

    @staticmethod
    async def _execute_cells(client: NotebookClient, nb) -> None:
        """Every cell in order; the attempt's timeout counts from the first (not from the kernel's start)."""
        for index, cell in enumerate(nb.cells):
            await client.async_execute_cell(cell, index, execution_count=client.code_cells_executed + 1)

    async def _shutdown(self, attempt: Attempt) -> None:
        """End the attempt's kernel. One that never became ready is killed first: jupyter_client's
        shutdown interrupts before it kills, and a kernel still starting prints KeyboardInterrupt's
        traceback into the server's log."""
        km = attempt.km
        if km is not None and km.has_kernel:
            try:
                if not attempt.ready:
                    await km.signal_kernel(signal.SIGKILL)
                await asyncio.wait_for(km.shutdown_kernel(now=True), SHUTDOWN_WAIT)
            except (asyncio.TimeoutError, RuntimeError, OSError) as err:
                self.log.warning("gpualloc jobs: kernel of job %s did not shut down cleanly: %s", attempt.job_id, err)

    async def _stop(self, attempt: Attempt, grace: float) -> None:
        """SIGINT, then SIGTERM after `grace`, then SIGKILL after `grace` again. A kernel still starting
        has no cell to interrupt: its start is given up (the attempt's end shuts the kernel down)."""
        task = attempt.task
        if task is not None and not task.done() and not attempt.ready:
            task.cancel()
            await asyncio.wait([task], timeout=SHUTDOWN_WAIT)
            return
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            km = attempt.km
            if task is None or task.done():
                return
            if km is not None and km.has_kernel:
                try:
                    await km.signal_kernel(sig)
                except (RuntimeError, OSError, ProcessLookupError) as err:
                    self.log.info("gpualloc jobs: signal %s to job %s: %s", sig.name, attempt.job_id, err)
            if sig is signal.SIGKILL:
                break
            await asyncio.wait([task], timeout=grace)
        if task is not None and not task.done():
            task.cancel()

    async def _finish(self, job_id: str, attempt: int, outcome: str, reason: str) -> None:
        """Report an attempt's end; one the service could not take now (503, unreachable) is reported
        again at the next rounds, so its job does not stay running with its slice held."""
        again = self._unreported.pop(job_id, None) is not None
        try:
            await self.client.finish_job(job_id, attempt, outcome, reason)
        except ServiceUnavailable as err:
            self._unreported[job_id] = (attempt, outcome, reason)
            if not again:
                self.log.warning("gpualloc jobs: cannot report job %s (%s) yet: %s", job_id, outcome, err)
        except GpuAllocError as err:  # the core has moved the job on
            self.log.warning("gpualloc jobs: cannot report job %s (%s): %s", job_id, outcome, err)

    async def close(self, report: Callable[[str, int, str, str], None] | None = None) -> None:
        """Server shutdown: stop every attempt at once; their jobs are requeued or failed by policy.

        `report(job_id, attempt, outcome, reason)` reports them where the API is no longer served
        (embedded mode: the server stopped listening, the core is in-process and stops with it),
        reports still owed included; None: through the client, after telling the service that this
        runner stops, so that its jobs, the requeued ones included, wait for it instead of taking
        slices nothing would use.
        """
        if report is None:
            try:
                await self.client.runner_gone()
            except GpuAllocError as err:  # they wait for it once their heartbeats stop for the TTL
                self.log.warning("gpualloc jobs: cannot tell the allocator that this server's runner stops: %s", err)
        else:
            for job_id, owed in list(self._unreported.items()):
                report(job_id, *owed)
            self._unreported.clear()
        for attempt in list(self.attempts.values()):
            attempt.stopping = "the server stopped"
            interrupted = (attempt.job_id, attempt.number, "interrupted", "the server running it stopped")
            if report is None:
                await self._finish(*interrupted)
            else:
                report(*interrupted)
            await self._stop(attempt, 0.5)
        tasks = [a.task for a in self.attempts.values() if a.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT)


async def run_in_pod(client: GpuAllocClient, job_id: str, *, heartbeat_interval: float = 15.0,
                     log: logging.Logger | None = None) -> int:
    """One attempt of job `job_id` in its Kubernetes Job's pod; the exit status (0: succeeded)."""
    log = log or logging.getLogger(__name__)
    runner = JobRunner(client, service_url=client.url, visible_devices=False, log=log)
    job = await client.start_job(job_id, runner="pod")
    attempt = runner.attempt_of(job)
    attempt.task = asyncio.ensure_future(runner._run(job, attempt))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: _terminate(runner, attempt))
    # the job's token names its holder: the heartbeat carries none
    keepalive = Keepalive(lambda holders: client.heartbeat(), heartbeat_interval, log=log, what=f"gpualloc jobs: job {job_id}")
    attempt.lease.keepalive(keepalive)
    try:
        await asyncio.wait([attempt.task])
        outcome = attempt.task.result()
    finally:
        keepalive.stop()
        loop.remove_signal_handler(signal.SIGTERM)
    if outcome != "stopped":  # a job that ended for good (no retry queued) has its pickled inputs deleted
        try:
            ended = (await client.job(job_id))["state"] not in ("queued", "running")
        except GpuAllocError:  # its token ended with the job
            ended = True
        if ended:
            runner._delete_inputs([job])
    log.info("gpualloc jobs: job %s attempt %d: %s", job_id, attempt.number, outcome)
    return 0 if outcome == "succeeded" else 1


def _terminate(runner: JobRunner, attempt: Attempt) -> None:
    """The pod is being deleted (cancel, preemption): SIGTERM to the kernel; the kubelet kills the
    rest after the pod's grace period."""
    if attempt.stopping:
        return
    attempt.stopping = "its pod was stopped (cancelled or preempted)"
    runner.log.info("gpualloc jobs: job %s attempt %d: SIGTERM, passing it on to the kernel",
                    attempt.job_id, attempt.number)

    async def signal_kernel() -> None:
        if attempt.km is None or not attempt.km.has_kernel:  # no kernel yet: nothing of the job ran
            if attempt.task is not None:
                attempt.task.cancel()
            return
        try:
            await attempt.km.signal_kernel(signal.SIGTERM)
        except (RuntimeError, OSError, ProcessLookupError) as err:
            runner.log.info("gpualloc jobs: SIGTERM to job %s: %s", attempt.job_id, err)

    attempt.stopper = asyncio.ensure_future(signal_kernel())
