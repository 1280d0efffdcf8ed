"""start()'s slice handling against a real standalone service: waits, timeouts, quota, stale leases;
and how a server's lease ends: stop, a lost lease, a failed start (the server's processes end
first, then its slice is free)."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from jupyterhub.spawner import Spawner, SpawnException

from jupyter_gpualloc.hub.link import ServiceLink
from jupyter_gpualloc.hub.local import GPUSameUserSpawner, still_running
from jupyter_gpualloc.hub.mixin import GPUSpawnerMixin
from tests.service.conftest import ALICE, BOB, CAROL, DAVE, POLICY, ROOT, ServiceProcess

WHOLE_L4 = {"kind": "whole", "model": "L4"}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    policy = POLICY.replace('{"carol": {"slices": 1}}', '{"carol": {"slices": 1}, "dave": {"memory_gib": 20}}')
    assert policy != POLICY
    # an ended lease's slice waits for its holder (the server) to be gone
    policy += "c.SchedulerPolicy.wait_for_holders = True\n"
    svc = ServiceProcess(tmp_path_factory.mktemp("hub-mixin-service"), config=policy).start()
    yield svc
    svc.kill(signal.SIGTERM)


@pytest.fixture(autouse=True)
def release_everything(service):
    yield
    for token in (ALICE, BOB, CAROL, DAVE):  # also the slices of ended leases still waiting for them
        service.call("POST", "holders/gone", {"holders": ["server", "kernel:k", "kernel:k1"]}, token=token)
    for lease in service.call("GET", "leases?all=1", token=ROOT).json()["leases"]:
        service.call("DELETE", f"leases/{lease['id']}?holder_gone=true", token=ROOT)


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
    """The service's offer (derived from the tests' fleet) a spawner would ask for by name."""
    name = {"whole": "whole-l4", "mig": "mig-1g.5gb-a100-sxm4-40gb"}[spec["kind"]]
    return {"name": name, "label": name, "spec": spec}


def test_waiting_past_the_start_timeout_is_a_capacity_error_and_withdraws(service):
    take_both_l4(service)
    spawner = spawner_for(service, "bob", BOB, start_timeout=3, gpu_start_reserve=1.5, gpu_poll_interval=0.2)

    with pytest.raises(SpawnException) as caught:
        asyncio.run(spawner.acquire_slice(offer(WHOLE_L4)))
    assert caught.value.status_code == 503 and caught.value.reason == "capacity"
    assert ("No whole GPU on L4 became free within 1.5 seconds (this hub's start timeout of 3 s, less 1.5 s to "
            "start the server; you were number 1 in the queue)") in caught.value.message
    asking, waiting = [e["message"] for e in spawner._gpu_events]
    assert asking == "asking for a whole GPU on L4"
    assert re.fullmatch(r"waiting for a whole GPU on L4: position 1 in queue; this start gives up at "
                        r"\d\d:\d\d:\d\d UTC \(1.5 s after asking\) if none frees", waiting), waiting
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
            None, lambda: service.call("DELETE", f"leases/{blocker}?holder_gone=true", token=ALICE))
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
                    None, lambda: service.call("DELETE", f"leases/{blocker}?holder_gone=true", token=ALICE))
        return await started, messages

    url, messages = asyncio.run(scenario())
    assert url == "http://127.0.0.1:1"
    assert messages[0] == "asking for a whole GPU on L4"
    assert messages[1].startswith("waiting for a whole GPU on L4: position 1 in queue; this start gives up at ")
    assert messages[2].startswith("granted a whole GPU on L4 after")
    assert messages[3:] == ["Spawning server... (on your whole GPU on L4)"]
    asyncio.run(spawner.release_slice("test over"))


def test_a_queued_start_past_its_deadline_says_when_it_gives_up_and_shows_no_server_step(service):
    take_both_l4(service)
    spawner = spawner_for(service, "bob", BOB, spawner_class=QuickSpawner, start_timeout=3,
                          gpu_start_reserve=1.5, gpu_poll_interval=0.2)
    spawner.user_options = {"gpu": "whole-l4"}

    async def scenario():
        started = spawner.start()
        messages = [event["message"] async for event in spawner.progress()]
        with pytest.raises(SpawnException) as caught:
            await started
        return messages, caught.value

    messages, error = asyncio.run(scenario())
    assert len(messages) == 2 and "this start gives up at" in messages[1] and "(1.5 s after asking)" in messages[1]
    assert not any("Spawning server" in m for m in messages), messages  # the server was never started
    assert error.reason == "capacity" and "within 1.5 seconds" in error.message
    assert service.call("GET", "leases", token=BOB).json()["leases"] == []


# ------------------------------------------------------------ a server's lease ends
# A real LocalProcessSpawner-based spawner (GPUSameUserSpawner) runs a stand-in server: a process
# that starts a "kernel" of its own (which outlives it unless the spawner ends it) and sleeps.
STAND_IN_SERVER = """
import os, subprocess, sys, time
kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["KERNEL_PID_FILE"] + ".tmp", "w") as out:
    out.write(str(kernel.pid))
