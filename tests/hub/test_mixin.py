"""start()'s slice handling against a real standalone service: waits, timeouts, quota, stale leases."""

from __future__ import annotations

import asyncio
import signal
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import Spawner, SpawnException

from jupyter_gpualloc.hub.link import ServiceLink
from jupyter_gpualloc.hub.local import GPUSameUserSpawner
from jupyter_gpualloc.hub.mixin import GPUSpawnerMixin
from tests.service.conftest import ALICE, BOB, CAROL, DAVE, POLICY, ROOT, ServiceProcess

WHOLE_L4 = {"kind": "whole", "model": "L4"}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    policy = POLICY.replace('{"carol": {"slices": 1}}', '{"carol": {"slices": 1}, "dave": {"memory_gib": 20}}')
    assert policy != POLICY
    svc = ServiceProcess(tmp_path_factory.mktemp("hub-mixin-service"), config=policy).start()
    yield svc
    svc.kill(signal.SIGTERM)


@pytest.fixture(autouse=True)
def release_everything(service):
    yield
    for lease in service.call("GET", "leases?all=1", token=ROOT).json()["leases"]:
        service.call("DELETE", f"leases/{lease['id']}", token=ROOT)


def spawner_for(service, user: str, token: str, spawner_class=GPUSameUserSpawner, **settings) -> GPUSpawnerMixin:
    hub = SimpleNamespace(public_host="", url="http://127.0.0.1:8081/hub/", base_url="/hub/",
                          api_url="http://127.0.0.1:8081/hub/api")
    spawner = spawner_class(user=SimpleNamespace(name=user, url=f"/user/{user}/"), hub=hub,
                            gpualloc_url=service.url[:-len("api/v1/")], **settings)
    spawner._gpu_init()
    spawner._gpu_link = ServiceLink(spawner.gpualloc_url, token)
    return spawner


def take_both_l4(service) -> str:
    reply = service.call("POST", "leases", {"spec": {"kind": "whole", "model": "L4", "count": 2},
                                            "holder": "kernel:k1"}, token=ALICE)
    assert reply.status == 201, reply
    return reply.json()["id"]


def offer(spec: dict) -> dict:
    return {"name": "x", "label": "x", "spec": spec, "idle_timeout": None}


def test_waiting_past_the_start_timeout_is_a_capacity_error_and_withdraws(service):
    take_both_l4(service)
    spawner = spawner_for(service, "bob", BOB, start_timeout=3, gpu_start_reserve=1.5, gpu_poll_interval=0.2)

    with pytest.raises(SpawnException) as caught:
        asyncio.run(spawner.acquire_slice(offer(WHOLE_L4)))
    assert caught.value.status_code == 503 and caught.value.reason == "capacity"
    assert "No whole GPU on L4 became free within 3 seconds (you were number 1 in the queue)" in caught.value.message
    assert [e["message"] for e in spawner._gpu_events] == [
        "asking for a whole GPU on L4", "waiting for a whole GPU on L4: position 1 in queue"]
    assert service.call("GET", "leases", token=BOB).json()["leases"] == []
    assert spawner.gpu_lease_id == ""


def test_a_queued_request_is_granted_when_the_slice_frees(service):
    blocker = take_both_l4(service)
    spawner = spawner_for(service, "bob", BOB, start_timeout=30, gpu_poll_interval=0.2)

    async def scenario():
        waiting = asyncio.ensure_future(spawner.acquire_slice(offer(WHOLE_L4)))
        await asyncio.sleep(1.0)
        assert not waiting.done()
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: service.call("DELETE", f"leases/{blocker}", token=ALICE))
        return await asyncio.wait_for(waiting, 10)

    lease = asyncio.run(scenario())
    assert lease["state"] == "granted" and spawner.gpu_lease_id == lease["id"]
    assert spawner._gpu_events[-1]["message"].startswith("granted a whole GPU on L4 after")
    env = spawner.get_env()
    assert env["CUDA_VISIBLE_DEVICES"] == lease["slice"]["gpu_uuids"][0]
    assert env["GPUALLOC_URL"] == spawner.gpualloc_url and env["GPUALLOC_LEASE_ID"] == lease["id"]
    asyncio.run(spawner.release_slice("test over"))
    assert service.call("GET", f"leases/{lease['id']}", token=BOB).json()["state"] == "released"


def test_quota_refusal_now_is_a_capacity_error_with_advice_that_helps(service):
    held = service.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"}, "holder": "kernel:k"},
                        token=CAROL)
    assert held.status == 201
    spawner = spawner_for(service, "carol", CAROL)
    with pytest.raises(SpawnException) as caught:
        asyncio.run(spawner.acquire_slice(offer({"kind": "mig", "profile": "1g.5gb"})))
    assert caught.value.status_code == 503 and caught.value.reason == "capacity"
    assert caught.value.jupyterhub_message == (
        "You cannot have a 1g.5gb slice now: user quota for carol: at most 1 slice "
        "(1 slice in use; this request needs 1 slice). Stop another server or kernel that holds a GPU slice.")


