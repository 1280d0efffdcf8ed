"""GPUSpawnerMixin: gives any JupyterHub spawner a GPU slice from the scheduler service.

    class MySpawner(GPUSpawnerMixin, SomeSpawner): ...

- The spawner class keeps its own form and options: the mixin adds one field, `gpu`, to the
  form (the service's offers, with how many are free now) and owns only `user_options["gpu"]`;
  every other field goes to the spawner class's own `options_from_form` (e.g. KubeSpawner's
  `profile`). `apply_user_options` checks the GPU choice, so a bad one is a 400 before anything
  starts.
- *No GPU* never contacts the service: a hub whose allocator is down, not configured, or not
  granted to a user keeps starting servers without a GPU (the form says why).
- The form also says where the user stands against their usage quotas and how long a time-boxed
  offer lasts; offers a used-up usage quota refuses are greyed out with the sentence.
- `start()` submits a `server` lease and waits while it is queued, reporting the queue position,
  the core's reason and when the start gives up (and, once granted, the slice's deadline) through
  `progress()`; past `start_timeout` (less `gpu_start_reserve`), or beyond the user's quota, it
  withdraws the lease and raises SpawnException(reason="capacity", 503), and the progress page
  then shows no step of a server start that never began.
- The server's lease lives the one holder lifecycle (holder_lease.HolderLease): the server's env
  gets its slice (lease_env.slice_env) and the service URL; its state is the spawner's state,
  heartbeats keep it alive while the server runs and while it stops, until its processes have
  ended (and resume after a hub restart), and `stop()`
  or a `poll()` that finds the server dead release it. The server kind supplies only its proof
  of life (`poll()`) and where its slice goes (the server's env).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any

from jupyterhub.spawner import Spawner
from jupyterhub.utils import maybe_future, url_path_join
from tornado import web
from traitlets import Bool, Float, Unicode, default

from ..client import GpuAllocError, HolderBusy, QuotaExceeded, ServiceUnavailable
from ..holder import Keepalive, Waiting, WaitGaveUp
from ..holder_lease import HolderLease
from ..core.model import SliceSpec
from . import form
from ..lease_env import server_holder
from .link import ServiceLink, delete_token, user_service_token


def describe_spec(spec: dict, article: bool = False) -> str:
    """'3g.40gb slice on A100-SXM4-80GB', 'shared 8 GiB slice on L4', ... for messages ('a 3g.40gb
    slice ...', but '2 whole GPUs', with `article`)."""
    return SliceSpec.from_json(spec).describe(article)


try:
    from jupyterhub.spawner import SpawnException
except ImportError:  # JupyterHub 5 (SpawnException came with 6.0): an HTTPError of the same call
    class SpawnException(web.HTTPError):  # type: ignore[no-redef]
        """A spawn refused for a reason (JupyterHub 6's SpawnException, for JupyterHub 5, which shows an
        HTTPError's `jupyterhub_message` to the user and logs a 5xx as an error, a 4xx as a failure)."""

        def __init__(self, message: str, *, reason: str, status_code: int = 400):
            super().__init__(status_code, "%s", message, reason=reason)
            self.message, self.reason = message, reason


STATE_PREFIX = "gpu_"  # the server's lease's state in the spawner's: gpu_lease_id

# The spawner whose stop is running in the current task (see GPUSpawnerMixin.poll).
_IN_GPU_STOP: contextvars.ContextVar = contextvars.ContextVar("gpualloc_in_stop", default=None)


def spawn_error(message: str, reason: str, status: int) -> SpawnException:
    """A SpawnException whose message JupyterHub's pages show as written (not '503 SpawnException(...)')."""
    error = SpawnException(message, reason=reason, status_code=status)
    error.jupyterhub_message = message
    return error


def queue_words(a_what: str, position: int | None, reason: str, gives_up: str, patience: float) -> str:
    """What the progress page says while the server's request waits: its place, why it waits
    (when the core's reason says more than that it waits), and when the start gives up."""
    words = f"waiting for {a_what}: position {position} in queue"
    if reason and not reason.startswith("waiting for"):
        words += f" ({reason})"
    return f"{words}; this start gives up at {gives_up} ({patience:g} s after asking) if none frees"


def capacity_error(message: str) -> SpawnException:
    return spawn_error(message, "capacity", 503)


# Advice for a quota that blocks a request now (the quota key the service names -> a sentence).
QUOTA_ADVICE = {
    "slices": "Stop another server or kernel that holds a GPU slice.",
    "memory_gib": "Stop another server or kernel that holds a GPU slice, or choose a smaller one.",
    "whole_gpus": "Stop another server or kernel that holds a whole GPU, or choose a slice.",
    "gpu_hours": "Until then, choose No GPU.",
}


def deadline_message(lease: dict, now: float) -> str:
    """'GPU slice held until 14:00 UTC (4 h); extend with %gpu extend or the sidebar' for a
    time-boxed lease; '' for one without a deadline."""
    deadline = lease.get("deadline")
    if not deadline:
        return ""
    held = deadline["at"] - (lease.get("granted_at") or now)
    text = f"GPU slice held until {form.clock_text(deadline['at'], now)} ({form.hours_text(held)})"
    if deadline.get("extensions_left"):
        return f"{text}; extend with %gpu extend or the sidebar"
    return f"{text}; it cannot be extended"


class AllocatorNotConfigured(Exception):
    """The hub names no scheduler service: servers start without a GPU."""


def base_class_default(spawner: Spawner, trait: str) -> Any:
    """The default of `trait` as the spawner class after GPUSpawnerMixin in the MRO defines it."""
    mro = type(spawner).__mro__
    for klass in mro[mro.index(GPUSpawnerMixin) + 1:]:
        generator = klass.__dict__.get("_trait_default_generators", {}).get(trait)
        if generator is not None:
            return generator(spawner)
    return spawner.traits()[trait].default()


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

    def __init_subclass__(cls, **kwargs):
        """Like Spawner's own check: the spawner the mixin goes with must implement start, stop, poll."""
        super().__init_subclass__(**kwargs)
        missing = [name for name in ("start", "stop", "poll")
                   if getattr(cls, name) is getattr(GPUSpawnerMixin, name)
                   and getattr(super(GPUSpawnerMixin, cls), name) is getattr(Spawner, name)]
        if missing:
            raise NotImplementedError(f"class {cls.__name__} mixes GPUSpawnerMixin into no spawner that "
                                      f"implements {', '.join(missing)}: put a spawner class after the mixin")

    # ---------------------------------------------------------------- the link
    def _gpu_init(self) -> None:
        if not hasattr(self, "_gpu_link"):
            self._gpu_link: ServiceLink | None = None
            self._gpu_token = ""
            self._gpu_holder_lease = HolderLease(lambda: self.gpu_link().client, self.gpu_holder,
                                                 running=self._server_runs)
            self._gpu_memory: int | None = None
            self._gpu_offer: dict | None = None
            self._gpu_keepalive: Keepalive | None = None
            self._gpu_lost = ""
            self._gpu_events: list[dict] = []
            self._gpu_signal = asyncio.Event()
            self._gpu_done = True
            self._gpu_failed = False
            self._gpu_granted = ""
            self._gpu_stop_task: asyncio.Future | None = None

    @property
    def gpu_holder(self) -> str:
        """The lease's holder: 'server' for the default server, 'server:<name>' for named ones."""
        return server_holder(self.name)

    @property
    def gpu_lease(self) -> HolderLease:
        """The server's lease, from its request to its end (its id is in the spawner's state)."""
        self._gpu_init()
        return self._gpu_holder_lease

    @property
    def gpu_lease_id(self) -> str:
        """The server's lease id ('' when it holds none)."""
        return self.gpu_lease.lease_id

    @property
    def _gpu_lease(self) -> dict | None:
        """The server's granted lease as the service answered it (None: no slice, or not read since a restart)."""
        return self.gpu_lease.view if self.gpu_lease.granted else None

    def hub_service_url(self) -> str:
        """The service's URL as the hub reaches it; '' when the hub has no such service."""
        if self.gpualloc_url:
            return self.gpualloc_url
        settings = getattr(self.user, "settings", None)
        services = settings.get("services") if isinstance(settings, dict) else None
        service = services.get(self.gpualloc_service_name) if isinstance(services, dict) else None
        if not isinstance(getattr(service, "url", None), str) or not service.url:
            return ""
        return url_path_join(service.url, service.prefix)

    def server_service_url(self) -> str:
        """The service's URL as the server reaches it (its GPUALLOC_URL); '' without a service."""
        return self.gpualloc_server_url or self.hub_service_url()

    _gpu_unconfigured_logged = False

    def gpu_link(self) -> ServiceLink:
        """The service as this spawner's user (a token of the user made by the hub on first use).

        Raises AllocatorNotConfigured (logged once per hub) when there is no service to link to,
        and PermissionError when the user may not use it.
        """
        self._gpu_init()
        if self._gpu_link is None:
            if not self.hub_service_url():
                if not GPUSpawnerMixin._gpu_unconfigured_logged:
                    GPUSpawnerMixin._gpu_unconfigured_logged = True
                    self.log.warning(
                        "GPU allocator not configured (no service %r with a url in c.JupyterHub.services, "
                        "and no gpualloc_url): servers start without a GPU", self.gpualloc_service_name)
                raise AllocatorNotConfigured("this hub has no GPU allocator")
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
        """The spawner class's own form (if any) followed by the GPU choice.

        Without a configured allocator the GPU choice is left out; with the allocator down, or
        the user not allowed to use it, only No GPU is offered and the form says why.
        """
        base = base_class_default(self, "options_form")
        base_html = (await maybe_future(base(self)) if callable(base) else base) or ""
        previous = (self.orm_spawner.user_options or {}).get(form.OPTION) if self.orm_spawner else None
        message = ""
        only_no_gpu = [form.no_gpu_offer(self.gpu_no_gpu_label)] if self.gpu_no_gpu_offer else []
        until = "only servers without a GPU can start" if self.gpu_no_gpu_offer else "no server can start"
        standing: list[str] = []
        reservations: list[str] = []
        try:
            offers = await self.gpu_offers()
        except AllocatorNotConfigured:
            return base_html
        except PermissionError as err:
            self.log.warning("GPU offers for %s: %s", self._log_name, err)
            offers, message = only_no_gpu, f"{err} Until then, {until}."
        except Exception as err:  # whatever fails on the way to the allocator, the form still works
            self.log.warning("GPU offers for %s: %s", self._log_name, err,
                             exc_info=not isinstance(err, ServiceUnavailable))
            offers, message = only_no_gpu, f"The GPU allocator is not answering right now: {until}."
        else:
            standing, reservations = await self.gpu_usage_standing(), await self.gpu_reservations()
        return base_html + form.render_form(offers, previous or self.gpu_default_offer, message=message,
                                            standing=standing, reservations=reservations)

    async def gpu_usage_standing(self) -> list[str]:
        """One sentence per usage quota of the user ('you have used 12.50 of 40 GPU-hours this week
        (resets ...)'); none when the service does not say (logged: the form works without them)."""
        try:
            return [quota["message"] for quota in await self.gpu_link().usage_quotas()]
        except Exception as err:  # the offers came; a missing usage line must not break the form
            self.log.warning("GPU usage quotas for %s: %s", self._log_name, err,
                             exc_info=not isinstance(err, (GpuAllocError, PermissionError)))
            return []

    async def gpu_reservations(self) -> list[str]:
        """'ml101 reservation: 22 of 30 free until 12:00 UTC' per reservation of the user not yet
        ended; none when the service does not say (logged: the form works without them)."""
        try:
            return [r["summary"] for r in await self.gpu_link().reservations() if r["state"] != "ended"]
        except Exception as err:  # the offers came; a missing reservation line must not break the form
            self.log.warning("GPU reservations for %s: %s", self._log_name, err,
                             exc_info=not isinstance(err, (GpuAllocError, PermissionError)))
            return []

    @default("options_from_form")
    def _gpu_options_from_form_default(self):
        return self.gpu_options_from_form

    def gpu_options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        """The `gpu` field as {"gpu": name}; every other field read by the spawner class's own
        options_from_form (JupyterHub's passthrough, KubeSpawner's profiles, ...)."""
        others = {key: value for key, value in formdata.items() if key != form.OPTION}
        options = dict(base_class_default(self, "options_from_form")(others) or {})
        if form.OPTION in formdata:
            try:
                options[form.OPTION] = form.gpu_from_form(formdata[form.OPTION])
            except form.OptionsError as err:
                raise spawn_error(str(err), "options", 400) from None
        return options

    @default("apply_user_options")
    def _gpu_apply_default(self):
        return GPUSpawnerMixin.apply_gpu_options

    async def apply_gpu_options(self, user_options: Any) -> None:
        """Check the GPU choice in user_options (400 on a bad one); remember the offer."""
        self._gpu_init()
        self._gpu_offer = await self.choose_gpu_offer(user_options)

    async def choose_gpu_offer(self, user_options: Any) -> dict:
        """The offer user_options["gpu"] names; No GPU is decided without the service."""
        try:
            name = form.chosen_name(user_options, default=self.gpu_default_offer)
        except form.OptionsError as err:
            raise spawn_error(str(err), "options", 400) from None
        if name == form.NO_GPU and (self.gpu_no_gpu_offer or not self.hub_service_url()):
            return form.no_gpu_offer(self.gpu_no_gpu_label)
        try:
            offers = await self.gpu_offers()
        except AllocatorNotConfigured:
            raise capacity_error("This hub has no GPU allocator: choose No GPU to start without a GPU.") from None
        except ServiceUnavailable as err:
            raise capacity_error(f"The GPU allocator is not answering ({err}): choose No GPU to start "
                                 "without a GPU, or try again later.") from None
        except PermissionError as err:
            raise spawn_error(str(err), "permission", 403) from None
        try:
            offer = form.choose_offer(name, offers)
        except form.OptionsError as err:
            raise spawn_error(str(err), "options", 400) from None
        if offer.get("over_quota"):
            raise spawn_error(f"Your quota never allows {offer['label']}: {offer['over_quota']}. "
                              "Choose a smaller one, or ask an administrator for a larger quota.", "quota", 403)
        if offer.get("over_usage_quota"):
            raise spawn_error(f"You cannot have {offer['label']} now: {offer['over_usage_quota']}. "
                              f"{QUOTA_ADVICE['gpu_hours']}", "quota", 403)
        return offer

    # ------------------------------------------------------------ progress
    def _gpu_progress(self, message: str, progress: int | None = None) -> None:
        event: dict[str, Any] = {"message": message}
        if progress is not None:
            event["progress"] = progress
        self._gpu_events.append(event)
        self._gpu_signal.set()
        self.log.info("%s: %s", self._log_name, message)

    async def progress(self):
        """The GPU steps (queue position, grant) first, then the spawner's own progress, whose
        messages keep saying which slice was granted (the page shows only the latest message)."""
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
        if self._gpu_failed:  # no server is being started: its own steps would never happen
            return
        async for event in super().progress():
            if self._gpu_granted and event.get("message") and not event.get("html_message"):
                event = {**event, "message": f"{event['message']} ({self._gpu_granted})"}
            yield event

    # ------------------------------------------------------------ lifecycle
    def clear_state(self) -> None:
        super().clear_state()
        self.gpu_lease.load_state({})
        self._gpu_memory = None
        self._gpu_lost = ""
        self._gpu_events = []
        self._gpu_done = False
        self._gpu_granted = ""

    def get_state(self) -> dict:
        """The spawner class's state, and the server's lease's (`gpu_lease_id`)."""
        state = super().get_state()
        state.update({f"{STATE_PREFIX}{key}": value for key, value in self.gpu_lease.get_state().items()})
        return state

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.gpu_lease.load_state({key.removeprefix(STATE_PREFIX): value for key, value in state.items()
                                   if key.startswith(STATE_PREFIX)})

    def get_env(self) -> dict:
        env = super().get_env()
        self._gpu_init()
        env.update(self.gpu_lease.env(service_url=self.server_service_url(), gpu_memory_mib=self._gpu_memory,
                                      mps=self.gpu_mps, containers=self.gpu_containers,
                                      visible_devices=self.gpu_sets_visible_devices()))
        return env

    def gpu_sets_visible_devices(self) -> bool:
        """Whether the env names the devices (False where a device plugin chooses them)."""
        return True

    def start(self):
        """Begin at once (as KubeSpawner does), so progress() follows this start from its first step."""
        self._gpu_init()
        self._gpu_events, self._gpu_granted, self._gpu_done, self._gpu_failed = [], "", False, False
        return asyncio.ensure_future(self._start_on_slice())

    async def _start_on_slice(self):
        """Hold the chosen slice (if any), then start the server; a failed start gives it back."""
        try:
            offer = self._gpu_offer or await self.choose_gpu_offer(self.user_options)
            self._gpu_offer = None
            if offer.get("spec"):
                await self.acquire_slice(offer)
        except BaseException:
            self._gpu_failed = True
            raise
        finally:
            self._gpu_done = True
            self._gpu_signal.set()
        try:
            url = await self.start_server()
        except BaseException:
            await self._release_after_failed_start()
            raise
        if self.gpu_lease_id:
            self._start_heartbeats()
        return url

    async def _release_after_failed_start(self) -> None:
        """Give the slice back, to the pool at once if no server process is left; one that is left
        is stopped by the hub (it calls stop() after a failed start), which gives it back then."""
        if not self.gpu_lease_id:
            return
        try:
            status = await self._poll_server()
        except Exception:
            self.log.exception("%s: poll after a failed start failed", self._log_name)
            status = None
        if status is not None:
            await self.release_slice("the server failed to start", holder_gone=True)
        else:
            self.log.warning("%s: the server failed to start but still runs: its GPU slice is given back "
                             "once it is stopped", self._log_name)

    async def start_server(self):
        """Start the server itself, the slice already held (the spawner class's own start())."""
        return await super().start()

    async def acquire_slice(self, offer: dict) -> dict:
        """Ask for the server's lease and wait until it is granted; on failure nothing is left held."""
        lease = self.gpu_lease
        what, a_what = describe_spec(offer["spec"]), describe_spec(offer["spec"], article=True)
        started = time.monotonic()
        patience = max(self.start_timeout - self.gpu_start_reserve, 1.0)
        self._gpu_progress(f"asking for {a_what}", 5)
        await self._submit(offer, a_what)
        try:
            said: list[str] = []

            def tell(waiting: Waiting) -> None:
                gives_up = time.strftime("%H:%M:%S UTC", time.gmtime(lease.gives_up_at))  # the deadline the wait states
                words = queue_words(a_what, waiting.position, waiting.reason, gives_up, patience)
                if not said or said[-1] != words:
                    self._gpu_progress(words, 10)
                    said.append(words)

            try:
                view = await lease.wait(patience=patience, on_round=tell, poll=self.gpu_poll_interval,
                                        keeper=self._gpu_keeper(), beat_every=self.gpu_heartbeat_interval)
            except WaitGaveUp as gave_up:
                raise capacity_error(
                    f"No {what} became free within {patience:g} seconds (this hub's start timeout of "
                    f"{self.start_timeout:g} s, less {self.gpu_start_reserve:g} s to start the server; you "
                    f"were number {gave_up.waiting.position} in the queue). Try again later, or choose a smaller "
                    "slice.") from None
            if view["state"] != "granted":
                raise capacity_error(f"Your request for {a_what} ended: {view.get('reason') or view['state']}.")
            slice_ = view["slice"]
            if slice_["kind"] == "shared":
                self._gpu_memory = await self.gpu_link().gpu_memory_mib(slice_["gpu_uuids"][0])
            waited = time.monotonic() - started
            where = slice_.get("mig_uuid") or ", ".join(slice_["gpu_uuids"])
            self._gpu_progress(f"granted {a_what} after {waited:.0f} s ({where} on {slice_['node']})", 40)
            self._gpu_granted = f"on your {what}"
            now = time.time()
            held = deadline_message(view, now)
            if held:
                self._gpu_progress(held, 45)
                self._gpu_granted += f", held until {form.clock_text(view['deadline']['at'], now)}"
            return view
        except BaseException:
            await self.release_slice("withdrawn: the server did not start")
            raise

    async def _submit(self, offer: dict, a_what: str) -> dict:
        """Ask for the offer; a stale lease of the same server (a crashed earlier start) is replaced."""
        lease, link = self.gpu_lease, self.gpu_link()
        try:
            try:
                return await lease.acquire(offer["name"])
            except HolderBusy as err:
                self.log.warning("%s: releasing the stale lease %s of this server", self._log_name, err.lease_id)
                await link.release(err.lease_id)
                return await lease.acquire(offer["name"])
        except QuotaExceeded as err:
            if offer.get("over_quota"):
                raise spawn_error(f"Your quota never allows {a_what}: {err}.", "quota", 403) from None
            advice = QUOTA_ADVICE.get(err.quota.get("key"), "")
            raise capacity_error(f"You cannot have {a_what} now: {err}. {advice}".rstrip()) from None
        except ServiceUnavailable as err:
            raise capacity_error(f"The GPU allocator cannot give you {a_what} now: {err}") from None
        except GpuAllocError as err:
            raise capacity_error(f"The GPU allocator refused {a_what}: {err}") from None

    async def release_slice(self, reason: str, *, holder_gone: bool = False) -> None:
        """Give the server's lease back (if any); errors are logged, never raised.

        `holder_gone` only once the server's process is known to have ended: its slice then
        returns to the pool at once. Without it the slice waits (the lease "returning") until the
        service hears that the holder is gone, or until its heartbeats (stopped here) time out.
        """
        self._gpu_init()
        self._stop_heartbeats()
        await self._release_lease(reason, holder_gone=holder_gone)

    async def _release_lease(self, reason: str, *, holder_gone: bool, lease: HolderLease | None = None) -> None:
        lease = lease or self.gpu_lease
        lease_id = lease.lease_id
        if not lease_id:
            return
        try:
            await lease.release(gone=holder_gone)
            self.log.info("%s: released lease %s (%s)%s", self._log_name, lease_id, reason,
                          "; the server has stopped" if holder_gone else "")
        except (GpuAllocError, PermissionError, AllocatorNotConfigured) as err:
            self.log.warning("%s: could not release lease %s (%s): %s; it ends after the heartbeat TTL",
                             self._log_name, lease_id, reason, err)
            lease.load_state({})
        await self._gpu_close_link()

    # ------------------------------------------------------- stop and poll
    #
    # The spawner class's stop() polls while it waits for the process to end (LocalProcessSpawner's
    # wait_for_death), so poll() must never stop the server itself from inside a stop: one stop at
    # a time runs as a task of its own, and poll() from inside it only says whether the server
    # runs; from anywhere else, poll() waits for that stop to finish first.

    def _gpu_stopping(self) -> asyncio.Future | None:
        """The stop under way (a task), or None."""
        self._gpu_init()
        task = self._gpu_stop_task
        return task if task is not None and not task.done() else None

    async def _gpu_stop(self, now: bool, reason: str) -> int | None:
        """Stop the server with the spawner class's own stop(), then give its slice back: reported
        gone only if poll() then finds the server's process ended. Calls made while a stop runs
        wait for that one. The server's exit status, or None if it still runs."""
        task = self._gpu_stopping()
        if task is None:
            task = self._gpu_stop_task = asyncio.ensure_future(self._gpu_stop_then_release(now, reason))
        return await asyncio.shield(task)

    async def _gpu_stop_then_release(self, now: bool, reason: str) -> int | None:
        _IN_GPU_STOP.set(self)  # this task's context (and tasks it starts): poll() from inside the stop
        kept = self.gpu_lease.get_state()  # kept: the hub may clear the spawner's state meanwhile
        self._heartbeat_while_stopping(kept)
        status = None
        try:
            await super().stop(now=now)
        finally:
            try:
                status = await self._poll_server()
            except Exception:
                self.log.exception("%s: poll after stop failed", self._log_name)
            self._stop_heartbeats()
            if status is None:
                self.log.warning("%s: the server still runs after stop(): its GPU slice is not given back "
                                 "before the service stops hearing from it", self._log_name)
            lease = self.gpu_lease
            if self.gpu_lease_id not in ("", kept.get("lease_id")):  # a newer lease: this stop ends the one it found
                lease = HolderLease(lambda: self.gpu_link().client, self.gpu_holder)
            lease.load_state(kept)
            await self._release_lease(reason, holder_gone=status is not None, lease=lease)
            await self._gpu_close_link()
        return status

    async def stop(self, now: bool = False):
        """Stop the server, then give its slice back (to the pool at once: its process has ended)."""
        await self._gpu_stop(now, "the server stopped")

    async def _poll_server(self):
        """The wrapped spawner's poll(), keeping the lease its clear_state() may drop."""
        kept = self.gpu_lease.get_state()
        status = await super().poll()
        if status is not None and kept:
            self.gpu_lease.load_state(kept)
        return status

    async def poll(self):
        """None while the server runs. A server whose lease ended (released from the sidebar,
        idle, a time limit, a usage quota, preemption) is stopped here, before its slice is
        reported free; a server found dead gives its slice back."""
        self._gpu_init()
        stopping = self._gpu_stopping()
        if stopping is not None:
            if _IN_GPU_STOP.get() is self:  # the spawner class's stop() asking whether it is over
                return await self._poll_server()
            try:
                await asyncio.shield(stopping)
            except Exception:  # logged by the stop's own caller
                pass
        status = await self._poll_server()
        if status is not None:
            if self.gpu_lease_id:
                await self.release_slice(f"the server is not running (status {status})", holder_gone=True)
            return status
        if self.gpu_lease_id:
            if self._gpu_lost:
                return await self._stop_for_lost_lease()
            self._start_heartbeats()
        return None

    async def _stop_for_lost_lease(self) -> int | None:
        """Stop the server whose lease ended, then report it gone (its slice is free only then)."""
        lost = self._gpu_lost
        self.log.warning("%s: stopping the server: its GPU lease ended (%s)", self._log_name, lost)
        return await self._gpu_stop(True, f"the server was stopped: its GPU lease ended ({lost})")

    async def _stop_lost_server_and_tell_the_hub(self) -> None:
        """From the heartbeats: stop the server at once, then let the hub's poll callbacks see
        that it stopped (as its periodic poll would, up to poll_interval later)."""
        try:
            status = await self._stop_for_lost_lease()
            if status is not None:
                await self.poll_and_notify()
        except Exception:
            self.log.exception("%s: stopping the server whose GPU lease ended failed", self._log_name)

    # ------------------------------------------------------------ heartbeats
    def _gpu_keeper(self) -> Keepalive:
        """This spawner's heartbeat (its user's token: one per spawner), made on first use."""
        if self._gpu_keepalive is None:
            self._gpu_keepalive = Keepalive(lambda holders: self.gpu_link().heartbeat(holders),
                                            self.gpu_heartbeat_interval, log=self.log, what=self._log_name)
        return self._gpu_keepalive

    def _start_heartbeats(self) -> None:
        """Keep the running server's lease alive (it joins the spawner's Keepalive): a dead server's
        lease is released at once, and a server whose lease ended is stopped at once (then its slice
        returns)."""
        keeper = self._gpu_keeper()
        if self.gpu_holder not in keeper.kept:
            self.gpu_lease.keepalive(keeper, on_ended=self._server_ended, on_lost=self._server_lease_lost)
        keeper.start()

    def _heartbeat_while_stopping(self, kept: dict) -> None:
        """Heartbeat the server's holder, whatever its lease's state, until the stop has ended its
        processes: a server slow to stop (SIGINT, then SIGTERM, then SIGKILL, then what it left
        running) must not outlive the service's heartbeat TTL, which would free its slice (the lease
        ended and returning, or still active) while its kernels still run on the GPU."""
        self._stop_heartbeats()
        if kept.get("lease_id"):
            keeper = self._gpu_keeper()
            keeper.keep(self.gpu_holder)  # no lease to lose, no proof of life: the stop ends the beats
            keeper.start()

    def _stop_heartbeats(self) -> None:
        keepalive, self._gpu_keepalive = self._gpu_keepalive, None
        if keepalive is not None:
            keepalive.stop()

    async def _server_runs(self) -> bool:
        """The server's proof of life: its process runs (a stop under way counts as running: the
        stop gives the slice back itself)."""
        return self._gpu_stopping() is not None or await self._poll_server() is None

    async def _server_ended(self, holder: str) -> None:
        await self.release_slice("the server is not running", holder_gone=True)

    async def _server_lease_lost(self, holder: str) -> None:
        lease = await self.gpu_lease.read()
        self._gpu_lost = (lease or {}).get("reason") or "the service no longer knows it"
        self._stop_heartbeats()  # (from inside the beat: it ends, its callbacks done)
        asyncio.ensure_future(self._stop_lost_server_and_tell_the_hub())
