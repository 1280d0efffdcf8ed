"""Background jobs: their records and state machine, over `job:<id>` leases in the scheduler's one queue.

A job holds one lease per attempt, of priority class `batch` unless policy allows interactive
jobs, so interactive requests go first and quotas, fair share, reservations and preemption
count jobs like any other holder. The job is `queued` until its lease is granted and the runner
of the server that submitted it claims it (`start`); the runner reports the attempt's end
(`finish`). A lease that ends under a running job (preempted, expired for want of heartbeats)
sends the job back to the queue, or fails it when it was interrupted and `requeue_interrupted`
is off. Queued jobs without a lease get one at the next `tick`. Every change is stored before its
event is announced, and a change the store refuses is undone (StoreFailed); time is passed in.

A holder that cannot run is not granted: a job whose server has stopped (its runner said so,
`runner_gone`, or stopped heartbeating it for the heartbeat TTL) waits for that server
(`waiting_for_runner`, stored) without a lease, so it takes no slice and no quota slot, with a
reason that says to start the server; once its runner heartbeats it again (`runner_seen`) it
queues a lease. Jobs run in Kubernetes Jobs of their own (runner 'pod') never wait so.
"""

from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Sequence

from .model import (NAME_MAX_LENGTH, UNPRINTABLE, Event, Job, JobState, Lease, LeaseState, PriorityClass, SliceSpec,
                    SpecError)
from .errors import HolderBusy, NotFound, SchedulerError, StoreFailed
from .holders import SERVER, SERVER_GRAMMAR, is_server, job_of
from .journal import ChangeJournal, refused, unreadable
from .scheduler import NO_HEARTBEAT, Scheduler
from .store import StoreError

OUTCOMES = ("succeeded", "failed", "timed_out", "interrupted")
POD_RUNNER = "pod"  # the runner of a job run in Kubernetes Jobs of its own
REQUEST_FIELDS = {"name", "spec", "priority", "preemptible", "source", "workdir", "kernel_name", "timeout", "retries",
                  "runner"}
MAX_RETRIES = 100
LEASE_ENDINGS = {f"lease.{state.value}" for state in LeaseState if not state.active}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The paths of a job, as the user names them. A component is neither empty, `.` nor `..`, so a
# path is already normalised and never climbs out of where it starts; the files under `workdir`
# (source.path, inputs_file) are relative to it and stay inside it. The OpenAPI document uses the
# same patterns.
PATH_SEGMENT = f"(?:[^/.{UNPRINTABLE}]|\\.[^/.{UNPRINTABLE}]|\\.\\.[^/{UNPRINTABLE}])[^/{UNPRINTABLE}]*"
WORKDIR_PATTERN = f"^(?:/{PATH_SEGMENT})+$"
INSIDE_WORKDIR_PATTERN = f"^{PATH_SEGMENT}(?:/{PATH_SEGMENT})*$"
SYSTEM_DIRS_PATTERN = "^/(?:proc|sys|dev)(?:/|$)"  # the kernel's own file systems: never a job's folder
WORKDIR_RULE = ("must be a normalised absolute path (no empty, '.' or '..' component) outside /proc, /sys and /dev, "
                "without control or invisible formatting characters")
INSIDE_WORKDIR_RULE = ("must be a normalised path relative to workdir (no empty, '.' or '..' component), "
                       "without control or invisible formatting characters")


class JobConflict(SchedulerError):
    """The job's state does not allow this (e.g. cancelling a finished job)."""

    def __init__(self, job: Job, message: str):
        super().__init__(message)
        self.state = job.state.value