os.rename(os.environ["KERNEL_PID_FILE"] + ".tmp", os.environ["KERNEL_PID_FILE"])
time.sleep(600)
"""
BOTH_L4 = {"kind": "whole", "model": "L4", "count": 2}


def local_spawner(service, tmp_path: Path, **settings) -> GPUSameUserSpawner:
    spawner = spawner_for(service, "bob", BOB, cmd=[sys.executable, "-c", STAND_IN_SERVER],
                          home_dir_template=str(tmp_path / "homes" / "{username}"),
                          environment={"KERNEL_PID_FILE": str(tmp_path / "kernel.pid")},
                          term_timeout=3, kill_timeout=3, start_timeout=20, gpu_start_reserve=15,
                          gpu_poll_interval=0.2, **settings)
    spawner._gpu_offer = offer(WHOLE_L4)
    return spawner


async def start_stand_in(spawner, tmp_path: Path) -> list[psutil.Process]:
    """Start the server on its whole L4; its process and its kernel's."""
    await spawner.start()
    pid_file = tmp_path / "kernel.pid"
    deadline = time.monotonic() + 20
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the stand-in server did not start its kernel"
        await asyncio.sleep(0.05)
    return [psutil.Process(spawner.pid), psutil.Process(int(pid_file.read_text()))]


async def in_thread(call, *args, **kwargs):
    return await asyncio.get_running_loop().run_in_executor(None, lambda: call(*args, **kwargs))


def record_releases(spawner, processes: list[psutil.Process], service, waiting: dict) -> list[dict]:
    """What the spawner tells the service, and what runs and what waits at that moment."""
    calls: list[dict] = []
    client = spawner._gpu_link.client
    release, holders_gone = client.release, client.holders_gone

    def seen(call: str, **details) -> None:
        calls.append({"call": call, **details, "running": [p.pid for p in processes if still_running(p)],
                      "waiting": service.call("GET", f"leases/{waiting['id']}", token=ALICE).json()["state"]
                      if waiting else None})

    async def recording_release(lease_id, *, holder_gone=False):
        seen("release", holder_gone=holder_gone)
        return await release(lease_id, holder_gone=holder_gone)

    async def recording_holders_gone(holders):
        seen("holders_gone", holders=holders)
        return await holders_gone(holders)

    client.release, client.holders_gone = recording_release, recording_holders_gone
    return calls


def ask_for_both_l4(service) -> dict:
    """alice asks for both L4s while bob's server holds one: she waits for it."""
    reply = service.call("POST", "leases", {"spec": BOTH_L4, "holder": "kernel:k1"}, token=ALICE)
    assert reply.status == 202 and reply.json()["state"] == "queued", reply
    return reply.json()


def state_of(service, lease: dict) -> str:
    return service.call("GET", f"leases/{lease['id']}", token=ALICE).json()["state"]


