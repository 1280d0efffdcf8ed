"""Usage accounting: exact GPU-hours across a lease's life, restarts, UTC days, reports and usage quotas."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from jupyter_gpualloc.core.model import LeaseState, PriorityClass, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import QuotaExceeded
from jupyter_gpualloc.core.usage import Window, gpu_share, memory_gib, next_midnight, to_csv, utc_day

from .conftest import A100_40, fleet

HOUR = 3600.0
# Monday 2 November 2026, 00:00 UTC
MONDAY = datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp()
L4_MIB = 23034


def spec(**data) -> SliceSpec:
    return SliceSpec.from_json(data)


@pytest.fixture
def make(harness):
    """A scheduler over one dynamic-MIG A100-40GB, one L4 and two T4s, without heartbeat or idle expiry."""
    def build(**policy):
        policy.setdefault("heartbeat_ttl", 0)
        policy.setdefault("idle_timeout", 0)
        return harness(fleet({"model": A100_40, "count": 1, "mig": "dynamic"}, {"model": "L4", "count": 1},
                             {"model": "T4", "count": 2}), **policy)
    return build


def gpu_hours(h, by="user", since=0.0, until=float("inf"), now=None, user=None) -> dict:
    now = MONDAY + 30 * 24 * HOUR if now is None else now
    return {r[by]: r["gpu_hours"] for r in h.scheduler.usage.report(since, until, by, now, user=user)}


def test_shares_weigh_mig_by_compute_shared_by_memory_whole_by_count(make):
    s = make().scheduler
    m = s.submit("a", "kernel:1", spec(kind="mig", profile="3g.20gb"), now=MONDAY)
    sh = s.submit("b", "kernel:2", spec(kind="shared", memory_gib=8, model="L4"), now=MONDAY)
    w = s.submit("c", "kernel:3", spec(kind="whole", count=2, model="T4"), now=MONDAY)
    assert gpu_share(m.slice) == pytest.approx(3 / 7)
    assert gpu_share(sh.slice) == pytest.approx(8 * 1024 / L4_MIB)
    assert gpu_share(w.slice) == 2.0
    assert memory_gib(w.slice) == pytest.approx(30.0)


def test_accrual_is_exact_from_grant_to_release(make):
    h = make()
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY + 600, groups=["lab"])
    s.touch(lease.id, now=MONDAY + 600 + HOUR)
    s.release(lease.id, now=MONDAY + 600 + 2.5 * HOUR)
    assert gpu_hours(h) == {"alice": 2.5}
    assert gpu_hours(h, "group") == {"lab": 2.5}
    assert gpu_hours(h, "model") == {"T4": 2.5}
    assert gpu_hours(h, "holder_kind") == {"kernel": 2.5}
    gib = h.scheduler.usage.report(0, float("inf"), "kind", MONDAY + 9 * HOUR)
    assert gib == [{"kind": "whole", "gpu_hours": 2.5, "gib_hours": 37.5, "leases": 1}]
    s.tick(MONDAY + 5 * HOUR)
    assert gpu_hours(h) == {"alice": 2.5}  # nothing accrues after the end


def test_running_lease_is_reported_up_to_now_and_reports_clip_to_the_range(make):
    h = make()
    h.scheduler.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    assert gpu_hours(h, now=MONDAY + 2 * HOUR) == {"alice": 2.0}
    assert gpu_hours(h, since=MONDAY + HOUR, until=MONDAY + 1.5 * HOUR, now=MONDAY + 2 * HOUR) == {"alice": 0.5}
    assert gpu_hours(h, since=MONDAY + 3 * HOUR, now=MONDAY + 2 * HOUR) == {}


def test_accrual_is_split_at_utc_midnight(make):
    h = make()
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY - 2 * HOUR)
    s.touch(lease.id, now=MONDAY - HOUR)
    s.heartbeat("alice", now=MONDAY + 24 * HOUR + 3 * HOUR)  # one write spans three days
    s.release(lease.id, now=MONDAY + 24 * HOUR + 4 * HOUR)
    days = h.scheduler.usage.report(0, float("inf"), "day", MONDAY + 30 * 24 * HOUR)
    assert [(r["day"], r["gpu_hours"]) for r in days] == [("2026-11-01", 2.0), ("2026-11-02", 24.0),
                                                         ("2026-11-03", 4.0)]
    rows = h.store.load_usage(0, float("inf"))
    assert [(r.day, r.end - r.start) for r in rows] == [("2026-11-01", 2 * HOUR), ("2026-11-02", 24 * HOUR),
                                                        ("2026-11-03", 4 * HOUR)]


@pytest.mark.parametrize("offset", [-86400.0, -1.0, -0.0011, -1e-4, -6e-7, -4e-7, 0.0, 4e-7, 6e-7, 1e-4, 0.0011,
                                    1.0, 43200.5, 86399.9991])
def test_next_midnight_is_the_first_utc_midnight_after_a_time_as_its_day_says(offset):
    """By day number away from midnight, by datetime (microseconds) near it: either way the
    midnight that ends the UTC day utc_day() names, strictly after a time that is not one."""
    t = MONDAY + offset
    day = datetime.fromtimestamp(t, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    assert next_midnight(t) == day.timestamp() + 86400.0
    assert utc_day(next_midnight(t) - 1) == utc_day(t)


def test_preempted_and_idle_expired_leases_stop_accruing_when_they_end(make):
    h = make(idle_timeout=HOUR, idle_grace=600)
    s = h.scheduler
    batch = s.submit("bob", "job:1", spec(kind="whole", count=2, model="T4"), PriorityClass.BATCH, now=MONDAY)
    s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY + HOUR)
    assert s.lease(batch.id).state is LeaseState.PREEMPTED
    kernel = s.submit("carol", "kernel:2", spec(kind="shared", memory_gib=8, model="L4"), now=MONDAY)
    s.tick(MONDAY + HOUR)  # warned
    s.tick(MONDAY + HOUR + 600)  # released as idle
    assert s.lease(kernel.id).state is LeaseState.EXPIRED
    used = gpu_hours(h, now=MONDAY + 10 * HOUR)
    assert used["bob"] == 2.0
    assert used["carol"] == pytest.approx((HOUR + 600) / HOUR * 8 * 1024 / L4_MIB, abs=1e-6)


def test_restart_keeps_accrual_up_to_the_last_sign_of_life(make):
    h = make()
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", spec(kind="mig", profile="1g.5gb"), now=MONDAY)
    s.heartbeat("alice", now=MONDAY + 2 * HOUR)
    s.tick(MONDAY + 2.5 * HOUR)  # a tick stores nothing: the process dies after it
    s = h.restart(MONDAY + 3 * HOUR)  # the new process never called release or close
    assert s.lease(lease.id).state is LeaseState.GRANTED
    assert gpu_hours(h, now=MONDAY + 3 * HOUR) == {"alice": pytest.approx(2 / 7)}
    s.release(lease.id, now=MONDAY + 4 * HOUR)
    assert gpu_hours(h) == {"alice": pytest.approx(3 / 7)}  # 2 h before the crash, 1 h after


def test_offer_is_the_configured_offer_with_the_same_spec(make):
    h = make(offers=[{"name": "t4", "label": "T4", "spec": {"kind": "whole", "model": "T4"}}])
    s = h.scheduler
    a = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    b = s.submit("alice", "kernel:2", spec(kind="shared", memory_gib=4, model="L4"), now=MONDAY)
    s.release(a.id, now=MONDAY + HOUR)
    s.release(b.id, now=MONDAY + HOUR)
    assert set(gpu_hours(h, "offer")) == {"t4", ""}


def test_history_splits_each_day_by_offer_across_midnight(make):
    h = make(offers=[{"name": "t4", "label": "T4", "spec": {"kind": "whole", "model": "T4"}}])
    s = h.scheduler
    t4 = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY - 2 * HOUR)
    own = s.submit("alice", "kernel:2", spec(kind="whole", model="L4"), now=MONDAY - HOUR)  # of no offer
    s.release(own.id, now=MONDAY)
    other = s.submit("bob", "kernel:3", spec(kind="whole", model="T4"), now=MONDAY)
    s.release(other.id, now=MONDAY + HOUR)
    now = MONDAY + 3 * HOUR  # alice's T4 lease still runs: it counts up to now
    assert s.usage.history(0, float("inf"), now, user="alice") == [
        {"day": "2026-11-01", "gpu_hours": 3.0, "offers": {"t4": 2.0, "": 1.0}},
        {"day": "2026-11-02", "gpu_hours": 3.0, "offers": {"t4": 3.0}}]
    assert s.usage.history(MONDAY + HOUR, MONDAY + 2 * HOUR, now, user="alice") == [
        {"day": "2026-11-02", "gpu_hours": 1.0, "offers": {"t4": 1.0}}]
    assert [d["offers"] for d in s.usage.history(0, float("inf"), now, user="bob")] == [{"t4": 1.0}]
    assert t4.state is LeaseState.GRANTED


def test_recent_samples_cover_the_last_ten_minutes_and_end_with_the_lease(make):
    s = make().scheduler
    lease = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    assert s.usage.recent_samples(lease.id, MONDAY) == []
    for t in range(0, 900, 30):
        s.sample_gpu(lease.id, now=MONDAY + t, sm_percent=t / 10)
    recent = s.usage.recent_samples(lease.id, MONDAY + 900)
    assert recent[0] == (MONDAY + 330, 33.0) and recent[-1] == (MONDAY + 870, 87.0) and len(recent) == 19
    s.release(lease.id, now=MONDAY + 900)
    assert s.usage.recent_samples(lease.id, MONDAY + 900) == []


def test_users_see_only_their_own_rows(make):
    h = make()
    s = h.scheduler
    s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    s.submit("bob", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    assert gpu_hours(h, now=MONDAY + HOUR, user="alice") == {"alice": 1.0}
    assert gpu_hours(h, now=MONDAY + HOUR) == {"alice": 1.0, "bob": 1.0}


def test_csv_has_a_header_and_one_line_per_row():
    rows = [{"user": "alice", "gpu_hours": 1.5, "gib_hours": 24.0, "leases": 2}]
    assert to_csv(rows, "user") == "user,gpu_hours,gib_hours,leases\nalice,1.5,24.0,2\n"


@pytest.mark.parametrize("name, now, start, end", [
    ("calendar_week", MONDAY + 3 * 24 * HOUR, MONDAY, MONDAY + 7 * 24 * HOUR),
    ("calendar_week", MONDAY - 1, MONDAY - 7 * 24 * HOUR, MONDAY),
    ("calendar_week", MONDAY, MONDAY, MONDAY + 7 * 24 * HOUR),
    ("calendar_day", MONDAY + 5 * HOUR, MONDAY, MONDAY + 24 * HOUR),
    ("calendar_month", MONDAY + 5 * HOUR, datetime(2026, 11, 1, tzinfo=timezone.utc).timestamp(),
     datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp()),
    ("calendar_month", datetime(2026, 12, 31, 23, tzinfo=timezone.utc).timestamp(),
     datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp(), datetime(2027, 1, 1, tzinfo=timezone.utc).timestamp()),
    ("7d", MONDAY, MONDAY - 7 * 24 * HOUR, None),
    ("36h", MONDAY, MONDAY - 36 * HOUR, None),
])
def test_windows_roll_over_at_utc_boundaries(name, now, start, end):
    assert Window.parse(name).bounds(now) == (start, end)


@pytest.mark.parametrize("entry, message", [
    ({"gpu_hours": -1}, "gpu_hours"), ({"gpu_hours": 4, "window": "week"}, "window"),
    ({"gpu_hours": 4, "per": "team"}, "per"), ({"gpu_hours": 4, "limit": 3}, "unknown key"),
])
def test_bad_usage_quotas_are_refused_naming_the_key(entry, message):
    with pytest.raises(Exception, match=message):
        SchedulerPolicy(usage_quotas={"alice": entry})


def test_calendar_quota_refuses_with_a_sentence_and_resets_on_monday(make):
    h = make(usage_quotas={"*": {"gpu_hours": 4, "window": "calendar_week"}})
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY + 24 * HOUR)
    s.release(lease.id, now=MONDAY + 28 * HOUR)
    with pytest.raises(QuotaExceeded) as err:
        s.submit("alice", "kernel:2", spec(kind="shared", memory_gib=4, model="L4"), now=MONDAY + 30 * HOUR)
    assert str(err.value) == "you have used 4.00 of 4 GPU-hours this week (resets Mon 2026-11-09 00:00 UTC)"
    assert err.value.key == "gpu_hours"
    s.submit("bob", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY + 30 * HOUR)  # bob has his own
    granted = s.submit("alice", "kernel:2", spec(kind="whole", model="T4"), now=MONDAY + 7 * 24 * HOUR)
    assert granted.state is LeaseState.GRANTED


def test_rolling_quota_says_when_usage_falls_under_the_limit(make):
    h = make(usage_quotas={"alice": {"gpu_hours": 2, "window": "24h"}})
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    s.release(lease.id, now=MONDAY + 2 * HOUR)
    status = s.usage.refusal("alice", (), MONDAY + 3 * HOUR)
    assert status.used == 2.0 and status.resets_at == MONDAY + 24 * HOUR + 1
    assert s.usage.refusal("alice", (), MONDAY + 24 * HOUR + 2) is None


def test_group_quota_counts_members_together(make):
    h = make(usage_quotas={"students": {"gpu_hours": 3, "window": "calendar_day", "per": "group"}})
    s = h.scheduler
    a = s.submit("ann", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY, groups=["students"])
    b = s.submit("ben", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY, groups=["students"])
    s.release(a.id, now=MONDAY + 1.5 * HOUR)
    s.release(b.id, now=MONDAY + 1.5 * HOUR)
    with pytest.raises(QuotaExceeded, match=r"group students has used 3.00 of 3 GPU-hours today"):
        s.submit("cat", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY + 2 * HOUR, groups=["students"])
    s.submit("dan", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY + 2 * HOUR, groups=["staff"])


def test_running_lease_is_warned_at_90_percent_then_released_at_the_limit(make):
    h = make(usage_quotas={"*": {"gpu_hours": 10, "window": "7d"}}, usage_enforcement="release")
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    job = s.submit("bob", "job:1", spec(kind="whole", model="T4"), PriorityClass.BATCH, now=MONDAY)
    s.tick(MONDAY + 8.9 * HOUR)
    assert "usage.warning" not in h.types()
    s.tick(MONDAY + 9 * HOUR)
    warnings = [e for e in h.events if e.type == "usage.warning"]
    assert {e.lease_id for e in warnings} == {lease.id, job.id}
    assert warnings[0].data["message"].startswith("you have used 9.00 of 10 GPU-hours in the last 7d")
    s.tick(MONDAY + 9.5 * HOUR)
    assert h.types().count("usage.warning") == 2  # once per lease
    s.tick(MONDAY + 10 * HOUR)
    assert s.lease(lease.id).state is LeaseState.EXPIRED
    assert s.lease(lease.id).reason.startswith("usage quota used up: you have used 10.00 of 10 GPU-hours")
    assert s.lease(job.id).state is LeaseState.GRANTED  # a job finishes its attempt
    assert [e.lease_id for e in h.events if e.type == "usage.exceeded"] == [lease.id, job.id]


def test_warn_enforcement_keeps_the_slice(make):
    h = make(usage_quotas={"*": {"gpu_hours": 1, "window": "calendar_day"}})
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    s.tick(MONDAY + HOUR)
    s.tick(MONDAY + 2 * HOUR)
    assert s.lease(lease.id).state is LeaseState.GRANTED
    assert h.types().count("usage.exceeded") == 1


def test_gpu_signal_releases_a_lease_busy_on_cpu_whose_gpu_stays_idle(make):
    h = make(idle_timeout=HOUR, idle_grace=600, idle_signal="gpu", gpu_idle_threshold=5)
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    s.sample_gpu(lease.id, now=MONDAY + 60, sm_percent=80)  # training
    s.sample_gpu(lease.id, now=MONDAY + 600, sm_percent=1)  # then CPU work only
    s.touch(lease.id, now=MONDAY + 600, busy=True)
    s.tick(MONDAY + 60 + HOUR - 1)
    assert "lease.idle_warning" not in h.types()
    s.tick(MONDAY + 60 + HOUR)  # last seen active at the 60 s sample
    assert "lease.idle_warning" in h.types()
    s.touch(lease.id, now=MONDAY + 60 + HOUR + 10, last_activity=MONDAY + 60 + HOUR + 10)
    assert "lease.idle_cleared" not in h.types()  # activity does not count with the gpu signal
    s.tick(MONDAY + 60 + HOUR + 600)
    assert s.lease(lease.id).state is LeaseState.EXPIRED


def test_an_active_gpu_clears_the_warning_and_both_needs_both_idle(make):
    h = make(idle_timeout=HOUR, idle_grace=600, idle_signal="both")
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    s.sample_gpu(lease.id, now=MONDAY + 10, sm_percent=0)
    s.tick(MONDAY + HOUR + 10)
    assert "lease.idle_warning" in h.types()
    s.sample_gpu(lease.id, now=MONDAY + HOUR + 20, sm_percent=50)
    assert "lease.idle_cleared" in h.types()
    s.tick(MONDAY + HOUR + 20 + HOUR - 1)  # activity is old, but the GPU was active an hour ago
    assert h.types().count("lease.idle_warning") == 1
    s.touch(lease.id, now=MONDAY + 2 * HOUR, busy=True)
    s.tick(MONDAY + 5 * HOUR)  # a busy kernel is not idle under "both"
    assert s.lease(lease.id).state is LeaseState.GRANTED


def test_without_samples_activity_decides_even_with_the_gpu_signal(make):
    h = make(idle_timeout=HOUR, idle_grace=600, idle_signal="gpu")
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    s.touch(lease.id, now=MONDAY + 10, busy=True)
    s.tick(MONDAY + 3 * HOUR)
    assert s.lease(lease.id).state is LeaseState.GRANTED


def test_efficiency_lists_busy_gpu_hours_against_held_ones(make):
    h = make()
    s = h.scheduler
    idle = s.submit("alice", "kernel:1", spec(kind="whole", count=2, model="T4"), now=MONDAY)
    busy = s.submit("bob", "kernel:1", spec(kind="shared", memory_gib=8, model="L4"), now=MONDAY)
    for t, a, b in ((0, 2, 90), (HOUR, 2, 90), (2 * HOUR, 2, 90)):
        s.sample_gpu(idle.id, now=MONDAY + t, sm_percent=a)
        s.sample_gpu(busy.id, now=MONDAY + t, sm_percent=b)
    rows = s.usage.efficiency(MONDAY, MONDAY + 7 * 24 * HOUR, MONDAY + 2 * HOUR)
    assert [r["user"] for r in rows] == ["alice", "bob"]
    assert rows[0]["gpu_hours"] == 4.0 and rows[0]["busy_gpu_hours"] == pytest.approx(0.08)
    assert rows[0]["efficiency"] == 0.02
    assert rows[0]["message"] == "alice's kernel holds 30 GiB, used 2% of its 4.00 GPU-hours"
    assert rows[1]["efficiency"] == 0.9
    assert s.usage.efficiency(MONDAY, MONDAY + HOUR, MONDAY + 2 * HOUR, user="bob")[0]["user"] == "bob"


def test_a_release_the_store_refused_keeps_accruing_exactly(tmp_path):
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError

    from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
    from jupyter_gpualloc.core.scheduler import Scheduler, StoreFailed
    from jupyter_gpualloc.core.store import Store, sqlite_url

    store = Store(sqlite_url(tmp_path / "flaky.sqlite"))
    failing = []

    def drop_the_lease_write(conn, cursor, statement, parameters, context, executemany):
        if failing and statement.lstrip().startswith("INSERT INTO meta"):
            failing.clear()
            raise OperationalError(statement, parameters, ConnectionError("connection lost"))

    event.listen(store.engine, "before_cursor_execute", drop_the_lease_write)
    s = Scheduler(SimulatedBackend(fleet({"model": "T4", "count": 1})), store,
                  SchedulerPolicy(heartbeat_ttl=0, idle_timeout=0, max_duration={"kernel": 10 * HOUR}), now=MONDAY)
    lease = s.submit("alice", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    failing.append(True)
    with pytest.raises(StoreFailed):
        s.release(lease.id, now=MONDAY + HOUR)
    assert s.lease(lease.id).state is LeaseState.GRANTED
    assert s.deadlines.of(lease.id).deadline == MONDAY + 10 * HOUR
    s.release(lease.id, now=MONDAY + 3 * HOUR)
    report = s.usage.report(0, float("inf"), "user", MONDAY + 5 * HOUR)
    assert [(r["user"], r["gpu_hours"]) for r in report] == [("alice", 3.0)]
    store.close()


CHILD = """
import sys
from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store

