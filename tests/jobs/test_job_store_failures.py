"""A job write the store refuses is undone: that job's change is lost, every later one is stored."""

from __future__ import annotations

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from jupyter_gpualloc.core.jobs import Jobs
from jupyter_gpualloc.core.model import JobState, LeaseState
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler, StoreFailed
from jupyter_gpualloc.core.store import Store

from .test_core_jobs import Core, request


class RefusingStore(Store):
    """A real store that refuses every job write naming `refused` (a value its database will not take),
    and, while `down`, every job write at all."""

    refused = "refused-by-the-database"

    def __init__(self, url: str):
        super().__init__(url)
        self.down = False
        event.listen(self.engine, "before_cursor_execute", self._check)

    def _check(self, conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().startswith("INSERT INTO jobs") and (self.down or self.refused in str(parameters)):
            raise OperationalError(statement, parameters, ConnectionError("the database refused the write"))


class RefusingCore(Core):
    def build(self, now: float) -> None:
        self.store = RefusingStore(self.url)
        self.scheduler = Scheduler(self.backend, self.store, SchedulerPolicy(**self.policy), now=now)
        self.scheduler.subscribe(self.events.append)
        self.jobs = Jobs(self.scheduler, now=now, listeners=[self.events.append])


@pytest.fixture
def core(tmp_path):
    made = RefusingCore(tmp_path)
    yield made
    made.store.close()


def stored(core) -> dict[str, str]:
    return {j.id: j.state.value for j in core.store.load_jobs()}


def test_a_refused_submit_records_nothing_and_does_not_poison_later_writes(core):
    with pytest.raises(StoreFailed):
        core.jobs.submit("alice", request(name=RefusingStore.refused), now=1.0)
    assert core.jobs.jobs() == [] and core.scheduler.leases() == []  # its lease was withdrawn too
    assert core.types() == []
    job = core.jobs.submit("alice", request(), now=2.0)
    core.jobs.start(job.id, now=3.0)
    core.jobs.finish(job.id, 1, "succeeded", now=4.0)
    assert stored(core) == {job.id: "succeeded"}
    assert core.types() == ["job.queued", "job.started", "job.succeeded"]


def test_a_refused_finish_leaves_the_job_running_with_its_slice_until_the_runner_reports_again(core):
    job = core.jobs.submit("alice", request(), now=1.0)
    core.jobs.start(job.id, now=2.0)
    lease_id = job.lease_id
    core.store.down = True
    with pytest.raises(StoreFailed):
        core.jobs.finish(job.id, 1, "succeeded", now=3.0)
    assert (job.state, job.lease_id, job.attempts) == (JobState.RUNNING, lease_id, 1)
    assert core.scheduler.lease(lease_id).state is LeaseState.GRANTED
    with pytest.raises(StoreFailed):
        core.jobs.cancel(job.id, now=3.5, by="alice")
    assert job.state is JobState.RUNNING
    core.store.down = False
    core.jobs.finish(job.id, 1, "succeeded", now=4.0)
    assert stored(core) == {job.id: "succeeded"}
    assert core.scheduler.lease(lease_id).state is LeaseState.RELEASED
    core.restart(5.0)
    assert core.jobs.job(job.id).state is JobState.SUCCEEDED and core.scheduler.leases() == []


def test_a_preemption_the_store_refuses_to_record_is_caught_up_by_the_next_tick(core):
    from jupyter_gpualloc.core.model import SliceSpec

    job = core.jobs.submit("alice", request(), now=1.0)
    core.jobs.start(job.id, now=2.0)
    preempted = job.lease_id
    core.store.down = True
    kernel = core.scheduler.submit("bob", "kernel:k", SliceSpec.from_json({"kind": "whole", "model": "L4"}), now=3.0)
    assert core.scheduler.lease(preempted).state is LeaseState.PREEMPTED  # the scheduler goes on all the same
    core.scheduler.release(preempted, now=3.5, holder_gone=True)  # the runner stopped the attempt
    assert kernel.state is LeaseState.GRANTED
    assert job.state is JobState.RUNNING  # as stored
    with pytest.raises(StoreFailed):
        core.jobs.tick(4.0)
    core.store.down = False
    core.jobs.tick(5.0)
    assert job.state is JobState.QUEUED and "interrupted" in job.reason
    assert core.scheduler.lease(job.lease_id).state is LeaseState.QUEUED
    assert stored(core) == {job.id: "queued"}