def test_what_the_quota_never_allows_is_greyed_out_and_refused_plainly(service):
    spawner = spawner_for(service, "dave", DAVE)
    offers = {o["name"]: o for o in asyncio.run(spawner.gpu_offers())}
    whole_l4 = next(o for o in offers.values() if o["spec"] and o["spec"]["kind"] == "whole")
    assert whole_l4["over_quota"] == "at most 20 GiB"
    assert offers["none"].get("over_quota") is None
    small = [o for o in offers.values() if o["spec"] and o["spec"].get("profile") == "1g.5gb"]
    assert small and all(o["over_quota"] is None for o in small)
    html = asyncio.run(spawner.render_gpu_form())
    assert f'value="{whole_l4["name"]}" disabled' in html and "(over your quota: at most 20 GiB)" in html
    with pytest.raises(SpawnException) as caught:
        asyncio.run(spawner.apply_gpu_options({"gpu": whole_l4["name"]}))
    assert caught.value.status_code == 403
    assert caught.value.jupyterhub_message == (
        f"Your quota never allows {whole_l4['label']}: at most 20 GiB. "
        "Choose a smaller one, or ask an administrator for a larger quota.")
    with pytest.raises(SpawnException) as caught:  # the service says the same if asked anyway
        asyncio.run(spawner.acquire_slice(whole_l4))
    assert caught.value.jupyterhub_message == (
        "Your quota never allows a whole GPU on L4: user quota for dave: at most 20 GiB of GPU memory, "
        "and this request alone needs 22.5 GiB.")


def test_a_stale_lease_of_the_same_server_is_replaced(service):
    stale = service.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"}, "holder": "server"},
                         token=BOB).json()
    spawner = spawner_for(service, "bob", BOB)
    lease = asyncio.run(spawner.acquire_slice(offer({"kind": "mig", "profile": "1g.5gb"})))
    assert lease["id"] != stale["id"] and lease["state"] == "granted"
    assert service.call("GET", f"leases/{stale['id']}", token=BOB).json()["state"] == "released"


def test_state_keeps_the_lease_id_across_a_hub_restart(service):
    spawner = spawner_for(service, "bob", BOB)
    lease = asyncio.run(spawner.acquire_slice(offer({"kind": "mig", "profile": "1g.5gb"})))
    state = spawner.get_state()
    assert state["gpu_lease_id"] == lease["id"]
    revived = spawner_for(service, "bob", BOB)
    revived.load_state(state)
    assert revived.gpu_lease_id == lease["id"] and revived.gpu_holder == "server"
    revived.clear_state()
    assert revived.gpu_lease_id == "" and "gpu_lease_id" not in revived.get_state()


def test_a_lease_left_when_the_allocator_is_gone_is_logged_not_raised(caplog):
    hub = SimpleNamespace(public_host="", url="http://127.0.0.1:8081/hub/", base_url="/hub/",
                          api_url="http://127.0.0.1:8081/hub/api")
    spawner = GPUSameUserSpawner(user=SimpleNamespace(name="bob", url="/user/bob/"), hub=hub)
    spawner.load_state({"gpu_lease_id": "L-from-before"})
    asyncio.run(spawner.release_slice("the server stopped"))
    assert spawner.gpu_lease_id == ""
    assert "could not release lease L-from-before (the server stopped): this hub has no GPU allocator" in caplog.text


class InstantSpawner(Spawner):
    """A spawner class whose server 'starts' at once, so only the mixin's part takes time."""

    async def start(self):
        return "http://127.0.0.1:1"

    async def stop(self, now=False):
        pass

    async def poll(self):
        return None


class QuickSpawner(GPUSpawnerMixin, InstantSpawner):
    pass


def test_progress_follows_a_start_from_its_first_step(service):
    blocker = take_both_l4(service)
    spawner = spawner_for(service, "bob", BOB, spawner_class=QuickSpawner, gpu_poll_interval=0.2)
    spawner.user_options = {"gpu": "whole-l4"}

    async def scenario():
        started = spawner.start()  # as KubeSpawner's own test does: start, then follow progress
        messages = []
        async for event in spawner.progress():
            messages.append(event["message"])
            if "position 1 in queue" in event["message"]:
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: service.call("DELETE", f"leases/{blocker}", token=ALICE))
        return await started, messages

    url, messages = asyncio.run(scenario())
    assert url == "http://127.0.0.1:1"
    assert messages[:2] == ["asking for a whole GPU on L4", "waiting for a whole GPU on L4: position 1 in queue"]
    assert messages[2].startswith("granted a whole GPU on L4 after")
    assert messages[3:] == ["Spawning server... (on your whole GPU on L4)"]
    asyncio.run(spawner.release_slice("test over"))
