"""jupyter_gpualloc.client against a real service: typed errors, events, discovery, retries, sync wrapper."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from jupyter_gpualloc import client as gc
from tests.hubfixture import free_port

from .conftest import ALICE, BOB, CAROL, ROOT

MIG = {"kind": "mig", "profile": "1g.5gb"}
WHOLE_L4 = {"kind": "whole", "model": "L4"}


def base_url(service) -> str:
    return service.url[: -len("api/v1/")]


def test_lease_life_cycle_and_typed_errors(service):
    async def scenario():
        async with gc.GpuAllocClient(base_url(service), ALICE) as alice, \
                gc.GpuAllocClient(base_url(service), CAROL) as carol, \
                gc.GpuAllocClient(base_url(service), ROOT) as root:
            assert (await alice.health())["status"] == "ok"
            assert (await alice.whoami())["user"] == "alice"
            assert any(o["spec"].get("profile") == "1g.5gb" for o in await alice.offers())
            lease = await alice.request_lease(MIG, "kernel:k1", wait=5)
            assert lease["state"] == "granted"
            assert (await alice.lease(lease["id"]))["slice"] == lease["slice"]
            assert [l["id"] for l in await alice.leases()] == [lease["id"]]
            touched = await alice.touch(lease["id"], busy=True, last_activity=time.time())
            assert touched["busy"] is True
            assert [l["id"] for l in await alice.heartbeat()] == [lease["id"]]
            with pytest.raises(gc.HolderBusy) as busy:
                await alice.request_lease(MIG, "kernel:k1")
            assert busy.value.lease_id == lease["id"] and busy.value.status == 409
            with pytest.raises(gc.BadRequest) as bad:
                await alice.request_lease({"kind": "shared"}, "kernel:k2")
            assert bad.value.field == "spec.memory_gib"
            await carol.request_lease(MIG, "kernel:c1")
            with pytest.raises(gc.QuotaExceeded) as quota:
                await carol.request_lease(MIG, "kernel:c2")
            assert quota.value.quota == {"scope": "user", "key": "slices", "limit": 1}
            l4s = [await alice.request_lease(WHOLE_L4, f"job:{n}") for n in range(2)]
            with pytest.raises(gc.NoCapacity) as full:
                await alice.request_lease(WHOLE_L4, "job:3", wait=0)
            assert full.value.reason.startswith("no capacity")
            queued = await alice.request_lease(WHOLE_L4, "job:4", wait=0.2)
            assert queued["state"] == "queued" and queued["position"] == 1
            inventory = await root.inventory()
            for gpu in inventory["nodes"][0]["gpus"]:
                if gpu["model"] == "L4":
                    assert (await root.drain(gpu["uuid"]))["drained"] is True
            await alice.release(queued["id"])
            for lease_ in l4s:
                await alice.release(lease_["id"])
            with pytest.raises(gc.ServiceUnavailable) as drained:
                await alice.request_lease(WHOLE_L4, "job:5", wait=0)
            assert drained.value.retry_after == 30 and drained.value.status == 503
            with pytest.raises(gc.Unauthorized):
                await alice.drain(inventory["nodes"][0]["gpus"][0]["uuid"])
            with pytest.raises(gc.Unauthorized):
                await alice.metrics()
            assert "gpualloc_leases" in await root.metrics()
            assert (await alice.release(lease["id"]))["state"] == "released"
            with pytest.raises(gc.NotFound):
                await alice.release(lease["id"])
            with pytest.raises(gc.NotFound):
                await alice.lease("0000")
        async with gc.GpuAllocClient(base_url(service), "wrong-token-123") as stranger:
            with pytest.raises(gc.Unauthorized) as unknown:
                await stranger.leases()
            assert unknown.value.status == 401

    asyncio.run(scenario())


def test_event_iterator_sees_own_lease_events(service):
    async def scenario():
        async with gc.GpuAllocClient(base_url(service), BOB) as bob:
            seen: list[dict] = []

            async def listen():
                async for event in bob.events():
                    seen.append(event)
                    if event["type"] == "lease.released":
                        return

            listener = asyncio.ensure_future(listen())
            await asyncio.sleep(0.3)
            lease = await bob.request_lease(MIG, "kernel:b1")
            await bob.release(lease["id"])
            await asyncio.wait_for(listener, 10)
            assert [(e["type"], e["lease_id"]) for e in seen] == [
                ("lease.granted", lease["id"]), ("lease.released", lease["id"])]

    asyncio.run(scenario())


def test_discovery_from_explicit_config_and_the_environment():
    assert gc.discover("http://h:1/x", "t") == gc.Endpoint("http://h:1/x/", "t")
    env = {"GPUALLOC_URL": "http://svc:8765", "GPUALLOC_TOKEN": "abc", "JUPYTERHUB_API_TOKEN": "hub"}
    assert gc.discover(env=env) == gc.Endpoint("http://svc:8765/", "abc")
    hub_env = {"JUPYTERHUB_PUBLIC_HUB_URL": "https://hub.example.org/jh/hub/", "JUPYTERHUB_BASE_URL": "/jh/",
               "JUPYTERHUB_API_TOKEN": "server-token"}
    assert gc.discover(env=hub_env) == gc.Endpoint("https://hub.example.org/jh/services/gpualloc/", "server-token")
    assert gc.discover(env={**hub_env, "JUPYTERHUB_BASE_URL": "/", "GPUALLOC_SERVICE_NAME": "gpus"}).url == \
        "https://hub.example.org/services/gpus/"
    with pytest.raises(ValueError, match="GPUALLOC_URL"):
        gc.discover(env={"JUPYTERHUB_API_TOKEN": "x"})
    with pytest.raises(ValueError, match="GPUALLOC_TOKEN"):
        gc.discover(env={"GPUALLOC_URL": "http://svc/"})


def test_connection_errors_are_retried_with_backoff_then_reported():
    url = f"http://127.0.0.1:{free_port()}/"

    async def scenario():
        async with gc.GpuAllocClient(url, "t" * 8, retries=3, backoff=0.05) as client:
            started = time.monotonic()
            with pytest.raises(gc.ServiceUnavailable, match="cannot reach"):
                await client.health()
            return time.monotonic() - started

    assert asyncio.run(scenario()) >= 0.05 + 0.1 + 0.2


def test_a_service_that_comes_up_late_is_reached_by_retrying(fresh_service):
    service = fresh_service()
    starter = threading.Timer(0.5, service.start)
    starter.start()

    async def scenario():
        async with gc.GpuAllocClient(base_url(service), ALICE, retries=8, backoff=0.25) as client:
            return await client.whoami()

    try:
        assert asyncio.run(scenario())["user"] == "alice"
    finally:
        starter.join()


def test_sync_wrapper_works_inside_a_running_event_loop(service):
    async def kernel_cell():
        with gc.SyncGpuAllocClient(base_url(service), ALICE) as alice:
            lease = alice.request_lease(MIG, "kernel:sync", wait=2)
            assert lease["state"] == "granted"
            assert alice.lease(lease["id"])["id"] == lease["id"]
            assert alice.touch(lease["id"], busy=False)["busy"] is False
            with pytest.raises(gc.HolderBusy):
                alice.request_lease(MIG, "kernel:sync")
            return alice.release(lease["id"])["state"]

    assert asyncio.run(kernel_cell()) == "released"


def test_a_job_log_followed_while_the_service_dies_ends_as_service_unavailable(fresh_service, tmp_path):
    service = fresh_service().start()
    job = service.call("POST", "jobs", {"spec": WHOLE_L4, "workdir": str(tmp_path), "name": "train",
                                        "source": {"kind": "cell", "code": "x = 1"}}, ALICE).json()
    assert service.call("POST", f"jobs/{job['id']}/start", token=ALICE).status == 200

    async def scenario():
        async with gc.GpuAllocClient(base_url(service), ALICE) as alice:
            chunks = alice.follow_job_log(job["id"])
            reading = asyncio.ensure_future(chunks.__anext__())
            await asyncio.sleep(0.5)  # the stream is open, waiting for the log to grow
            service.kill()
            with pytest.raises(gc.ServiceUnavailable, match="job log"):
                await reading
                async for _ in chunks:
                    pass

    asyncio.run(scenario())
