"""Reservations in embedded mode (`jupyter lab` on one workstation): the same REST API, the same core."""

from __future__ import annotations

import json
import time

import pytest
from tornado.httpclient import HTTPClientError

MIG = {"kind": "mig", "profile": "1g.5gb"}


async def call(jp_fetch, method, *path, body=None):
    kwargs = {"method": method} if body is None else {"method": method, "body": json.dumps(body)}
    return json.loads((await jp_fetch("gpualloc", "api", "v1", *path, **kwargs)).body)


async def test_the_owner_reserves_and_is_served_from_the_reservation(gpualloc, jp_fetch):
    owner = (await call(jp_fetch, "GET", "user"))["user"]
    now = time.time()
    with pytest.raises(HTTPClientError) as refused:
        await call(jp_fetch, "POST", "reservations", body={"name": "big", "users": [owner], "spec": MIG,
                                                            "count": 8, "start": now, "end": now + 60})
    assert refused.value.code == 409 and json.loads(refused.value.response.body)["fits"] == 7
    made = await call(jp_fetch, "POST", "reservations", body={"name": "lab", "users": [owner], "spec": MIG,
                                                               "count": 2, "start": now - 60, "end": now + 3600})
    assert made["state"] == "active" and made["summary"].startswith("lab reservation: 2 of 2 free until ")
    lease = await call(jp_fetch, "POST", "leases", body={"spec": MIG, "holder": "kernel:k1"})
    assert lease["state"] == "granted" and lease["reservation"] == "lab"
    assert lease["deadline"]["at"] == made["next_end"]
    [listed] = (await call(jp_fetch, "GET", "reservations"))["reservations"]
    assert listed["in_use"] == 1 and listed["free"] == 1
    sidebar = json.loads((await jp_fetch("gpualloc", "api", "reservations")).body)["reservations"]
    assert [r["summary"] for r in sidebar] == [listed["summary"]]  # the sidebar's line, above its offers
    assert listed["summary"].startswith("lab reservation: 1 of 2 free until ")
    await call(jp_fetch, "DELETE", "leases", lease["id"])
    await call(jp_fetch, "DELETE", "reservations", "lab")
    assert (await call(jp_fetch, "GET", "reservations"))["reservations"] == []