def test_a_server_whose_lease_is_released_is_stopped_before_its_slice_is_free(service, tmp_path, caplog):
    """As the sidebar's Release of the server's slice: the heartbeats find the lease ended, the
    spawner stops the server and what it started, and only then is the slice given to alice;
    the hub's poll meanwhile never re-enters stop(), and its callbacks hear of the stop at once."""
    caplog.set_level(logging.INFO)
    spawner = local_spawner(service, tmp_path, gpu_heartbeat_interval=0.2)

    async def scenario():
        processes = await start_stand_in(spawner, tmp_path)
        lease_id = spawner.gpu_lease_id
        assert psutil.Process(spawner.pid).environ()["CUDA_VISIBLE_DEVICES"] == \
            service.call("GET", f"leases/{lease_id}", token=BOB).json()["slice"]["gpu_uuids"][0]
        waiting = await in_thread(ask_for_both_l4, service)
        calls = record_releases(spawner, processes, service, waiting)
        told = asyncio.Event()
        spawner.add_poll_callback(told.set)
        # the user releases the server's slice (no holder_gone: the server still runs)
        reply = await in_thread(service.call, "DELETE", f"leases/{lease_id}", token=BOB)
        assert reply.status == 200, reply
        assert await in_thread(state_of, service, waiting) == "queued"  # the slice waits for the server
        statuses = []
        started = time.monotonic()
        while not told.is_set():  # the hub polls meanwhile, as its poll_interval does
            assert time.monotonic() - started < 20, f"the server was not stopped: {calls}\n{caplog.text}"
            statuses.append(await spawner.poll())
            await asyncio.sleep(0.1)
        return processes, waiting, calls, statuses, time.monotonic() - started

    processes, waiting, calls, statuses, took = asyncio.run(scenario())
    assert not any(still_running(p) for p in processes)
    assert took < 15
    assert calls and calls[0]["call"] == "release" and calls[0]["holder_gone"] is True
    assert all(call["running"] == [] for call in calls), calls  # told only once nothing of it runs
    assert calls[0]["waiting"] == "queued", calls
    assert state_of(service, waiting) == "granted"
    assert spawner.gpu_lease_id == "" and statuses[-1] is not None
    assert caplog.text.count("stopping the server: its GPU lease ended (released by bob)") == 1
    assert "RecursionError" not in caplog.text and "never died" not in caplog.text
    assert asyncio.run(spawner.poll()) is not None


def test_the_hubs_poll_stops_a_server_whose_lease_ended_without_recursing(service, tmp_path, caplog):
    """poll() finding the lease ended (what the heartbeats found) stops the server once:
    LocalProcessSpawner.stop() polls while it waits for the process, which must not stop again."""
    spawner = local_spawner(service, tmp_path, gpu_heartbeat_interval=3600)

    async def scenario():
        processes = await start_stand_in(spawner, tmp_path)
        reply = await in_thread(service.call, "DELETE", f"leases/{spawner.gpu_lease_id}", token=BOB)
        assert reply.status == 200, reply
        waiting = await in_thread(ask_for_both_l4, service)
        calls = record_releases(spawner, processes, service, waiting)
        spawner._gpu_lost = "released by bob"  # as the heartbeat that found it leaves it
        status = await asyncio.wait_for(spawner.poll(), 30)
        return processes, waiting, calls, status

    processes, waiting, calls, status = asyncio.run(scenario())
    assert status is not None and not any(still_running(p) for p in processes)
    assert [(c["call"], c.get("holder_gone"), c["running"], c["waiting"]) for c in calls][:1] == \
        [("release", True, [], "queued")]
    assert all(c["running"] == [] for c in calls), calls
    assert state_of(service, waiting) == "granted"
    assert caplog.text.count("stopping the server: its GPU lease ended") == 1


# a stand-in server that ignores SIGINT and SIGTERM (its kernel inherits that): only SIGKILL ends it
SLOW_TO_STOP = "import signal\nfor s in (signal.SIGINT, signal.SIGTERM):\n    signal.signal(s, signal.SIG_IGN)\n" \
    + STAND_IN_SERVER


@pytest.fixture(scope="module")
def short_ttl_service(tmp_path_factory):
    """A service whose heartbeat TTL (2 s) is shorter than a slow server's stop."""
    policy = POLICY.replace("heartbeat_ttl = 3600", "heartbeat_ttl = 2") + "c.SchedulerPolicy.wait_for_holders = True\n"
    assert "heartbeat_ttl = 2\n" in policy
    svc = ServiceProcess(tmp_path_factory.mktemp("hub-mixin-short-ttl"), config=policy,
                         args=("--tick-interval", "0.2")).start()
    yield svc
    svc.kill(signal.SIGTERM)


