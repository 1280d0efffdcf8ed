"""The sidebar's usage and deadline routes, in embedded mode: my quotas and a time-boxed lease's extension."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from tests.server.conftest import extension_config


@pytest.fixture
def jp_server_config(tmp_path):
    return extension_config(tmp_path, SchedulerPolicy={
        "max_duration": {"server": 3600}, "max_extensions": 1, "extension": 600,
        "usage_quotas": {"*": {"gpu_hours": 40, "window": "calendar_week"}}})


async def post(jp_fetch, *path, body):
    return json.loads((await jp_fetch("gpualloc", "api", *path, method="POST", body=json.dumps(body))).body)


async def test_usage_shows_my_quota(gpualloc, jp_fetch):
    usage = json.loads((await jp_fetch("gpualloc", "api", "usage")).body)
    [quota] = usage["quotas"]
    assert quota["scope"] == "user" and quota["limit"] == 40 and quota["window"] == "calendar_week"
    assert quota["message"].startswith("you have used 0.00 of 40 GPU-hours")
    assert usage["user"] == quota["who"]  # the caller's own report, even though the embedded owner is an admin


async def test_deadline_extension_once_then_refused_in_words(gpualloc, jp_fetch):
    lease = await post(jp_fetch, "request", body={"offer": "shared-8gb"})
    deadline = lease["deadline"]
    assert deadline["extensions_left"] == 1 and deadline["at"] == pytest.approx(lease["granted_at"] + 3600)
    extended = await post(jp_fetch, "deadline", "extend", body={"lease_id": lease["id"]})
    assert extended["deadline"]["extensions_left"] == 0
    assert extended["deadline"]["at"] == pytest.approx(deadline["at"] + 600)
    with pytest.raises(HTTPClientError) as refused:
        await post(jp_fetch, "deadline", "extend", body={"lease_id": lease["id"]})
    assert refused.value.code == 409
    assert "used its 1 extension(s)" in json.loads(refused.value.response.body)["message"]
    with pytest.raises(HTTPClientError) as bad:
        await post(jp_fetch, "deadline", "extend", body={"lease_id": 7})
    assert bad.value.code == 400
