"""GET /events resumes: event ids, replay after Last-Event-ID or ?since=, and stream.reset when it cannot."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import time
from urllib.parse import quote

import pytest

from jupyter_gpualloc import client as gc

from .conftest import ALICE, BOB, ROOT

MIG = {"kind": "mig", "profile": "1g.5gb"}


def base_url(service) -> str:
    return service.url[: -len("api/v1/")]


class Reader:
    """One user's event stream through the client, resumable: `open()` again goes on from `position`."""

    def __init__(self, service, token: str):
        self.client = gc.GpuAllocClient(base_url(service), token)
        self.position = gc.StreamPosition()
        self.events: list[dict] = []
        self._task: asyncio.Task | None = None

    async def open(self) -> None:
        async def follow():
            async for event in self.client.events(position=self.position):
                self.events.append(event)

        self._task = asyncio.ensure_future(follow())
        # the opening comment carries the stream's position: once read, the service streams to us
        await until(lambda: self.position.last_id is not None)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def wait_for(self, count: int) -> list[dict]:
        await until(lambda: len(self.events) >= count)
        return self.events


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def types(events: list[dict]) -> list[tuple[str, str | None]]:
    return [(e["type"], e["lease_id"]) for e in events]


def counter(event_id: str) -> int:
    return int(event_id.rsplit("-", 1)[1])


def test_a_resumed_stream_replays_what_was_missed_in_order_then_goes_on_live(service):
    async def scenario():
        alice = Reader(service, ALICE)
        await alice.open()
        first = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:a1"}, ALICE).json()
        await alice.wait_for(1)
        await alice.close()
        seen_live = list(alice.events)
        # while alice's stream is down: her changes, another user's, an admin's drain
        service.call("DELETE", f"leases/{first['id']}", token=ALICE)
        bobs = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:b1"}, BOB).json()
        second = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:a2"}, ALICE).json()
        service.call("DELETE", f"leases/{bobs['id']}", token=BOB)
        service.call("DELETE", f"leases/{second['id']}", token=ALICE)
        await alice.open()
        await alice.wait_for(4)
        third = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:a3"}, ALICE).json()
        await alice.wait_for(5)
        await asyncio.sleep(0.3)  # nothing more comes: no event twice
        await alice.close()
        await alice.client.close()
        assert types(seen_live) == [("lease.granted", first["id"])]
        assert types(alice.events) == [
            ("lease.granted", first["id"]), ("lease.released", first["id"]), ("lease.granted", second["id"]),
            ("lease.released", second["id"]), ("lease.granted", third["id"])]
        ids = [counter(e["id"]) for e in alice.events]
        assert ids == sorted(set(ids)), ids
        assert len({e["id"].split("-")[0] for e in alice.events}) == 1
        service.call("DELETE", f"leases/{third['id']}", token=ALICE)

    asyncio.run(scenario())


def test_a_reader_that_takes_the_position_first_misses_nothing_before_its_stream_opens(service):
    async def scenario():
        async with gc.GpuAllocClient(base_url(service), ALICE) as alice:
            start = await alice.event_position()
            lease = await alice.request_lease(MIG, "kernel:p1")  # e.g. while the reader reads the state
            async for event in alice.events(position=gc.StreamPosition(start)):
                break
            await alice.release(lease["id"])
        assert (event["type"], event["lease_id"], counter(event["id"])) == ("lease.granted", lease["id"],
                                                                          counter(start) + 1)

    asyncio.run(scenario())


