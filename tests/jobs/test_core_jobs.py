"""The job state machine in the core, over a simulated fleet and a real SQLite file (no servers)."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.jobs import JobConflict, JobRequest, Jobs
from jupyter_gpualloc.core.model import JobState, LeaseState, PriorityClass, SliceSpec, SpecError
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import NotFound, QuotaExceeded, Scheduler
from jupyter_gpualloc.core.store import Store, sqlite_url

FLEET = {"nodes": [{"name": "n0", "cpu_milli": 64000, "memory_mib": 262144,
                    "gpus": [{"model": "L4", "count": 1}]}]}
WHOLE = {"kind": "whole", "model": "L4"}


class Core:
    """Scheduler + jobs over one SQLite file, restartable."""

    def __init__(self, tmp_path, **policy):
        self.url = sqlite_url(tmp_path / "gpualloc.sqlite")
        self.backend = SimulatedBackend(FLEET)
        self.policy = {"wait_for_holders": True, **policy}  # a preempted attempt's slice waits for its runner
        self.events: list = []
        self.build(0.0)

    def build(self, now: float) -> None:
        self.store = Store(self.url)
        self.scheduler = Scheduler(self.backend, self.store, SchedulerPolicy(**self.policy), now=now)
        self.scheduler.subscribe(self.events.append)
        self.jobs = Jobs(self.scheduler, now=now, listeners=[self.events.append])

    def restart(self, now: float) -> None:
        self.store.close()
        self.build(now)

    def types(self, prefix: str = "job.") -> list[str]:
        return [e.type for e in self.events if e.type.startswith(prefix)]


def request(spec=WHOLE, **extra) -> JobRequest:
    body = {"spec": spec, "workdir": "/tmp", "source": {"kind": "cell", "code": "x = 1"}, **extra}
    return JobRequest.from_json(body)


@pytest.fixture
def core(tmp_path):
    made = Core(tmp_path)
    yield made
    made.store.close()


def test_a_job_queues_a_batch_lease_then_runs_and_succeeds(core):
    job = core.jobs.submit("alice", request(), now=1.0)
    lease = core.scheduler.lease(job.lease_id)
    assert (lease.holder, lease.priority, lease.state) == (f"job:{job.id}", PriorityClass.BATCH, LeaseState.GRANTED)
    assert job.state is JobState.QUEUED and core.jobs.view(job, 1.0)["position"] == 0
    core.jobs.start(job.id, now=2.0)
    assert job.state is JobState.RUNNING and job.attempts == 1
    with pytest.raises(JobConflict):
        core.jobs.start(job.id, now=2.0)
    core.jobs.finish(job.id, 1, "succeeded", now=5.0)
    assert core.jobs.job(job.id).state is JobState.SUCCEEDED
    assert core.scheduler.lease(lease.id).state is LeaseState.RELEASED
    assert core.jobs.view(core.jobs.job(job.id), 9.0)["runtime_s"] == 3.0
    assert core.types() == ["job.queued", "job.started", "job.succeeded"]


def test_jobs_wait_behind_each_other_and_interactive_requests_go_first(core):
    first = core.jobs.submit("alice", request(), now=1.0)
    second = core.jobs.submit("alice", request(), now=2.0)
    assert core.jobs.view(second, 2.0)["position"] == 1
    core.jobs.start(first.id, now=3.0)
    preempted = first.lease_id
    interactive = core.scheduler.submit("bob", "kernel:k1", SliceSpec.from_json(WHOLE), now=4.0)
    # the running job is preemptible: the interactive request takes its GPU once the attempt stopped
    assert first.state is JobState.QUEUED and first.preemptions == 1 and first.lease_id is None
    assert "job.preempted" in core.types()
    assert interactive.state is LeaseState.QUEUED
    core.scheduler.release(preempted, now=4.5, holder_gone=True)  # the runner: its kernel is gone
    assert interactive.state is LeaseState.GRANTED
    core.jobs.tick(5.0)
    order = [l.holder for l in core.scheduler.queue()]
    assert order == [f"job:{second.id}", f"job:{first.id}"]
    core.scheduler.release(interactive.id, now=6.0, holder_gone=True)
    core.jobs.start(second.id, now=6.0)
    core.jobs.finish(second.id, 1, "succeeded", now=7.0)
    core.jobs.start(first.id, now=7.0)
    assert first.attempts == 2
    core.jobs.finish(first.id, 2, "succeeded", now=8.0)
    assert core.jobs.job(first.id).state is JobState.SUCCEEDED


def test_a_non_preemptible_job_is_not_preempted_where_the_policy_allows_one(tmp_path):
    core = Core(tmp_path, allow_non_preemptible=True)
    job = core.jobs.submit("alice", request(preemptible=False), now=1.0)
    core.jobs.start(job.id, now=2.0)
    waiting = core.scheduler.submit("bob", "kernel:k1", SliceSpec.from_json(WHOLE), now=3.0)
    assert waiting.state is LeaseState.QUEUED and job.state is JobState.RUNNING
    core.store.close()


def test_a_job_cannot_opt_out_of_preemption_nor_retry_past_the_policy_and_nothing_is_recorded(core):
    for asked, field in [({"preemptible": False}, "preemptible"), ({"retries": 11}, "retries")]:
        with pytest.raises(SpecError) as refused:
            core.jobs.submit("alice", request(**asked), now=1.0)
        assert refused.value.field == field
    assert core.jobs.jobs("alice") == [] and core.scheduler.leases("alice") == []
    assert core.jobs.submit("alice", request(retries=10), now=1.0).retries == 10


def test_retries_then_failure_and_timeout(core):
    job = core.jobs.submit("alice", request(retries=1), now=1.0)
    core.jobs.start(job.id, now=2.0)
    core.jobs.finish(job.id, 1, "failed", "ZeroDivisionError", now=3.0)
    assert job.state is JobState.QUEUED and job.lease_id is not None
    core.jobs.start(job.id, now=4.0)
    core.jobs.finish(job.id, 2, "timed_out", "over 1 s", now=5.0)
    assert core.jobs.job(job.id).state is JobState.TIMED_OUT
    assert core.types()[-1] == "job.timed_out"
    with pytest.raises(JobConflict):
        core.jobs.finish(job.id, 2, "succeeded", now=6.0)


def test_cancel_queued_and_running(core):
    running = core.jobs.submit("alice", request(), now=1.0)
    queued = core.jobs.submit("alice", request(), now=1.0)
    core.jobs.start(running.id, now=2.0)
    core.jobs.cancel(queued.id, now=3.0, by="alice")
    core.jobs.cancel(running.id, now=3.0, by="alice")
    assert [core.jobs.job(j.id).state for j in (running, queued)] == [JobState.CANCELLED] * 2
    assert core.scheduler.leases() == []
    with pytest.raises(JobConflict):
        core.jobs.cancel(running.id, now=4.0, by="alice")
    rerun = core.jobs.rerun(running.id, now=5.0)
    assert rerun.rerun_of == running.id and rerun.state is JobState.QUEUED


def test_a_running_job_whose_runner_died_is_requeued_after_a_restart_and_waits_for_its_runner(tmp_path):
    core = Core(tmp_path, heartbeat_ttl=60.0)
    job = core.jobs.submit("alice", request(), now=1.0)
    core.jobs.start(job.id, now=2.0)
    core.restart(10.0)
    assert core.jobs.job(job.id).state is JobState.RUNNING  # its runner may still be alive
    core.scheduler.tick(100.0)  # no heartbeat for a TTL: the runner is dead
    core.jobs.tick(100.0)
    again = core.jobs.job(job.id)
    assert again.state is JobState.QUEUED and "job.requeued" in core.types()
    # nothing could run it: it takes no slice again (it did, every TTL, until its server came back)
    assert again.lease_id is None and core.scheduler.leases() == []
    assert again.reason == "waiting for your server to run it: start your server again" and again.waiting_for_runner
    core.jobs.runner_seen("alice", [job.holder], now=110.0)  # its server is back and heartbeats it
    assert not again.waiting_for_runner and core.jobs.view(again, 110.0)["position"] == 0
    core.store.close()


def test_a_queued_job_of_a_stopped_server_takes_no_slice_and_no_quota_until_its_runner_is_back(tmp_path):
    share = {"kind": "shared", "memory_gib": 4, "model": "L4"}
    core = Core(tmp_path, heartbeat_ttl=60.0, quotas={"alice": {"slices": 1}})
    granted = core.jobs.submit("alice", request(share), now=1.0)  # its slice is ready, its runner not yet started
    queued = core.jobs.submit("alice", request(share), now=2.0)  # waits for alice's one slot
    other = core.jobs.submit("carol", request(share), now=3.0)  # carol's server runs hers: it goes on
    assert core.jobs.view(granted, 3.0)["position"] == 0 and "quota" in core.jobs.view(queued, 3.0)["lease"]["reason"]
    first_lease = granted.lease_id
    assert {j.id for j in core.jobs.runner_gone("alice", "server", now=4.0)} == {granted.id, queued.id}
    for job in (granted, queued):
        view = core.jobs.view(core.jobs.job(job.id), 4.0)
        assert (view["state"], view["lease"], view["position"]) == ("queued", None, None) and view["waiting_for_runner"]
        assert view["reason"] == "waiting for your server to run it: start your server again"
    ended = core.scheduler.lease(first_lease)
    assert ended.state is LeaseState.RELEASED and not ended.returning  # nothing ran on it: its slice is free
    assert core.types()[-2:] == ["job.waiting", "job.waiting"]
    kernel = core.scheduler.submit("alice", "kernel:k", SliceSpec.from_json(share), now=5.0)
    assert kernel.state is LeaseState.GRANTED  # alice's one quota slot is free
    core.scheduler.release(kernel.id, now=6.0, holder_gone=True)
    for now in (200.0, 400.0):  # TTLs pass: nothing is granted to alice's jobs, nothing of theirs expires
        core.scheduler.heartbeat("carol", [other.holder], now=now)
        core.scheduler.tick(now)
        core.jobs.tick(now)
    assert [l.holder for l in core.scheduler.leases()] == [other.holder]
    assert not [e for e in core.events if e.type in ("lease.granted", "lease.queued") and e.time > 6.0]
    core.restart(500.0)  # stored: a restart does not queue them again
    core.jobs.tick(500.0)
    assert core.jobs.job(granted.id).waiting_for_runner and core.jobs.job(granted.id).lease_id is None
    core.jobs.runner_seen("bob", [granted.holder], now=501.0)  # not bob's job
    core.jobs.runner_seen("alice", [other.holder, "kernel:k"], now=501.0)  # not one that waits
    assert core.jobs.job(granted.id).waiting_for_runner and core.jobs.job(queued.id).waiting_for_runner
    core.jobs.runner_seen("alice", [granted.holder, queued.holder], now=502.0)  # the server's runner is back
    back = [core.jobs.job(j.id) for j in (granted, queued)]
    assert [j.waiting_for_runner for j in back] == [False, False] and all(j.lease_id for j in back)
    assert [j.reason for j in back] == ["", ""] and core.types()[-2:] == ["job.queued", "job.queued"]
    assert sorted(core.jobs.view(j, 502.0)["position"] for j in back) == [0, 1]  # one granted, one within quota
    core.store.close()


def test_a_running_job_of_a_stopped_server_waits_once_its_attempt_is_reported(core):
    job = core.jobs.submit("alice", request(retries=1), now=1.0)
    core.jobs.start(job.id, now=2.0)
    lease_id = job.lease_id
    core.jobs.runner_gone("alice", "server", now=3.0)
    assert job.state is JobState.RUNNING and core.scheduler.lease(lease_id).state is LeaseState.GRANTED
    core.jobs.finish(job.id, 1, "interrupted", "the server running it stopped", now=4.0)
    again = core.jobs.job(job.id)
    assert (again.state, again.lease_id, again.waiting_for_runner) == (JobState.QUEUED, None, True)
    assert again.reason == "waiting for your server to run it: start your server again"
    assert core.scheduler.leases() == []
    rerun = core.jobs.submit("alice", request(), now=5.0)  # e.g. rerun from another server: waits for it too
    assert rerun.waiting_for_runner and rerun.lease_id is None
    with pytest.raises(SpecError) as err:
        core.jobs.runner_gone("alice", "pod", now=6.0)
    assert err.value.field == "runner"


def test_a_job_in_a_pod_of_its_own_never_waits_for_a_server(tmp_path):
    core = Core(tmp_path, heartbeat_ttl=60.0)
    job = core.jobs.submit("alice", request(), now=1.0, pod={"spec": {}})
    assert job.runner == "pod"
    core.jobs.runner_gone("alice", "server", now=2.0)
    core.scheduler.tick(100.0)  # its pod's runner stopped heartbeating: it is queued again, as before
    core.jobs.tick(100.0)
    again = core.jobs.job(job.id)
    assert not again.waiting_for_runner and again.lease_id is not None
    core.store.close()


def test_requeue_interrupted_off_fails_the_job(tmp_path):
    core = Core(tmp_path, requeue_interrupted=False)
    job = core.jobs.submit("alice", request(), now=1.0)
    core.jobs.start(job.id, now=2.0)
    core.restart(3.0)
    core.jobs.finish(job.id, 1, "interrupted", "the server restarted", now=4.0)
    assert core.jobs.job(job.id).state is JobState.FAILED
    assert core.scheduler.leases() == []
    core.store.close()


def test_quotas_count_jobs(tmp_path):
    core = Core(tmp_path, quotas={"alice": {"slices": 1}, "carol": {"memory_gib": 10}})
    core.scheduler.submit("alice", "kernel:k", SliceSpec.from_json({"kind": "shared", "memory_gib": 2}), now=0.0)
    job = core.jobs.submit("alice", request(), now=1.0)
    assert "quota" in core.scheduler.lease(job.lease_id).reason
    # what every view of the job shows (the cell, %gpu jobs, the sidebar): why it waits
    view = core.jobs.view(job, now=2.0)
    assert view["position"] == 1 and view["reason"] == core.scheduler.lease(job.lease_id).reason
    assert view["reason"].startswith("user quota for alice: at most 1 slice")
    with pytest.raises(QuotaExceeded):
        core.jobs.submit("carol", request(), now=1.0)
    assert [j.user for j in core.jobs.jobs()] == ["alice"]
    core.store.close()


def test_requests_are_checked_field_by_field(core):
    with pytest.raises(SpecError) as err:
        request(source={"kind": "cell", "code": "x", "inputs": ["a b"]})
    assert err.value.field == "source.inputs"
    with pytest.raises(SpecError) as err:
        request(priority="interactive") and core.jobs.submit("alice", request(priority="interactive"), now=0)
    assert err.value.field == "priority"
    with pytest.raises(SpecError) as err:
        JobRequest.from_json({"spec": WHOLE, "workdir": "rel", "source": {"kind": "cell", "code": "x"}})
    assert err.value.field == "workdir"
    with pytest.raises(NotFound):
        core.jobs.job("nope")


def test_a_long_waiting_job_keeps_its_gpu_from_later_smaller_jobs(core):
    share = {"kind": "shared", "memory_gib": 4, "model": "L4"}
    kernel = core.scheduler.submit("bob", "kernel:k", SliceSpec.from_json(share), now=0.0)
    big = core.jobs.submit("alice", request(), now=1.0)  # a whole L4: waits for bob's kernel
    small = core.jobs.submit("carol", request(share), now=2.0)
    assert core.jobs.view(small, 2.0)["position"] == 0  # backfilled while big waits briefly
    core.jobs.cancel(small.id, now=3.0, by="carol")
    later = core.jobs.submit("carol", request(share), now=700.0)  # big has waited past reserve_after
    assert core.jobs.view(later, 700.0)["position"] == 2
    core.scheduler.release(kernel.id, now=800.0, holder_gone=True)
    assert core.jobs.view(core.jobs.job(big.id), 800.0)["position"] == 0


def test_interactive_jobs_when_policy_allows_them(tmp_path):
    core = Core(tmp_path, interactive_jobs=True)
    job = core.jobs.submit("alice", request(priority="interactive"), now=0.0)
    lease = core.scheduler.lease(job.lease_id)
    assert (lease.priority, lease.preemptible) == (PriorityClass.INTERACTIVE, False)
    core.store.close()


def test_only_the_server_that_submitted_a_job_claims_it_and_a_rerun_stays_there(core):
    job = core.jobs.submit("alice", request(runner="server:gpu2"), now=1.0)
    with pytest.raises(JobConflict, match="runs in server:gpu2, not in server"):
        core.jobs.start(job.id, now=2.0)
    core.jobs.start(job.id, now=2.0, runner="server:gpu2")
    core.jobs.finish(job.id, 1, "succeeded", now=3.0)
    assert core.jobs.rerun(job.id, now=4.0).runner == "server:gpu2"
    assert request().runner == "server"
    for bad in ("kernel:k", "server:", "server: ", 7):
        with pytest.raises(SpecError) as err:
            request(runner=bad)
        assert err.value.field == "runner"


def test_a_cell_job_with_inputs_is_not_rerun_its_inputs_are_gone(core):
    job = core.jobs.submit("alice", request(source={"kind": "cell", "code": "x", "inputs": ["a"],
                                                    "inputs_file": ".gpualloc/inputs/a.pkl"}), now=1.0)
    core.jobs.cancel(job.id, now=2.0, by="alice")
    with pytest.raises(JobConflict, match="inputs were deleted when it ended: run its cell again"):
        core.jobs.rerun(job.id, now=3.0)
