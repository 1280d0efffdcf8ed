"""Background jobs: their records and state machine, over `job:<id>` leases in the scheduler's one queue.

A job holds one lease per attempt, of priority class `batch` unless policy allows interactive
jobs, so interactive requests go first and quotas, fair share, reservations and preemption
count jobs like any other holder. The job is `queued` until its lease is granted and a runner
claims it (`start`); the runner reports the attempt's end (`finish`). A lease that ends under a
running job (preempted, expired for want of heartbeats) sends the job back to the queue, or fails
it when it was interrupted and `requeue_interrupted` is off. Queued jobs without a lease get one
at the next `tick`. Every change is stored before its event is announced; time is passed in.
"""

from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .model import Event, Job, JobState, Lease, LeaseState, PriorityClass, SliceSpec, SpecError
from .scheduler import NotFound, Scheduler, SchedulerError

OUTCOMES = ("succeeded", "failed", "timed_out", "interrupted")
REQUEST_FIELDS = {"name", "spec", "priority", "preemptible", "source", "workdir", "kernel_name", "timeout", "retries"}
MAX_RETRIES = 100
LEASE_ENDINGS = {f"lease.{state.value}" for state in LeaseState if not state.active}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
        if not isinstance(workdir, str) or not workdir.startswith("/"):
            raise SpecError("workdir", "must be an absolute directory path")
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
        return cls(name, spec, priority, preemptible, source, workdir, kernel_name,
                   float(timeout) if timeout is not None else None, retries)


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
    return {"kind": kind, "code": code, **names, "inputs_file": inputs_file}


