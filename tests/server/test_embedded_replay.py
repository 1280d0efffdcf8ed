"""Embedded mode keeps events for resuming streams as the service does, as many as its own setting says."""

from __future__ import annotations

import json

import pytest

from jupyter_gpualloc.service.auth import Identity
from jupyter_gpualloc.service.events import parse_event_id

from .conftest import extension_config

MIG = {"kind": "mig", "profile": "1g.5gb"}


@pytest.fixture
def jp_server_config(tmp_path):
    return extension_config(tmp_path, GpuAllocExtension={"event_replay_size": 3})


async def first_of_stream_after(broker, event_id: str) -> dict:
    """What a stream resumed after `event_id` sends first (the owner, an admin, sees every event)."""
    stream = broker.open_stream(Identity("owner", admin=True), parse_event_id(event_id))
    try:
        message = await stream.next(timeout=0)
        return json.loads(message.split(b"\ndata: ", 1)[1])
    finally:
        broker.close_stream(stream)


async def test_a_stream_resumed_past_the_servers_replay_size_starts_with_a_reset(gpualloc, jp_fetch):
    broker = gpualloc.embedded.broker
    for holder in ("kernel:a", "kernel:b"):  # each makes an instance, grants, releases: more than three events
        lease = json.loads((await jp_fetch("gpualloc", "api", "v1", "leases", method="POST",
                                           body=json.dumps({"spec": MIG, "holder": holder}))).body)
        await jp_fetch("gpualloc", "api", "v1", "leases", lease["id"], method="DELETE")
    epoch, last = parse_event_id(broker.position)
    replayed = await first_of_stream_after(broker, f"{epoch}-{last - 3}")  # the last three are kept
    assert replayed["id"] == f"{epoch}-{last - 2}" and replayed["type"] != "stream.reset", replayed
    reset = await first_of_stream_after(broker, f"{epoch}-{last - 4}")
    assert reset["type"] == "stream.reset" and "keeps its last 3" in reset["data"]["reason"], reset
