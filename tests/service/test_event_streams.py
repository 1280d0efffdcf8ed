"""GET /events sends each stream what its caller may see and asked for, each event serialised once."""

from __future__ import annotations

import http.client
import json
import re
import time

from .conftest import ALICE, BOB, CAROL, ROOT

MIG = {"kind": "mig", "profile": "1g.5gb"}


def open_stream(service, token: str, query: str = ""):
    """GET /events opened (its opening comment read: the service streams to it from now on)."""
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    conn.request("GET", "/api/v1/events" + query, headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    assert response.readline() == b": connected\n"
    assert response.readline().startswith(b"id: ")
    assert response.readline() == b"\n"
    return conn, response


def next_messages(response, count: int) -> list[bytes]:
    """The next `count` event messages, as sent (`id:` and `data:` lines)."""
    messages, lines = [], []
    while len(messages) < count:
        line = response.readline()
        if line == b"\n":
            if lines and not lines[0].startswith(b":"):  # keep-alives are comments
                messages.append(b"".join(lines))
            lines = []
        else:
            lines.append(line)
    return messages


def events_of(messages: list[bytes]) -> list[dict]:
    return [json.loads(m.split(b"\ndata: ", 1)[1]) for m in messages]


def kinds(events: list[dict]) -> list[tuple[str, str | None]]:
    return [(e["type"], e["lease_id"]) for e in events]


def metric(service, name: str) -> float:
    text = service.call("GET", "metrics", token=ROOT).text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} is not in /metrics"
    return float(found.group(1))


def l4_uuid(service) -> str:
    gpus = service.call("GET", "inventory", token=ROOT).json()["nodes"][0]["gpus"]
    return [g["uuid"] for g in gpus if g["model"] == "L4"][-1]


def test_fleet_events_go_to_the_streams_that_ask_and_nobody_sees_another_users_lease(service):
    streams = {"bob": open_stream(service, BOB), "bob fleet": open_stream(service, BOB, "?fleet=1"),
               "root": open_stream(service, ROOT), "root no fleet": open_stream(service, ROOT, "?fleet=0"),
               "carol": open_stream(service, CAROL)}
    uuid = l4_uuid(service)
    alices = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:a1"}, ALICE).json()
    service.call("POST", f"gpus/{uuid}/drain", token=ROOT)
    bobs = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:b1"}, BOB).json()
    service.call("DELETE", f"gpus/{uuid}/drain", token=ROOT)
    service.call("DELETE", f"leases/{bobs['id']}", token=BOB)
    carols = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:c1"}, CAROL).json()
    service.call("DELETE", f"leases/{carols['id']}", token=CAROL)
    service.call("DELETE", f"leases/{alices['id']}", token=ALICE)
    bob, carol = [("lease.granted", bobs["id"]), ("lease.released", bobs["id"])], \
        [("lease.granted", carols["id"]), ("lease.released", carols["id"])]
    expected = {
        "bob": bob,  # fleet events came between and before his: they were not sent
        "bob fleet": [("gpu.drained", None), bob[0], ("gpu.undrained", None), bob[1]],
        "root": [("lease.granted", alices["id"]), ("gpu.drained", None), bob[0], ("gpu.undrained", None), bob[1],
                 *carol, ("lease.released", alices["id"])],
        "root no fleet": [("lease.granted", alices["id"]), *bob, *carol, ("lease.released", alices["id"])],
        "carol": carol,
    }
    seen = {}
    for name, (conn, response) in streams.items():
        seen[name] = events_of(next_messages(response, len(expected[name])))
        conn.close()
    assert {name: kinds(events) for name, events in seen.items()} == expected
    drained = seen["bob fleet"][0]
    assert drained["data"] == {"gpu": uuid} and drained["user"] is None
    assert seen["root"][1]["data"]["gpu"] == uuid


def test_a_stream_asks_for_the_fleet_with_0_or_1(service):
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    conn.request("GET", "/api/v1/events?fleet=yes", headers={"Authorization": f"Bearer {BOB}"})
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 400 and body["field"] == "fleet", body


def test_each_event_is_serialised_once_for_every_stream_that_sends_it(service):
    admins = [open_stream(service, ROOT) for _ in range(3)]
    bobs = [open_stream(service, BOB, "?fleet=1") for _ in range(3)]
    carol = open_stream(service, CAROL)  # asked for no fleet events, and none of these is hers
    serialised, sent = metric(service, "gpualloc_event_messages_serialised_total"), \
        metric(service, "gpualloc_event_messages_sent_total")
    deadline = time.monotonic() + 10  # the streams the other tests closed: gone once the service saw them close
    while metric(service, "gpualloc_event_streams") != 7:
        assert time.monotonic() < deadline, metric(service, "gpualloc_event_streams")
        time.sleep(0.05)
    uuid = l4_uuid(service)
    service.call("POST", f"gpus/{uuid}/drain", token=ROOT)
    lease = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:b2"}, BOB).json()
    service.call("DELETE", f"leases/{lease['id']}", token=BOB)
    service.call("DELETE", f"gpus/{uuid}/drain", token=ROOT)
    # drained and undrained: whole for the admins, without lease ids for bob; bob's lease: whole for all
    assert metric(service, "gpualloc_event_messages_serialised_total") - serialised == 2 + 1 + 1 + 2
    assert metric(service, "gpualloc_event_messages_sent_total") - sent == 4 * 6
    got = []
    for conn, response in admins + bobs:
        got.append(next_messages(response, 4))
        conn.close()
    carol[0].close()
    assert got[0] == got[1] == got[2] and got[3] == got[4] == got[5]
    assert kinds(events_of(got[3])) == [("gpu.drained", None), ("lease.granted", lease["id"]),
                                        ("lease.released", lease["id"]), ("gpu.undrained", None)]
    assert got[0][1:3] == got[3][1:3]  # bob's own events: the same message as the admins'