@dataclass(frozen=True)
class JobRequest:
    """What a user asks to run, validated: the slice, the source and the limits."""

    name: str
    spec: SliceSpec
    priority: PriorityClass
    preemptible: bool | None
    source: dict[str, Any]
    workdir: str
    kernel_name: str
    timeout: float | None
    retries: int
    runner: str = "server"

    @classmethod
    def from_json(cls, data: Any) -> "JobRequest":
        """Parse the REST API's job object strictly; raise SpecError naming the field."""
        if not isinstance(data, dict):
            raise SpecError("body", "must be an object")
        for key in data:
            if key not in REQUEST_FIELDS:
                raise SpecError(key, "unknown field")
        if "spec" not in data:
            raise SpecError("spec", "is required")
        spec = SliceSpec.from_json(data["spec"])
        try:
            priority = PriorityClass(data.get("priority", "batch"))
        except ValueError:
            raise SpecError("priority", "must be 'batch' or 'interactive'") from None
        preemptible = data.get("preemptible")
        if preemptible is not None and not isinstance(preemptible, bool):
            raise SpecError("preemptible", "must be true or false")
        workdir = data.get("workdir")
        if not isinstance(workdir, str) or len(workdir) > 4096 or not re.fullmatch(WORKDIR_PATTERN, workdir) \
                or re.match(SYSTEM_DIRS_PATTERN, workdir):
            raise SpecError("workdir", WORKDIR_RULE)
        source = _source(data.get("source"))
        name = data.get("name") or (source.get("path") or "cell")
        if not isinstance(name, str) or len(name) > 200:
            raise SpecError("name", "must be a string of at most 200 characters")
        kernel_name = data.get("kernel_name", "python3")
        if not isinstance(kernel_name, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", kernel_name):
            raise SpecError("kernel_name", "must be a kernelspec name")
        timeout = data.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not math.isfinite(timeout) or timeout <= 0):
            raise SpecError("timeout", "must be a positive number of seconds")
        retries = data.get("retries", 0)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
            raise SpecError("retries", f"must be an integer from 0 to {MAX_RETRIES}")
        runner = data.get("runner", SERVER)
        if not isinstance(runner, str) or len(runner) > NAME_MAX_LENGTH or not is_server(runner) \
                or not (runner == SERVER or runner.partition(":")[2].strip()):
            raise SpecError("runner", f"must be {SERVER_GRAMMAR} (the server that runs the job)")
        return cls(name, spec, priority, preemptible, source, workdir, kernel_name,
                   float(timeout) if timeout is not None else None, retries, runner)


def waiting_reason(runner: str) -> str:
    """Why a job whose server has stopped waits, in the words its owner reads."""
    name = runner.partition(":")[2]
    server = f"your server '{name}'" if name else "your server"
    return f"waiting for {server} to run it: start {server} again"