fleet = {"nodes": [{"name": "n0", "cpu_milli": 8000, "memory_mib": 65536, "gpus": [{"model": "T4", "count": 1}]}]}
start = float(sys.argv[2])
s = Scheduler(SimulatedBackend(fleet), Store(sys.argv[1]), SchedulerPolicy(heartbeat_ttl=0, idle_timeout=0), now=start)
lease = s.submit("alice", "kernel:1", SliceSpec.from_json({"kind": "whole"}), now=start, lease_id="L")
s.heartbeat("alice", now=start + 5400)
s.tick(start + 7000)
print("ready", flush=True)
sys.stdin.readline()
"""


def test_sigkill_loses_no_accrual_before_the_last_heartbeat(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
    from jupyter_gpualloc.core.scheduler import Scheduler
    from jupyter_gpualloc.core.store import Store, sqlite_url

    url = sqlite_url(tmp_path / "killed.sqlite")
    child = subprocess.Popen([sys.executable, "-c", CHILD, url, str(MONDAY)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert child.stdout.readline().strip() == "ready"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    fleet_dict = {"nodes": [{"name": "n0", "cpu_milli": 8000, "memory_mib": 65536,
                             "gpus": [{"model": "T4", "count": 1}]}]}
    store = Store(url)
    s = Scheduler(SimulatedBackend(fleet_dict), store, SchedulerPolicy(heartbeat_ttl=0, idle_timeout=0),
                  now=MONDAY + 3 * HOUR)
    assert s.lease("L").state is LeaseState.GRANTED
    assert s.usage.report(0, float("inf"), "user", MONDAY + 3 * HOUR) == [
        {"user": "alice", "gpu_hours": 1.5, "gib_hours": 22.5, "leases": 1}]  # up to the heartbeat at 1.5 h
    s.release("L", now=MONDAY + 4 * HOUR)
    assert s.usage.report(0, float("inf"), "user", MONDAY + 5 * HOUR)[0]["gpu_hours"] == 2.5
    store.close()


def test_a_queued_request_is_not_granted_once_its_usage_quota_is_used_up(make):
    h = make(usage_quotas={"alice": {"gpu_hours": 2, "window": "calendar_day"}})
    s = h.scheduler
    bob = s.submit("bob", "kernel:1", spec(kind="whole", model="T4"), now=MONDAY)
    s.submit("bob", "kernel:2", spec(kind="whole", model="T4"), now=MONDAY)
    mine = s.submit("alice", "kernel:1", spec(kind="shared", memory_gib=23034 / 1024, model="L4"), now=MONDAY)
    job = s.submit("alice", "job:1", spec(kind="whole", model="T4"), PriorityClass.BATCH, now=MONDAY)
    assert job.state is LeaseState.QUEUED
    s.release(mine.id, now=MONDAY + 2 * HOUR)  # alice has used her 2 GPU-hours of today
    s.release(bob.id, now=MONDAY + 3 * HOUR)
    queued = s.lease(job.id)
    assert queued.state is LeaseState.QUEUED
    assert queued.reason == "you have used 2.00 of 2 GPU-hours today (resets Tue 2026-11-03 00:00 UTC)"
    s.tick(MONDAY + 24 * HOUR)  # a new day
    assert s.lease(job.id).state is LeaseState.GRANTED