@pytest.mark.parametrize("how", ["stop", "released from the sidebar"])
def test_a_server_slower_to_stop_than_the_heartbeat_ttl_keeps_its_slice_until_its_processes_end(
        short_ttl_service, tmp_path, caplog, how):
    """The stop takes SIGKILL after interrupt_timeout and term_timeout (6 s), three times the TTL: the
    spawner heartbeats the server's holder all the while, so the slice (the lease active, or ended and
    returning) reaches alice only once no process of the server runs."""
    service = short_ttl_service
    spawner = local_spawner(service, tmp_path, gpu_heartbeat_interval=0.3, interrupt_timeout=3)
    spawner.cmd = [sys.executable, "-c", SLOW_TO_STOP]

    async def scenario():
        processes = await start_stand_in(spawner, tmp_path)
        waiting = await in_thread(ask_for_both_l4, service)
        calls = record_releases(spawner, processes, service, waiting)
        granted_while_running = []

        async def watch():  # alice's kernel lives on, heartbeating, while she waits
            while True:
                await in_thread(service.call, "POST", "heartbeat", {"holders": ["kernel:k1"]}, token=ALICE)
                if await in_thread(state_of, service, waiting) == "granted":
                    granted_while_running.extend(p.pid for p in processes if still_running(p))
                    return
                await asyncio.sleep(0.1)
        watching = asyncio.ensure_future(watch())
        if how == "stop":
            await spawner.stop()
        else:
            reply = await in_thread(service.call, "DELETE", f"leases/{spawner.gpu_lease_id}", token=BOB)
            assert reply.status == 200, reply
            started = time.monotonic()
            while await spawner.poll() is None:  # the heartbeats find the lease ended and stop the server
                assert time.monotonic() - started < 30, f"the server was not stopped: {calls}\n{caplog.text}"
                await asyncio.sleep(0.2)
        await asyncio.wait_for(watching, 10)
        return processes, calls, granted_while_running

    started = time.monotonic()
    processes, calls, granted_while_running = asyncio.run(scenario())
    assert time.monotonic() - started > 6  # the stop outlived the TTL three times over
    assert granted_while_running == [], f"alice got the slice while {granted_while_running} still ran"
    assert not any(still_running(p) for p in processes)
    assert calls and (calls[0]["call"], calls[0]["holder_gone"], calls[0]["running"], calls[0]["waiting"]) == \
        ("release", True, [], "queued"), calls


def test_stop_ends_the_server_then_frees_its_slice_at_once(service, tmp_path):
    spawner = local_spawner(service, tmp_path, gpu_heartbeat_interval=3600)

    async def scenario():
        processes = await start_stand_in(spawner, tmp_path)
        waiting = await in_thread(ask_for_both_l4, service)
        calls = record_releases(spawner, processes, service, waiting)
        poll_meanwhile = asyncio.ensure_future(asyncio.sleep(0.2))
        stopping = asyncio.ensure_future(spawner.stop())
        await poll_meanwhile
        status_while_stopping = await spawner.poll()  # waits for the stop, then says it ended
        await stopping
        return processes, waiting, calls, status_while_stopping

    processes, waiting, calls, status = asyncio.run(scenario())
    assert status is not None and not any(still_running(p) for p in processes)
    assert [(c["call"], c["holder_gone"], c["running"], c["waiting"]) for c in calls] == \
        [("release", True, [], "queued")]
    assert state_of(service, waiting) == "granted"
    assert spawner.gpu_lease_id == ""


def test_a_failed_start_frees_its_slice_at_once(service, tmp_path):
    spawner = local_spawner(service, tmp_path)
    spawner.cmd = [str(tmp_path / "no-such-server")]

    async def scenario():
        calls = record_releases(spawner, [], service, {})
        with pytest.raises(FileNotFoundError):
            await spawner.start()
        return calls

    calls = asyncio.run(scenario())
    assert [(c["call"], c["holder_gone"]) for c in calls] == [("release", True)]
    assert spawner.gpu_lease_id == ""
    reply = service.call("POST", "leases", {"spec": BOTH_L4, "holder": "kernel:k1"}, token=ALICE)
    assert reply.status == 201, reply