def _source(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise SpecError("source", "must be an object with kind 'cell' or 'notebook'")
    kind = data.get("kind")
    allowed = {"cell": {"kind", "code", "inputs", "outputs", "inputs_file"},
               "notebook": {"kind", "path", "parameters"}}.get(kind)
    if allowed is None:
        raise SpecError("source.kind", "must be 'cell' or 'notebook'")
    for key in data:
        if key not in allowed:
            raise SpecError(f"source.{key}", "unknown field")
    if kind == "notebook":
        path = data.get("path")
        if not isinstance(path, str) or not path.endswith(".ipynb"):
            raise SpecError("source.path", "must be the path of an .ipynb file")
        if not re.fullmatch(INSIDE_WORKDIR_PATTERN, path):
            raise SpecError("source.path", INSIDE_WORKDIR_RULE)
        parameters = data.get("parameters", {})
        if not isinstance(parameters, dict) or not all(_IDENTIFIER.fullmatch(k) for k in parameters):
            raise SpecError("source.parameters", "must map Python identifiers to JSON values")
        return {"kind": kind, "path": path, "parameters": parameters}
    code = data.get("code")
    if not isinstance(code, str) or not code.strip():
        raise SpecError("source.code", "must be the cell's code")
    names = {}
    for part in ("inputs", "outputs"):
        value = data.get(part, [])
        if not isinstance(value, list) or not all(isinstance(n, str) and _IDENTIFIER.fullmatch(n) for n in value):
            raise SpecError(f"source.{part}", "must be a list of variable names")
        names[part] = value
    inputs_file = data.get("inputs_file")
    if names["inputs"] and not isinstance(inputs_file, str):
        raise SpecError("source.inputs_file", "is required with inputs")
    if inputs_file is not None and (not isinstance(inputs_file, str)
                                    or not re.fullmatch(INSIDE_WORKDIR_PATTERN, inputs_file)):
        raise SpecError("source.inputs_file", INSIDE_WORKDIR_RULE)
    return {"kind": kind, "code": code, **names, "inputs_file": inputs_file}


class Jobs:
    """Every job of the scheduler's users: submit, claim, finish, cancel, rerun, and requeue."""

    def __init__(self, scheduler: Scheduler, *, now: float, listeners: Sequence[Callable[[Event], None]] = ()):
        """Load the queued and running jobs and reconcile them with their leases."""
        self.scheduler = scheduler
        self.store = scheduler.store
        self.policy = scheduler.policy
        self._jobs: dict[str, Job] = {j.id: j for j in self.store.load_jobs(active_only=True)}
        self._journal: ChangeJournal[Job] = ChangeJournal(self._write, self._put_back, listeners)
        self._new_leases: list[tuple[str, float]] = []  # leases queued for a change not yet stored, and when
        self._waiting: set[str] = {j.id for j in self._jobs.values() if j.waiting_for_runner}  # as stored
        scheduler.subscribe(self._on_lease_event)
        self.tick(now, reason="its lease ended while the scheduler was stopped")

    # ----------------------------------------------------------------- events
    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call `listener` with every job event after it is stored; returns an unsubscribe function."""
        return self._journal.listeners.subscribe(listener)

    def _emit(self, type_: str, now: float, job: Job, **data: Any) -> None:
        data.update(job_id=job.id, name=job.name, state=job.state.value, attempt=job.attempts,
                    priority=job.priority.value)
        self._journal.events.append(Event(type_, now, job.lease_id, job.user, data))

    def _record(self, job: Job) -> None:
        """Note a job about to change: stored with the change, put back if that fails."""
        self._journal.record(job, known=job.id in self._jobs)

    def _atomic(self) -> ContextManager[None]:
        """One change, stored at its end, then announced; undone entirely if anything fails (StoreFailed:
        the store refused). A change made inside another (a lease event during a submit) is part of it."""
        return self._journal.change()

    def _write(self, changed: list[Job]) -> None:
        """Write every job changed since the last change was stored."""
        if changed:
            try:
                self.store.save_jobs(changed)
            except StoreError as err:
                raise refused(err, "the job change") from err
        for job in changed:
            if not job.state.active:
                self._jobs.pop(job.id, None)
            if job.state.active and job.waiting_for_runner:
                self._waiting.add(job.id)
            else:
                self._waiting.discard(job.id)
        self._new_leases.clear()

    def _put_back(self, restored: list[tuple[Job, Job | None, Any]]) -> None:
        """The changed jobs are back as stored: index them so; withdraw the leases queued for them."""
        for job, before, _ in restored:
            if before is None:
                self._jobs.pop(job.id, None)
            else:
                self._jobs[job.id] = job
        leases, self._new_leases = self._new_leases, []
        for lease_id, now in leases:
            self._release(lease_id, now, "its job was not stored", holder_gone=True)  # nothing ran on it

    # ------------------------------------------------------------------ reads
    def job(self, job_id: str) -> Job:
        """An active job, or an ended one from the store (StoreFailed if it cannot be read)."""
        job = self._jobs.get(job_id)
        if job is None:
            try:
                job = self.store.load_job(job_id)
            except StoreError as err:
                raise unreadable(err) from err
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    def jobs(self, user: str | None = None, limit: int = 500) -> list[Job]:
        """Jobs of one user or all, newest first (active ones as they are now); StoreFailed if unreadable."""
        try:
            stored = self.store.load_jobs(user=user, limit=limit)
        except StoreError as err:
            raise unreadable(err) from err
        return [self._jobs.get(j.id, j) for j in stored]

    def active(self) -> list[Job]:
        """The queued and running jobs, from memory."""
        return list(self._jobs.values())

    def active_job(self, job_id: str) -> Job | None:
        """A queued or running job, from memory; None for any other id."""
        return self._jobs.get(job_id)

    def _lease(self, job: Job) -> Lease | None:
        """The job's active lease, if it has one."""
        if job.lease_id is None:
            return None
        try:
            lease = self.scheduler.lease(job.lease_id)
        except NotFound:
            return None
        return lease if lease.state.active else None

    def view(self, job: Job, now: float) -> dict[str, Any]:
        """The job as the API shows it: its record, queue position (0: its slice is ready), lease and runtime;
        a queued job's reason is why its lease waits (a quota, a reservation, no fitting GPU)."""
        data = job.to_json()
        del data["pod"], data["token_sha256"]
        lease = self._lease(job) if job.state.active else None
        position = None
        if job.state is JobState.QUEUED and lease is not None:
            position = 0 if lease.state is LeaseState.GRANTED else self.scheduler.position(lease.id)
        data["position"] = position
        if position and lease.reason and not job.reason:  # why it waits: the core's reason for its lease
            data["reason"] = lease.reason
        data["lease"] = lease.to_json() if lease is not None else None
        data["slice"] = lease.slice.to_json() if lease is not None and lease.slice else None
        end = now if job.state is JobState.RUNNING else job.ended_at
        data["runtime_s"] = max(0.0, end - job.started_at) if job.started_at is not None and end else None
        data["preempt_grace"] = self.policy.preempt_grace
        return data

    # ------------------------------------------------------------------- API
    def submit(self, user: str, request: JobRequest, *, now: float, groups: Sequence[str] = (),
               rerun_of: str | None = None, pod: dict[str, Any] | None = None) -> Job:
        """Record a job and queue its lease; a request that can never be granted raises and records nothing.

        With `pod` (the submitting server's pod template) the job runs in Kubernetes Jobs (runner 'pod')."""
        if request.priority is PriorityClass.INTERACTIVE and not self.policy.interactive_jobs:
            raise SpecError("priority", "jobs run in the batch class here (policy: interactive_jobs is off)")
        if request.retries > self.policy.max_job_retries:
            raise SpecError("retries", f"a job may be retried at most {self.policy.max_job_retries} times here")
        preemptible = request.preemptible
        if preemptible is None:
            preemptible = request.priority is PriorityClass.BATCH and self.policy.batch_preemptible
        job = Job(id=secrets.token_hex(6), user=user, name=request.name, spec=request.spec,
                  priority=request.priority, preemptible=preemptible, source=request.source,
                  workdir=request.workdir, kernel_name=request.kernel_name, state=JobState.QUEUED,
                  created_at=now, groups=tuple(groups), timeout=request.timeout, retries=request.retries,
                  rerun_of=rerun_of, runner=POD_RUNNER if pod is not None else request.runner, pod=pod)
        with self._atomic():
            self._record(job)
            if self._runner_waited_for(user, job.runner):  # e.g. a rerun of a stopped server's job
                job.waiting_for_runner, job.reason = True, waiting_reason(job.runner)
            else:
                job.lease_id = self._submit_lease(job, now).id
            self._jobs[job.id] = job
            self._emit("job.queued", now, job, position=self.scheduler.position(job.lease_id) if job.lease_id else None)
        return job

    def _runner_waited_for(self, user: str, runner: str) -> bool:
        """Whether jobs of `user` wait for `runner` (a server that stopped): O(jobs waiting)."""
        return any(j.user == user and j.runner == runner for j in map(self._jobs.get, self._waiting) if j)

    def _submit_lease(self, job: Job, now: float) -> Lease:
        """Queue the job's lease (or find the one it still has, when storing its id failed)."""
        try:
            lease = self.scheduler.submit(job.user, job.holder, job.spec, job.priority, now=now, groups=job.groups,
                                          preemptible=job.preemptible, wait=True)
        except HolderBusy as err:
            return self.scheduler.lease(err.lease_id)
        self._new_leases.append((lease.id, now))
        return lease

    def rerun(self, job_id: str, *, now: float) -> Job:
        """A new job with the same request as a finished one, on the same server."""
        old = self.job(job_id)
        if old.state.active:
            raise JobConflict(old, f"job {job_id} is still {old.state.value}")
        if old.source.get("inputs"):
            raise JobConflict(old, f"job {job_id}'s pickled inputs were deleted when it ended: run its cell again")
        runner = SERVER if old.runner == POD_RUNNER else old.runner
        request = JobRequest(old.name, old.spec, old.priority, old.preemptible, old.source, old.workdir,
                             old.kernel_name, old.timeout, old.retries, runner)
        return self.submit(old.user, request, now=now, groups=old.groups, rerun_of=old.id, pod=old.pod)

    def set_token(self, job_id: str, token_sha256: str) -> Job:
        """Store the SHA-256 of the token the job's pod runner calls with (a new one for each pod)."""
        job = self.job(job_id)
        with self._atomic():
            self._record(job)
            job.token_sha256 = token_sha256
        return job

    def start(self, job_id: str, *, now: float, runner: str = "server") -> Job:
        """The runner of the job's server claims it, queued with its slice granted: running, one attempt more."""
        job = self.job(job_id)
        lease = self._lease(job)
        if job.runner != runner:
            raise JobConflict(job, f"job {job_id} runs in {job.runner}, not in {runner}")
        if job.state is not JobState.QUEUED or lease is None or lease.state is not LeaseState.GRANTED:
            raise JobConflict(job, f"job {job_id} is {job.state.value}, not queued with its slice granted")
        with self._atomic():
            self._record(job)
            job.state = JobState.RUNNING
            job.attempts += 1
            job.started_at = now
            job.reason = ""
            self._emit("job.started", now, job, waited_s=now - job.created_at, slice=lease.slice.to_json())
        self.scheduler.heartbeat(job.user, [job.holder], now=now)
        return job

    def finish(self, job_id: str, attempt: int, outcome: str, reason: str = "", *, now: float) -> Job:
        """The runner reports how attempt `attempt` ended; the job moves on (stored first), then its lease ends."""
        if outcome not in OUTCOMES:
            raise SpecError("outcome", f"must be one of {', '.join(OUTCOMES)}")
        job = self.job(job_id)
        if job.state is not JobState.RUNNING or job.attempts != attempt:
            raise JobConflict(job, f"job {job_id} is {job.state.value} (attempt {job.attempts}), "
                                   f"not running attempt {attempt}")
        with self._atomic():
            lease_id = self._drop_lease(job)
            if outcome == "interrupted":
                self._interrupted(job, now, reason or "its runner stopped")
            elif outcome == "succeeded":
                self._end(job, JobState.SUCCEEDED, now, reason or "succeeded")
            elif job.attempts <= job.retries:
                job.state = JobState.QUEUED
                job.reason = f"attempt {job.attempts} {outcome.replace('_', ' ')}: {reason}; retrying"
                self._emit("job.requeued", now, job, reason=job.reason)
            else:
                self._end(job, JobState(outcome), now, reason or outcome)
        self._release(lease_id, now, f"job {outcome}", holder_gone=True)  # reported once its process ended
        self.tick(now)
        return job

    def cancel(self, job_id: str, *, now: float, by: str) -> Job:
        """Withdraw a queued job or stop a running one (its runner stops the kernel)."""
        job = self.job(job_id)
        if not job.state.active:
            raise JobConflict(job, f"job {job_id} has already ended ({job.state.value})")
        started = job.state is JobState.RUNNING  # then its runner returns the slice once the attempt stopped
        with self._atomic():
            lease_id = self._drop_lease(job)
            self._end(job, JobState.CANCELLED, now, f"cancelled by {by}")
        self._release(lease_id, now, "job cancelled", holder_gone=not started)
        return job

    def runner_gone(self, user: str, runner: str, *, now: float) -> list[Job]:
        """The runner of `user`'s server `runner` stopped: its jobs wait for it. A queued one gives its
        lease up at once (nothing ran on it: its slice returns); a running one keeps its lease until
        its attempt's end is reported or its heartbeats stop, and then waits. The runner's active jobs."""
        if runner == POD_RUNNER or not is_server(runner):
            raise SpecError("runner", f"must be {SERVER_GRAMMAR} (the server whose runner stopped)")
        jobs = [j for j in self._jobs.values() if j.user == user and j.runner == runner]
        with self._atomic():
            released = [self._drop_lease(j) for j in jobs if j.state is JobState.QUEUED]
            for job in jobs:
                self._record(job)
                job.waiting_for_runner = True
        for lease_id in released:
            self._release(lease_id, now, "its server stopped", holder_gone=True)
        self.tick(now)
        return jobs

    def runner_seen(self, user: str, holders: Sequence[str], *, now: float) -> list[Job]:
        """The runner of some of `user`'s jobs heartbeats their holders: those that waited for it queue
        a lease again. O(holders) when jobs wait, O(1) when none does. The jobs that waited."""
        if not self._waiting:
            return []
        back = [job for job in map(self._jobs.get, self._waiting.intersection(map(job_of, holders)))
                if job is not None and job.user == user]
        if not back:
            return []
        with self._atomic():
            for job in back:
                self._record(job)
                job.waiting_for_runner = False
                if job.state is JobState.QUEUED and job.lease_id is None:
                    job.reason = ""
                    self._queue_lease(job, now)
                    if job.state is JobState.QUEUED:
                        self._emit("job.queued", now, job, position=self.scheduler.position(job.lease_id))
        return back

    def tick(self, now: float, reason: str = "its lease ended") -> None:
        """Move on the jobs whose lease ended unnoticed (`reason`); queue a lease for every queued job
        without one, unless it waits for its runner (then say so)."""
        with self._atomic():
            for job in list(self._jobs.values()):
                if job.lease_id is not None and self._lease(job) is None:
                    self._record(job)
                    job.lease_id = None
                    if job.state is JobState.RUNNING:
                        self._interrupted(job, now, reason)
                if job.state is not JobState.QUEUED or job.lease_id is not None:
                    continue
                if not job.waiting_for_runner:
                    self._queue_lease(job, now)
                elif job.reason != waiting_reason(job.runner):
                    self._record(job)
                    job.reason = waiting_reason(job.runner)
                    self._emit("job.waiting", now, job, reason=job.reason)

    def _queue_lease(self, job: Job, now: float) -> None:
        """Queue a lease for a queued job without one; fail the job if the core refuses it for good."""
        self._record(job)
        try:
            job.lease_id = self._submit_lease(job, now).id
        except StoreFailed:
            raise
        except (SchedulerError, SpecError) as err:
            self._end(job, JobState.FAILED, now, f"cannot queue again: {err}")

    # -------------------------------------------------------------- changes
    def _drop_lease(self, job: Job) -> str | None:
        """Detach the job's active lease (released once the job's change is stored); its id."""
        lease = self._lease(job)
        self._record(job)
        job.lease_id = None
        return lease.id if lease is not None else None

    def _release(self, lease_id: str | None, now: float, reason: str, holder_gone: bool = False) -> None:
        """End a lease no job holds any more (its slice returns at once if `holder_gone`, else once
        the runner says the attempt's process ended); if the store refuses, its heartbeat TTL ends it."""
        if lease_id is None:
            return
        try:
            self.scheduler.release(lease_id, now=now, reason=reason, holder_gone=holder_gone)
        except (NotFound, StoreFailed):
            pass

    def _end(self, job: Job, state: JobState, now: float, reason: str) -> None:
        self._record(job)
        job.state = state
        job.ended_at = now
        job.reason = reason
        self._emit(f"job.{state.value}", now, job, reason=reason,
                   runtime_s=now - job.started_at if job.started_at is not None else None)

    def _interrupted(self, job: Job, now: float, reason: str) -> None:
        if self.policy.requeue_interrupted:
            self._record(job)
            job.state = JobState.QUEUED
            job.reason = f"interrupted ({reason}); requeued"
            self._emit("job.requeued", now, job, reason=job.reason)
        else:
            self._end(job, JobState.FAILED, now, f"interrupted: {reason}")

    def _on_lease_event(self, event: Event) -> None:
        """A job's lease ended under it: preempted (back to the queue) or lost (interrupted); one that
        expired for want of heartbeats leaves the job waiting for its runner (see runner_seen)."""
        job_id = job_of(event.data.get("holder", ""))
        if job_id is None:
            return
        job = self._jobs.get(job_id)
        if job is None or job.lease_id != event.lease_id:
            return
        if event.type not in LEASE_ENDINGS:
            return
        try:
            with self._atomic():
                self._record(job)
                job.lease_id = None
                if event.type == "lease.preempted":
                    if job.state is JobState.RUNNING:
                        job.state = JobState.QUEUED
                        job.preemptions += 1
                    job.reason = f"preempted ({event.data.get('reason', '')}); requeued"
                    self._emit("job.preempted", event.time, job, reason=job.reason)
                elif job.state is JobState.RUNNING:
                    self._interrupted(job, event.time, event.data.get("reason", "its lease ended"))
                if event.type == "lease.expired" and event.data.get("reason", "").startswith(NO_HEARTBEAT) \
                        and job.runner != POD_RUNNER and job.state.active:
                    job.waiting_for_runner = True  # its runner stopped heartbeating it: stopped, or cut off
        except StoreFailed:
            pass  # the job is put back as stored: the next tick finds its lease gone and moves it on
