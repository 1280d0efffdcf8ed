"""GPUSpawnerMixin: gives any JupyterHub spawner a GPU slice from the scheduler service.

    class MySpawner(GPUSpawnerMixin, SomeSpawner): ...

- The options form lists the service's offers for the user (with how many are free now);
  `user_options` (`{"gpu": "<offer name>"}`, from the form or the REST API) are checked strictly
  in `apply_user_options`, so a bad choice is a 400 before anything starts.
- `start()` submits a `server` lease and waits while it is queued, reporting the queue position
  through `progress()`; past `start_timeout` (less `gpu_start_reserve`), or beyond the user's
  quota, it withdraws the lease and raises SpawnException(reason="capacity", 503).
- The server's env gets the slice (see env.slice_env) and the service URL; the lease id is kept
  in the spawner's state, heartbeats keep the lease alive while the server runs (and resume
  after a hub restart), and `stop()` or a `poll()` that finds the server dead release it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from jupyterhub.spawner import Spawner, SpawnException
from jupyterhub.utils import url_path_join
from traitlets import Bool, Float, Unicode, default

from ..client import GpuAllocError, HolderBusy, QuotaExceeded, ServiceUnavailable
from ..core.model import SliceSpec
from . import form
from .env import server_holder, slice_env
from .link import ServiceLink, delete_token, user_service_token


def describe_spec(spec: dict) -> str:
    """'3g.40gb slice on A100-SXM4-80GB', 'shared 8 GiB slice on L4', ... for messages."""
    return SliceSpec.from_json(spec).describe()


def capacity_error(message: str) -> SpawnException:
    return SpawnException(message, reason="capacity", status_code=503)


class GPUSpawnerMixin(Spawner):
    """Mix in before a spawner class: the server runs on a GPU slice granted by the service."""

    gpualloc_service_name = Unicode(
        "gpualloc", help="Name of the scheduler service in c.JupyterHub.services.",
    ).tag(config=True)
    gpualloc_url = Unicode(
        "", help="""URL of the scheduler service as the hub reaches it (ending in its prefix,
        e.g. http://127.0.0.1:8765/services/gpualloc/). Default: from the managed service
        `gpualloc_service_name` (its url and prefix).""",
    ).tag(config=True)
    gpualloc_server_url = Unicode(
        "", help="""URL of the scheduler service as the single-user server reaches it (its
        GPUALLOC_URL). Default: gpualloc_url.""",
    ).tag(config=True)
    gpu_heartbeat_interval = Float(
        30.0, help="""Seconds between heartbeats of a running server's lease; keep it well under
        the service's SchedulerPolicy.heartbeat_ttl.""",
    ).tag(config=True)
    gpu_poll_interval = Float(
        1.0, help="Seconds between checks of a queued lease while start() waits for it.",
    ).tag(config=True)
    gpu_start_reserve = Float(
        15.0, help="""Seconds of start_timeout kept for starting the server once the slice is
        granted: start() stops waiting in the queue at start_timeout - gpu_start_reserve.""",
    ).tag(config=True)
    gpu_no_gpu_offer = Bool(
        True, help="Whether the form offers a server without a GPU slice ('No GPU').",
    ).tag(config=True)
    gpu_no_gpu_label = Unicode("No GPU", help="Label of the no-GPU choice.").tag(config=True)
    gpu_default_offer = Unicode(
        form.NO_GPU, help="""Offer name used when user_options name none (e.g. a REST API
        spawn with empty options): 'none' (no GPU) or the name of one of the service's offers.""",
    ).tag(config=True)
    gpu_mps = Bool(
        False, help="""Whether an MPS daemon serves the shared GPUs: shared slices then also get
        CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, the hard memory cap.""",
    ).tag(config=True)
    gpu_containers = Bool(
        False, help="Whether servers run in containers: NVIDIA_VISIBLE_DEVICES is then set as well.",
    ).tag(config=True)
    gpu_request_timeout = Float(30.0, help="Seconds each call to the service may take.").tag(config=True)

    gpu_lease_id = Unicode("", help="The server's lease (kept in the spawner state).")

    # ---------------------------------------------------------------- the link
    def _gpu_init(self) -> None:
        if not hasattr(self, "_gpu_link"):
            self._gpu_link: ServiceLink | None = None
            self._gpu_token = ""
            self._gpu_lease: dict | None = None
            self._gpu_memory: int | None = None
            self._gpu_offer: dict | None = None
            self._gpu_heartbeats: asyncio.Task | None = None
            self._gpu_lost = ""
            self._gpu_events: list[dict] = []
            self._gpu_signal = asyncio.Event()
            self._gpu_done = True

    @property
    def gpu_holder(self) -> str:
        """The lease's holder: 'server' for the default server, 'server:<name>' for named ones."""
        return server_holder(self.name)

    def hub_service_url(self) -> str:
        if self.gpualloc_url:
            return self.gpualloc_url
        service = self.user.settings.get("services", {}).get(self.gpualloc_service_name)
        if service is None or not service.url:
            raise RuntimeError(f"no service {self.gpualloc_service_name!r} with a url in c.JupyterHub.services: "
                               "add it, or set GPUSpawnerMixin.gpualloc_url")
        return url_path_join(service.url, service.prefix)

    def server_service_url(self) -> str:
        return self.gpualloc_server_url or self.hub_service_url()

    def gpu_link(self) -> ServiceLink:
        """The service as this spawner's user (a token of the user made by the hub on first use)."""
        self._gpu_init()
        if self._gpu_link is None:
            note = f"gpualloc spawner {self.user.name}/{self.name}"
            self._gpu_token = user_service_token(self.user, self.gpualloc_service_name, note)
            self._gpu_link = ServiceLink(self.hub_service_url(), self._gpu_token, timeout=self.gpu_request_timeout)
        return self._gpu_link

    async def _gpu_close_link(self) -> None:
        self._gpu_init()
        if self._gpu_link is not None:
            await self._gpu_link.close()
            if self._gpu_token:
                delete_token(self.user, self._gpu_token)
            self._gpu_link, self._gpu_token = None, ""

    # ---------------------------------------------------------- offers, form
    async def gpu_offers(self) -> list[dict]:
        """The choices for this user: 'No GPU' (if offered) and the service's offers."""
        offers = await self.gpu_link().offers()
        if self.gpu_no_gpu_offer:
            offers = [form.no_gpu_offer(self.gpu_no_gpu_label), *offers]
        return offers

    @default("options_form")
    def _gpu_options_form_default(self):
        return GPUSpawnerMixin.render_gpu_form

    async def render_gpu_form(self) -> str:
        """The spawn form: the offers now, the previous choice selected."""
        previous = (self.orm_spawner.user_options or {}).get(form.OPTION) if self.orm_spawner else None
        try:
            offers = await self.gpu_offers()
            message = ""
        except (ServiceUnavailable, PermissionError) as err:
            self.log.warning("gpualloc offers for %s: %s", self._log_name, err)
            offers = [form.no_gpu_offer(self.gpu_no_gpu_label)] if self.gpu_no_gpu_offer else []
            message = "The GPU allocator is not answering right now: only servers without a GPU can start."
        return form.render_form(offers, previous or self.gpu_default_offer, message=message)

    @default("options_from_form")
    def _gpu_options_from_form_default(self):
        return form.options_from_form

    @default("apply_user_options")
    def _gpu_apply_default(self):
        return GPUSpawnerMixin.apply_gpu_options

    async def apply_gpu_options(self, user_options: Any) -> None:
        """Check user_options against the offers (400 on a bad choice); remember the offer."""
        self._gpu_init()
        self._gpu_offer = await self.choose_gpu_offer(user_options)

    def gpu_option_keys(self) -> tuple[str, tuple[str, ...]]:
        """The user_options key naming the offer, and prefixes of other keys allowed beside it."""
        return form.OPTION, ()

    async def choose_gpu_offer(self, user_options: Any) -> dict:
        try:
            offers = await self.gpu_offers()
        except ServiceUnavailable as err:
            raise capacity_error(f"The GPU allocator is not answering: {err}") from None
        except PermissionError as err:
            raise SpawnException(str(err), reason="permission", status_code=403) from None
        key, extra = self.gpu_option_keys()
        try:
            return form.choose_offer(user_options, offers, default=self.gpu_default_offer, key=key, extra_keys=extra)
        except form.OptionsError as err:
            raise SpawnException(str(err), reason="options", status_code=400) from None

    # ------------------------------------------------------------ progress
    def _gpu_progress(self, message: str, progress: int | None = None) -> None:
        event: dict[str, Any] = {"message": message}
        if progress is not None:
            event["progress"] = progress
        self._gpu_events.append(event)
        self._gpu_signal.set()
        self.log.info("%s: %s", self._log_name, message)

    async def progress(self):
        """The GPU steps (queue position, grant) first, then the spawner's own progress."""
        self._gpu_init()
        sent = 0
        while True:
            while sent < len(self._gpu_events):
                yield self._gpu_events[sent]
                sent += 1
            if self._gpu_done:
                break
            self._gpu_signal.clear()
            await self._gpu_signal.wait()
        async for event in super().progress():
            yield event

    # ------------------------------------------------------------ lifecycle
    def clear_state(self) -> None:
        super().clear_state()
        self._gpu_init()
        self.gpu_lease_id = ""
        self._gpu_lease = None
        self._gpu_memory = None
        self._gpu_lost = ""
        self._gpu_events = []
        self._gpu_done = False

    def get_state(self) -> dict:
        state = super().get_state()
        if self.gpu_lease_id:
            state["gpu_lease_id"] = self.gpu_lease_id
        return state

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.gpu_lease_id = state.get("gpu_lease_id", "")

    def get_env(self) -> dict:
        env = super().get_env()
        self._gpu_init()
        env.update(slice_env(self._gpu_lease, service_url=self.server_service_url(),
                             gpu_memory_mib=self._gpu_memory, mps=self.gpu_mps, containers=self.gpu_containers,
                             visible_devices=self.gpu_sets_visible_devices()))
        return env

    def gpu_sets_visible_devices(self) -> bool:
        """Whether the env names the devices (False where a device plugin chooses them)."""
        return True

    async def start(self):
        self._gpu_init()
        offer = self._gpu_offer or await self.choose_gpu_offer(self.user_options)
        self._gpu_offer = None
        try:
            if offer.get("spec"):
                await self.acquire_slice(offer)
        finally:
            self._gpu_done = True
            self._gpu_signal.set()
        try:
            url = await self.start_server()
        except BaseException:
            await self.release_slice("the server failed to start")
            raise
        if self.gpu_lease_id:
            self._start_heartbeats()
        return url

    async def start_server(self):
        """Start the server itself, the slice already held (the spawner class's own start())."""
        return await super().start()

    async def acquire_slice(self, offer: dict) -> dict:
        """Submit the server's lease and wait until it is granted; on failure nothing is left held."""
        link = self.gpu_link()
        what = describe_spec(offer["spec"])
        started = time.monotonic()
        deadline = started + max(self.start_timeout - self.gpu_start_reserve, 1.0)
        self._gpu_progress(f"asking for a {what}", 5)
        lease = await self._submit(link, offer, what)
        self.gpu_lease_id = lease["id"]
        try:
            last_position, beat = None, started
            while lease["state"] == "queued":
                position = lease.get("position")
                if position != last_position:
                    self._gpu_progress(f"waiting for a {what}: position {position} in queue", 10)
                    last_position = position
                left = deadline - time.monotonic()
                if left <= 0:
                    raise capacity_error(
                        f"No {what} became free within {self.start_timeout:g} seconds (you were number "
                        f"{position} in the queue). Try again later, or choose a smaller slice.")
                await asyncio.sleep(min(self.gpu_poll_interval, left))
                if time.monotonic() - beat >= self.gpu_heartbeat_interval:
                    await link.heartbeat(self.gpu_holder)
                    beat = time.monotonic()
                lease = await link.lease(lease["id"]) or {"state": "gone", "reason": "the service lost it"}
            if lease["state"] != "granted":
                raise capacity_error(f"Your request for a {what} ended: {lease.get('reason') or lease['state']}.")
            self._gpu_lease = lease
            slice_ = lease["slice"]
            if slice_["kind"] == "shared":
                self._gpu_memory = await link.gpu_memory_mib(slice_["gpu_uuids"][0])
            waited = time.monotonic() - started
            where = slice_.get("mig_uuid") or ", ".join(slice_["gpu_uuids"])
            self._gpu_progress(f"granted a {what} after {waited:.0f} s ({where} on {slice_['node']})", 40)
            return lease
        except BaseException:
            await self.release_slice("withdrawn: the server did not start")
            raise

    async def _submit(self, link: ServiceLink, offer: dict, what: str) -> dict:
        """Submit the lease; a stale lease of the same server (a crashed earlier start) is replaced."""
        try:
            try:
                return await link.submit(offer["spec"], self.gpu_holder, idle_timeout=offer.get("idle_timeout"))
            except HolderBusy as err:
                self.log.warning("%s: releasing the stale lease %s of this server", self._log_name, err.lease_id)
                await link.release(err.lease_id)
                return await link.submit(offer["spec"], self.gpu_holder, idle_timeout=offer.get("idle_timeout"))
        except QuotaExceeded as err:
            raise capacity_error(f"You cannot have a {what} now: {err}. Stop another server "
                                 "or kernel that holds a GPU slice, or choose a smaller one.") from None
        except ServiceUnavailable as err:
            raise capacity_error(f"The GPU allocator cannot give you a {what} now: {err}") from None
        except GpuAllocError as err:
            raise capacity_error(f"The GPU allocator refused a {what}: {err}") from None

    async def release_slice(self, reason: str) -> None:
        """Give the server's lease back (if any); errors are logged, never raised."""
        self._gpu_init()
        self._stop_heartbeats()
        lease_id, self.gpu_lease_id, self._gpu_lease = self.gpu_lease_id, "", None
        if not lease_id:
            return
        try:
            await self.gpu_link().release(lease_id)
            self.log.info("%s: released lease %s (%s)", self._log_name, lease_id, reason)
        except (GpuAllocError, PermissionError) as err:
            self.log.warning("%s: could not release lease %s (%s): %s; it ends after the heartbeat TTL",
                             self._log_name, lease_id, reason, err)
        await self._gpu_close_link()

    async def stop(self, now: bool = False):
        try:
            await super().stop(now=now)
        finally:
            await self.release_slice("the server stopped")
            await self._gpu_close_link()

    async def _poll_server(self):
        """The wrapped spawner's poll(), keeping the lease id its clear_state() may drop."""
        self._gpu_init()
        lease_id = self.gpu_lease_id
        status = await super().poll()
        if status is not None and lease_id:
            self.gpu_lease_id = lease_id
        return status

    async def poll(self):
        status = await self._poll_server()
        if status is not None:
            if self.gpu_lease_id:
                await self.release_slice(f"the server is not running (status {status})")
            return status
        if self.gpu_lease_id:
            if self._gpu_lost:
                self.log.warning("%s: stopping the server: its GPU lease ended (%s)", self._log_name, self._gpu_lost)
                await self.stop(now=True)
                return 1
            self._start_heartbeats()
        return None

    # ------------------------------------------------------------ heartbeats
    def _start_heartbeats(self) -> None:
        if self._gpu_heartbeats is None or self._gpu_heartbeats.done():
            self._gpu_heartbeats = asyncio.ensure_future(self._heartbeat_loop())

    def _stop_heartbeats(self) -> None:
        task, self._gpu_heartbeats = self._gpu_heartbeats, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _heartbeat_loop(self) -> None:
        """Heartbeat while the server runs; a dead server's lease is released at once."""
        while self.gpu_lease_id:
            status = await self._poll_server()
            if status is not None:
                await self.release_slice(f"the server is not running (status {status})")
                return
            try:
                alive = await self.gpu_link().heartbeat(self.gpu_holder)
                if not any(lease["id"] == self.gpu_lease_id for lease in alive):
                    lease = await self.gpu_link().lease(self.gpu_lease_id)
                    self._gpu_lost = (lease or {}).get("reason") or "the service no longer knows it"
                    return
            except (GpuAllocError, PermissionError) as err:
                self.log.warning("%s: heartbeat of lease %s failed: %s", self._log_name, self.gpu_lease_id, err)
            await asyncio.sleep(self.gpu_heartbeat_interval)