def raw_stream(service, token: str, path: str = "events", headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    conn.request("GET", "/api/v1/" + path, headers={"Authorization": f"Bearer {token}", **(headers or {})})
    return conn, conn.getresponse()


def read_messages(response, count: int) -> list[dict[str, str]]:
    """The next `count` messages of an SSE response, as {field: value} (comments as ':')."""
    messages, fields = [], {}
    while len(messages) < count:
        line = response.readline().decode().rstrip("\n")
        if not line:
            messages.append(fields)
            fields = {}
            continue
        name, _, value = line.partition(":")
        fields[name or ":"] = value.removeprefix(" ")
    return messages


def test_since_replays_on_the_wire_and_another_users_events_are_never_replayed(service):
    conn, response = raw_stream(service, BOB, "events?fleet=1")
    opening = read_messages(response, 1)[0]
    assert opening[":"] == "connected" and opening["id"]
    conn.close()
    alices = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:a1"}, ALICE).json()
    bobs = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:b1"}, BOB).json()
    uuid = service.call("GET", "inventory", token=ROOT).json()["nodes"][0]["gpus"][-1]["uuid"]
    service.call("POST", f"gpus/{uuid}/drain", token=ROOT)
    service.call("DELETE", f"leases/{alices['id']}", token=ALICE)
    conn, response = raw_stream(service, BOB, f"events?fleet=1&since={quote(opening['id'])}")
    assert response.status == 200
    opening_again, granted, drained = read_messages(response, 3)
    conn.close()
    assert opening_again["id"] == opening["id"]
    for message in (granted, drained):
        assert json.loads(message["data"])["id"] == message["id"]
    assert (json.loads(granted["data"])["type"], json.loads(granted["data"])["lease_id"]) == ("lease.granted", bobs["id"])
    assert json.loads(drained["data"])["type"] == "gpu.drained"
    assert "lease_id" not in json.loads(drained["data"])["data"]
    assert counter(opening["id"]) < counter(granted["id"]) < counter(drained["id"])
    # the admin sees alice's lease in the same replay; bob never did
    conn, response = raw_stream(service, ROOT, headers={"Last-Event-ID": opening["id"]})
    replayed = [json.loads(m["data"]) for m in read_messages(response, 5)[1:]]
    conn.close()
    assert [(e["type"], e["lease_id"]) for e in replayed] == [
        ("lease.granted", alices["id"]), ("lease.granted", bobs["id"]), ("gpu.drained", None),
        ("lease.released", alices["id"])]
    service.call("DELETE", f"gpus/{uuid}/drain", token=ROOT)


@pytest.mark.parametrize("query,headers,field", [
    ("?since=yesterday", {}, "since"), ("?since=abc-01", {}, "since"), ("?since=abc-1%0A", {}, "since"),
    ("?since=a-1&since=a-2", {}, "since"), ("", {"Last-Event-ID": "not an id"}, "Last-Event-ID"),
    ("?since=abc-1", {"Last-Event-ID": "abc-"}, "Last-Event-ID")])
def test_a_malformed_resume_point_is_a_400_naming_it(service, query, headers, field):
    conn, response = raw_stream(service, ALICE, "events" + query, headers)
    body = response.read()
    conn.close()
    assert response.status == 400 and response.headers["Content-Type"].startswith("application/json")
    assert json.loads(body)["field"] == field, body


def test_a_client_that_sends_no_id_gets_the_live_events_only_now_with_their_ids(service):
    service.call("DELETE", "leases/" + service.call("POST", "leases", {"spec": MIG, "holder": "kernel:x"},
                                                     ALICE).json()["id"], token=ALICE)
    conn, response = raw_stream(service, ALICE)
    assert response.readline() == b": connected\n"
    lease = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:y"}, ALICE).json()
    (message,) = read_messages(response, 2)[1:]
    conn.close()
    event = json.loads(message["data"])
    assert (event["type"], event["lease_id"]) == ("lease.granted", lease["id"])
    assert event["id"] == message["id"] and set(event) == {"type", "time", "lease_id", "user", "data", "id"}


def read_until_reset(service, token: str, last_id: str) -> dict:
    conn, response = raw_stream(service, token, headers={"Last-Event-ID": last_id})
    opening, reset = read_messages(response, 2)
    conn.close()
    event = json.loads(reset["data"])
    assert event["type"] == "stream.reset" and event["id"] == reset["id"] == opening["id"], (opening, reset)
    assert event["data"]["last_event_id"] == last_id
    return event


def test_a_stream_resumed_past_what_the_service_keeps_starts_with_a_reset(fresh_service):
    service = fresh_service(args=("--GpuAllocService.event_replay_size=3",)).start()
    conn, response = raw_stream(service, ALICE)
    start = read_messages(response, 1)[0]["id"]
    conn.close()
    for holder in ("kernel:1", "kernel:2"):
        lease = service.call("POST", "leases", {"spec": MIG, "holder": holder}, ALICE).json()
        service.call("DELETE", f"leases/{lease['id']}", token=ALICE)  # 4 events: the first is no longer kept
    reset = read_until_reset(service, ALICE, start)
    assert "no longer kept" in reset["data"]["reason"] and counter(reset["id"]) == counter(start) + 4
    epoch = start.split("-")[0]
    assert "no event" in read_until_reset(service, ALICE, f"{epoch}-{counter(start) + 99}")["data"]["reason"]
    # from the reset's id the stream goes on without a gap
    conn, response = raw_stream(service, ALICE, headers={"Last-Event-ID": reset["id"]})
    lease = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:3"}, ALICE).json()
    event = json.loads(read_messages(response, 2)[1]["data"])
    conn.close()
    assert (event["type"], event["lease_id"], counter(event["id"])) == ("lease.granted", lease["id"],
                                                                      counter(reset["id"]) + 1)


def test_a_restarted_service_answers_an_id_of_its_previous_run_with_a_reset(fresh_service):
    service = fresh_service().start()
    service.call("POST", "leases", {"spec": MIG, "holder": "kernel:1"}, ALICE)
    conn, response = raw_stream(service, ALICE)
    before = read_messages(response, 1)[0]["id"]
    conn.close()
    service.kill(signal.SIGTERM)
    service.start()
    reset = read_until_reset(service, ALICE, before)
    assert "restarted" in reset["data"]["reason"]
    assert reset["id"].split("-")[0] != before.split("-")[0]
