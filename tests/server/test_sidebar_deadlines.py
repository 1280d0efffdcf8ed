"""The sidebar's usage and deadline routes, in embedded mode: my quotas and a time-boxed lease's extension."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_events import EventLogger

from jupyter_gpualloc.server.events import GpuAllocEvents
from tests.server.conftest import extension_config, wait_for


@pytest.fixture
def jp_server_config(tmp_path):
    return extension_config(tmp_path, SchedulerPolicy={
        "max_duration": {"server": 3600}, "max_extensions": 1, "extension": 600,
        "usage_quotas": {"*": {"gpu_hours": 40, "window": "calendar_week"}}, "usage_warn_fraction": 0.75})


async def post(jp_fetch, *path, body):
    return json.loads((await jp_fetch("gpualloc", "api", *path, method="POST", body=json.dumps(body))).body)


async def test_usage_shows_my_quota(gpualloc, jp_fetch):
    usage = json.loads((await jp_fetch("gpualloc", "api", "usage")).body)
    [quota] = usage["quotas"]
    assert quota["scope"] == "user" and quota["limit"] == 40 and quota["window"] == "calendar_week"
    assert quota["warn_fraction"] == 0.75  # the sidebar marks the quota almost used up from there
    assert quota["message"].startswith("you have used 0.00 of 40 GPU-hours")
    assert usage["user"] == quota["who"]  # the caller's own report, even though the embedded owner is an admin


async def test_deadline_extension_once_then_refused_in_words(gpualloc, jp_fetch, events):
    lease = await post(jp_fetch, "request", body={"offer": "shared-8gb"})
    deadline = lease["deadline"]
    assert deadline["extensions_left"] == 1 and deadline["at"] == pytest.approx(lease["granted_at"] + 3600)
    extended = await post(jp_fetch, "deadline", "extend", body={"lease_id": lease["id"]})
    assert extended["deadline"]["extensions_left"] == 0
    assert extended["deadline"]["at"] == pytest.approx(deadline["at"] + 600)
    relayed = await wait_for(lambda: [d for t, d in events if t == "lease.extended"])
    assert relayed[0]["deadline"] == pytest.approx(extended["deadline"]["at"])
    assert (relayed[0]["extensions"], relayed[0]["extensions_left"]) == (1, 0)
    with pytest.raises(HTTPClientError) as refused:
        await post(jp_fetch, "deadline", "extend", body={"lease_id": lease["id"]})
    assert refused.value.code == 409
    assert "used its 1 extension(s)" in json.loads(refused.value.response.body)["message"]
    with pytest.raises(HTTPClientError) as bad:
        await post(jp_fetch, "deadline", "extend", body={"lease_id": 7})
    assert bad.value.code == 400


async def test_a_deadline_warning_is_relayed_with_the_deadline_and_the_extensions_left():
    seen: list[tuple[str, dict]] = []

    async def listener(event_type: str, data: dict) -> None:
        seen.append((event_type, data))

    events = GpuAllocEvents(EventLogger())
    events.add_listener(listener)
    events.relay_lease_event({"type": "lease.deadline_warning", "time": 100.0, "lease_id": "l1", "user": "alice",
                              "data": {"state": "granted", "holder": "kernel:k1", "deadline": 1000.0,
                                       "release_at": 1000.0, "extensions_left": 2}})
    await wait_for(lambda: seen)
    [(event_type, data)] = seen
    assert event_type == "lease.deadline_warning" and data["kernel_id"] == "k1"
    assert (data["deadline"], data["release_at"], data["extensions_left"]) == (1000.0, 1000.0, 2)