class Jobs:
    """Every job of the scheduler's users: submit, claim, finish, cancel, rerun, and requeue."""

    def __init__(self, scheduler: Scheduler, *, now: float, listeners: Sequence[Callable[[Event], None]] = ()):
        """Load the queued and running jobs and reconcile them with their leases."""
        self.scheduler = scheduler
        self.store = scheduler.store
        self.policy = scheduler.policy
        self._listeners: list[Callable[[Event], None]] = list(listeners)
        self._jobs: dict[str, Job] = {j.id: j for j in self.store.load_jobs(active_only=True)}
        self._dirty: dict[str, Job] = {}
        self._pending: list[Event] = []
        scheduler.subscribe(self._on_lease_event)
        for job in list(self._jobs.values()):
            if job.lease_id is not None and self._lease(job) is None:
                job.lease_id = None
                if job.state is JobState.RUNNING:
                    self._interrupted(job, now, "its lease ended while the scheduler was stopped")
                self._changed(job)
        self.tick(now)

    # ----------------------------------------------------------------- events
    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call `listener` with every job event after it is stored; returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _emit(self, type_: str, now: float, job: Job, **data: Any) -> None:
        data.update(job_id=job.id, name=job.name, state=job.state.value, attempt=job.attempts,
                    priority=job.priority.value)
        self._pending.append(Event(type_, now, job.lease_id, job.user, data))

    def _changed(self, job: Job) -> None:
        self._dirty[job.id] = job
        if not job.state.active:
            self._jobs.pop(job.id, None)

    def _commit(self) -> None:
        if self._dirty:
            self.store.save_jobs(list(self._dirty.values()))
            self._dirty.clear()
        events, self._pending = self._pending, []
        for event in events:
            for listener in list(self._listeners):
                listener(event)

    # ------------------------------------------------------------------ reads
    def job(self, job_id: str) -> Job:
        job = self._jobs.get(job_id) or self.store.load_job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    def jobs(self, user: str | None = None, limit: int = 500) -> list[Job]:
        """Jobs of one user or all, newest first (active ones as they are now)."""
        return [self._jobs.get(j.id, j) for j in self.store.load_jobs(user=user, limit=limit)]

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
        """The job as the API shows it: its record, queue position (0: its slice is ready), lease and runtime."""
        data = job.to_json()
        lease = self._lease(job) if job.state.active else None
        position = None
        if job.state is JobState.QUEUED and lease is not None:
            position = 0 if lease.state is LeaseState.GRANTED else self.scheduler.position(lease.id)
        data["position"] = position
        data["lease"] = lease.to_json() if lease is not None else None
        data["slice"] = lease.slice.to_json() if lease is not None and lease.slice else None
        end = now if job.state is JobState.RUNNING else job.ended_at
        data["runtime_s"] = max(0.0, end - job.started_at) if job.started_at is not None and end else None
        data["preempt_grace"] = self.policy.preempt_grace
        return data

    # ------------------------------------------------------------------- API
    def submit(self, user: str, request: JobRequest, *, now: float, groups: Sequence[str] = (),
               rerun_of: str | None = None) -> Job:
        """Record a job and queue its lease; a request that can never be granted raises and records nothing."""
        if request.priority is PriorityClass.INTERACTIVE and not self.policy.interactive_jobs:
            raise SpecError("priority", "jobs run in the batch class here (policy: interactive_jobs is off)")
        preemptible = request.preemptible
        if preemptible is None:
            preemptible = request.priority is PriorityClass.BATCH and self.policy.batch_preemptible
        job = Job(id=secrets.token_hex(6), user=user, name=request.name, spec=request.spec,
                  priority=request.priority, preemptible=preemptible, source=request.source,
                  workdir=request.workdir, kernel_name=request.kernel_name, state=JobState.QUEUED,
                  created_at=now, groups=tuple(groups), timeout=request.timeout, retries=request.retries,
                  rerun_of=rerun_of)
        lease = self._submit_lease(job, now)
        job.lease_id = lease.id
        self._jobs[job.id] = job
        self._changed(job)
        self._emit("job.queued", now, job, position=self.scheduler.position(lease.id))
        self._commit()
        return job

    def _submit_lease(self, job: Job, now: float) -> Lease:
        return self.scheduler.submit(job.user, job.holder, job.spec, job.priority, now=now, groups=job.groups,
                                     preemptible=job.preemptible, wait=True)

    def rerun(self, job_id: str, *, now: float) -> Job:
        """A new job with the same request as a finished one."""
        old = self.job(job_id)
        if old.state.active:
            raise JobConflict(old, f"job {job_id} is still {old.state.value}")
        request = JobRequest(old.name, old.spec, old.priority, old.preemptible, old.source, old.workdir,
                             old.kernel_name, old.timeout, old.retries)
        return self.submit(old.user, request, now=now, groups=old.groups, rerun_of=old.id)

    def start(self, job_id: str, *, now: float) -> Job:
        """A runner claims a queued job whose slice is granted: it is running, one attempt more."""
        job = self.job(job_id)
        lease = self._lease(job)
        if job.state is not JobState.QUEUED or lease is None or lease.state is not LeaseState.GRANTED:
            raise JobConflict(job, f"job {job_id} is {job.state.value}, not queued with its slice granted")
        job.state = JobState.RUNNING
        job.attempts += 1
        job.started_at = now
        job.reason = ""
        self.scheduler.heartbeat(job.user, [job.holder], now=now)
        self._changed(job)
        self._emit("job.started", now, job, waited_s=now - job.created_at, slice=lease.slice.to_json())
        self._commit()
        return job

    def finish(self, job_id: str, attempt: int, outcome: str, reason: str = "", *, now: float) -> Job:
        """The runner reports how attempt `attempt` ended; the lease ends and the job moves on."""
        if outcome not in OUTCOMES:
            raise SpecError("outcome", f"must be one of {', '.join(OUTCOMES)}")
        job = self.job(job_id)
        if job.state is not JobState.RUNNING or job.attempts != attempt:
            raise JobConflict(job, f"job {job_id} is {job.state.value} (attempt {job.attempts}), "
                                   f"not running attempt {attempt}")
        self._end_lease(job, now, f"job {outcome}")
        if outcome == "interrupted":
            self._interrupted(job, now, reason or "its runner stopped")
        elif outcome == "succeeded":
            self._end(job, JobState.SUCCEEDED, now, reason or "succeeded")
        elif job.attempts <= job.retries:
            job.state = JobState.QUEUED
            job.reason = f"attempt {job.attempts} {outcome.replace('_', ' ')}: {reason}; retrying"
            self._changed(job)
            self._emit("job.requeued", now, job, reason=job.reason)
        else:
            self._end(job, JobState(outcome), now, reason or outcome)
        self.tick(now)
        return job

    def cancel(self, job_id: str, *, now: float, by: str) -> Job:
        """Withdraw a queued job or stop a running one (its runner stops the kernel)."""
        job = self.job(job_id)
        if not job.state.active:
            raise JobConflict(job, f"job {job_id} has already ended ({job.state.value})")
        self._end_lease(job, now, "job cancelled")
        self._end(job, JobState.CANCELLED, now, f"cancelled by {by}")
        self._commit()
        return job

    def tick(self, now: float) -> None:
        """Queue a lease for every queued job without one."""
        for job in list(self._jobs.values()):
            if job.state is JobState.QUEUED and job.lease_id is None:
                try:
                    job.lease_id = self._submit_lease(job, now).id
                except (SchedulerError, SpecError) as err:
                    self._end(job, JobState.FAILED, now, f"cannot queue again: {err}")
                self._changed(job)
        self._commit()

    # -------------------------------------------------------------- changes
    def _end_lease(self, job: Job, now: float, reason: str) -> None:
        lease = self._lease(job)
        job.lease_id = None
        self._changed(job)
        if lease is not None:
            self.scheduler.release(lease.id, now=now, reason=reason)

    def _end(self, job: Job, state: JobState, now: float, reason: str) -> None:
        job.state = state
        job.ended_at = now
        job.reason = reason
        self._changed(job)
        self._emit(f"job.{state.value}", now, job, reason=reason,
                   runtime_s=now - job.started_at if job.started_at is not None else None)

    def _interrupted(self, job: Job, now: float, reason: str) -> None:
        if self.policy.requeue_interrupted:
            job.state = JobState.QUEUED
            job.reason = f"interrupted ({reason}); requeued"
            self._changed(job)
            self._emit("job.requeued", now, job, reason=job.reason)
        else:
            self._end(job, JobState.FAILED, now, f"interrupted: {reason}")

    def _on_lease_event(self, event: Event) -> None:
        """A job's lease ended under it: preempted (back to the queue) or lost (interrupted)."""
        holder = event.data.get("holder", "")
        if not holder.startswith("job:"):
            return
        job = self._jobs.get(holder[4:])
        if job is None or job.lease_id != event.lease_id:
            return
        if event.type not in LEASE_ENDINGS:
            return
        job.lease_id = None
        self._changed(job)
        if event.type == "lease.preempted":
            if job.state is JobState.RUNNING:
                job.state = JobState.QUEUED
                job.preemptions += 1
            job.reason = f"preempted ({event.data.get('reason', '')}); requeued"
            self._emit("job.preempted", event.time, job, reason=job.reason)
        elif job.state is JobState.RUNNING:
            self._interrupted(job, event.time, event.data.get("reason", "its lease ended"))
        self._commit()
