"""The Jupyter server extension: sidebar API, per-kernel slices, idle reports, the watchdog, embedded mode.

Remote mode (JupyterHub, or GPUALLOC_URL / `service_url` set): the extension talks to the
scheduler service with the server's credentials. Embedded mode (neither): it hosts the core
in-process and serves REST API v1 itself at `<base_url>gpualloc/api/v1/`. A server under a hub
with no allocator configured logs one line and runs without GPU features; one whose allocator
does not answer logs one line, starts kernels without slices and keeps trying quietly. In remote
mode the extension's one event stream from the service is passed on to its kernels (relay.py);
it resumes where it stopped after an outage, or catches up from the state after a reset (resync.py).
"""

from __future__ import annotations

import asyncio
import getpass
import inspect
import os
import signal
import sys
import time
from pathlib import Path

from jupyter_client.provisioning.factory import KernelProvisionerFactory
from jupyter_core.paths import jupyter_config_dir, jupyter_data_dir
from jupyter_server._tz import utcnow
from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Float, Int, Unicode, default, validate

from ..client import Availability, GpuAllocClient, GpuAllocError, NotFound, StreamPosition, discover
from ..core.devices import make_backend
from ..core.devices.base import DeviceBackend, DeviceError, DeviceUnavailable
from ..core.holders import kernel_holder, server_holder
from ..core.policy import SchedulerPolicy
from ..core.store import sqlite_url
from ..jobs.runner import JobRunner
from ..service.events import REPLAY_SIZE
from . import handlers
from .embedded import URL_ROOT, EmbeddedScheduler
from .events import GpuAllocEvents
from .gpu_restart import RESTART_PATH, GpuKernelRestarts, KernelRestartHandler
from .idle import KernelActivityMonitor
from .kernelspecs import install_kernelspecs
from .provisioner import KernelLink, install_link, install_off_reason
from .relay import EVENTS_PATH, RELAY_ROOT, KernelEventRelay, KernelEventsHandler
from .resync import RESET, StreamMirror
from .watchdog import Watchdog, cap_mechanisms

def no_gpu_reason(nvml_error: str) -> str:
    """Embedded mode on a machine without GPUs and without a fleet file: what is off, and what to set."""
    config = Path(jupyter_config_dir()) / "jupyter_server_config.py"
    return (f"GPU slices and jobs are off: no GPU was found ({nvml_error}) and no fleet file is configured. "
            f"To use simulated GPUs, set c.GpuAllocExtension.fleet = \"example:demo\" (or a fleet file's path) in {config} "
            "and restart the server.")


PROVISIONER_ENTRY_POINT = "jupyter_gpualloc.server.provisioner:GpuAllocProvisioner"
# Server stop: seconds it waits for periodic work in flight (each call to the service has its own timeout)
# and for its kernels' shutdowns (a stubborn kernel is killed after KernelManager.shutdown_wait_time)
IN_FLIGHT_WAIT = 5.0
KERNELS_STOP_WAIT = 15.0


class GpuAllocExtension(ExtensionApp):
    """GPU slices for this server's kernels, from the gpualloc scheduler (remote or embedded)."""

    name = "gpualloc"
    load_other_extensions = True
    classes = [SchedulerPolicy, Watchdog]

    mode = Unicode(
        "auto", help="""remote: use the scheduler service (URL from service_url, $GPUALLOC_URL or
        JupyterHub's); embedded: host the scheduler core in this server; auto: remote when a service
        URL is configured or the server runs under JupyterHub, else embedded.""",
    ).tag(config=True)
    service_url = Unicode("", help="Remote mode: the service's root URL (its REST API is <url>api/v1/).").tag(config=True)
    service_token = Unicode(
        "", help="Remote mode: the token the server uses with the service. Default: $GPUALLOC_TOKEN, else $JUPYTERHUB_API_TOKEN.",
    ).tag(config=True)
    report_interval = Float(
        30.0, help="""Seconds between activity reports of GPU kernels and heartbeats of every kernel;
        keep it well under the scheduler's heartbeat_ttl.""",
    ).tag(config=True)
    job_poll_interval = Float(
        2.0, help="""Seconds between the job runner's rounds: heartbeat the owner's jobs, start those whose
        slice is granted, stop those cancelled or preempted. Jobs run inside this server: stopping it stops them.""",
    ).tag(config=True)
    kernel_wait_timeout = Float(
        300.0, help="Seconds a kernel start waits for a queued slice before it fails.",
    ).tag(config=True)
    all_kernels = Bool(
        True, help="""Launch every kernel without its own provisioner with the gpualloc provisioner, so
        each gets the variables the %gpu magic needs (and a lease it obtained is applied on restart).""",
    ).tag(config=True)
    gpu_kernelspecs = Bool(
        False, help="At start, install a kernelspec per offer, e.g. 'Python 3 (GPU 1g.10gb)'.",
    ).tag(config=True)
    kernelspec_prefix = Unicode(
        "", help="Where gpu_kernelspecs are installed: a prefix (sys.prefix-like); empty: this environment's.",
    ).tag(config=True)
    backend = Unicode(
        "", help="""Embedded mode (and the watchdog): where GPUs come from, simulated or nvml. Default:
        simulated when a fleet is given, else nvml.""",
    ).tag(config=True)
    fleet = Unicode("", help="""Fleet file (YAML or JSON) of the simulated backend, or a shipped example:
        example:demo (two MIG A100-80GB, a shared H100, an L4), example:multi-node, example:static-mig.""").tag(config=True)
    process_dir = Unicode(
        "", help="Simulated backend: directory where processes report their GPU memory (see report_process_memory).",
    ).tag(config=True)
    db_url = Unicode(help="Embedded mode: SQLAlchemy URL of the state database. Default: a SQLite file under the Jupyter data dir.").tag(config=True)
    audit_log = Unicode("", help="Embedded mode: JSON-lines file of every scheduler event; empty: none.").tag(config=True)
    event_replay_size = Int(
        REPLAY_SIZE, min=0, help="""Embedded mode: how many of the latest events are kept for event streams that
        resume (Last-Event-ID or ?since=), as GpuAllocService.event_replay_size is for the service.""",
    ).tag(config=True)
    tick_interval = Float(5.0, help="Embedded mode: seconds between scheduler ticks.").tag(config=True)
    owner = Unicode(help="Embedded mode: the user every authenticated caller of this server is. Default: the OS user.").tag(config=True)
    owner_is_admin = Bool(True, help="Embedded mode: whether the owner administers the allocator (drain, all leases, metrics).").tag(config=True)

    @default("owner")
    def _default_owner(self) -> str:
        return getpass.getuser()

    @default("db_url")
    def _default_db_url(self) -> str:
        path = Path(jupyter_data_dir()) / "gpualloc" / "gpualloc.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        return sqlite_url(path)

    @validate("mode")
    def _check_mode(self, proposal) -> str:
        if proposal["value"] not in ("auto", "remote", "embedded"):
            raise ValueError("mode must be auto, remote or embedded")
        return proposal["value"]

    # ------------------------------------------------------------------ setup
    @property
    def embedded_mode(self) -> bool:
        if self.mode != "auto":
            return self.mode == "embedded"
        return not (self.service_url or os.environ.get("GPUALLOC_URL") or os.environ.get("JUPYTERHUB_API_TOKEN"))

    def initialize_settings(self) -> None:
        self._sigint_handler = self._stop_on_sigint()
        self._tasks: list[asyncio.Task] = []
        self._callbacks: list[PeriodicCallback] = []
        self._in_flight: set[asyncio.Future] = set()  # periodic callbacks' runs not finished yet
        self.runner: JobRunner | None = None
        self._default_provisioner: str | None = None
        self.events = GpuAllocEvents(self.serverapp.event_logger)
        self.embedded: EmbeddedScheduler | None = None
        self.client: GpuAllocClient | None = None  # None: no allocator configured, GPU features off
        self.gpu_restarts: GpuKernelRestarts | None = None  # kernels restarting as GPU kernels in pods
        self.watchdog: Watchdog | None = None
        self.server_leases: list[dict] = []
        self.kernel_events = KernelEventRelay()  # remote mode: the service's events, on to this server's kernels
        self.stream_position = StreamPosition()  # remote mode: where the service's stream resumes
        self.stream_mirror = StreamMirror()  # remote mode: what that stream told, to catch up after a reset
        device_backend: DeviceBackend | None = None
        self.off_reason = "no GPU allocator is configured for this server"  # why GPU features are off, when they are
        if self.embedded_mode:
            try:
                self.embedded = self._embedded_scheduler()
            except DeviceUnavailable as err:
                if self.backend or self.fleet:
                    raise
                self.off_reason = no_gpu_reason(str(err))
                self.log.warning("gpualloc: %s", self.off_reason)
                self._tell_kernels_gpu_is_off()
                return
            device_backend = self.embedded.backend
            self.client = GpuAllocClient(self.embedded_url(), self.server_token() or "unused")
            self.kernel_token = self.server_token()
        else:
            try:
                endpoint = discover(self.service_url or None, self.service_token or None)
            except ValueError as err:
                self.off_reason = f"no GPU allocator is configured for this server ({err})"
                self.log.warning("gpualloc: no GPU allocator is configured for this server (%s); "
                                 "GPU slices and jobs are off, kernels start as usual", err)
                self._tell_kernels_gpu_is_off()
                return
            self.client = GpuAllocClient(endpoint.url, endpoint.token)
            self.kernel_token = endpoint.token
            device_backend = self._watchdog_backend()
        self.availability = Availability(self.client.url, self.log)
        km = self.serverapp.kernel_manager
        self.monitor = KernelActivityMonitor(self.client, km, self.events, log=self.log)
        self.watchdog = (Watchdog(device_backend, km, self.monitor.lease_of, self.events,
                                  shared_slices=self.server_slices, server_leases=self.granted_server_leases,
                                  send_utilization=self._send_utilization, parent=self)
                         if device_backend is not None else None)
        self._link_kernels()
        self.gpu_restarts = GpuKernelRestarts(km, log=self.log)
        self.log.info("gpualloc: %s mode, API at %s", "embedded" if self.embedded else "remote", self.client.url)

    def _stop_on_sigint(self):
        """Make SIGINT stop the server through its shutdown sequence, as SIGTERM does, where jupyter_server
        left it to Python (its stdin is not a terminal: under systemd, nohup or a hub started so). There a
        SIGINT, JupyterHub's stop signal, raised KeyboardInterrupt out of the event loop: the server exited
        without stopping its extensions or its kernels, whose slices stayed held until the heartbeat TTL.
        SIGINT ignored from the start (the server, or the hub that spawned it, started in the background
        of a script: a shell makes such a job ignore SIGINT) is taken over too: it is still JupyterHub's stop.
        The handler it replaces, to put back at stop; None when it left SIGINT as it was."""
        if signal.getsignal(signal.SIGINT) not in (signal.default_int_handler, signal.SIG_IGN):
            return None  # a terminal's confirmation prompt, or JupyterHub's own stop
        return signal.signal(signal.SIGINT, self.serverapp._signal_stop)

    def _embedded_scheduler(self) -> EmbeddedScheduler:
        return EmbeddedScheduler.from_config(
            backend=self.backend, fleet=self.fleet, process_dir=self.process_dir,
            state_file=str(Path(self.db_url.replace("sqlite:///", "")).with_suffix(".mig.json"))
            if self.db_url.startswith("sqlite:///") else "",
            db_url=self.db_url, parent=self, user=self.owner, admin=self.owner_is_admin,
            audit_log=self.audit_log, replay_size=self.event_replay_size, log=self.log)

    def server_token(self) -> str:
        return self.serverapp.identity_provider.token or ""

    def embedded_url(self) -> str:
        """This server's own gpualloc root as kernels reach it: http://127.0.0.1:PORT/<base_url>gpualloc/."""
        return self.url_for_kernels(URL_ROOT)

    def url_for_kernels(self, root: str) -> str:
        """http://127.0.0.1:PORT/<base_url><root>/: a path of this server as its kernels reach it."""
        app = self.serverapp
        host = app.ip if app.ip not in ("", "0.0.0.0", "::", "*", "localhost") else "127.0.0.1"
        scheme = "https" if app.certfile else "http"
        return f"{scheme}://{host}:{app.port}{app.base_url}{root}/"

    def _watchdog_backend(self) -> DeviceBackend | None:
        """Remote mode: this machine's GPUs, to read their processes (None when there are none)."""
        name = self.backend or ("simulated" if self.fleet else "nvml")
        options = {"fleet": self.fleet, "process_dir": self.process_dir or None} if name == "simulated" else {}
        try:
            return make_backend(name, **options)
        except DeviceError as err:
            self.log.info("gpualloc: no watchdog (%s)", err)
            return None

    def _link_kernels(self) -> None:
        """Make gpualloc the kernels' provisioner, linked to the client."""
        self._use_gpualloc_provisioner()
        self._install_kernel_link()

    def _tell_kernels_gpu_is_off(self) -> None:
        """GPU features are off: kernels still get %gpu, which says why in one line."""
        self._use_gpualloc_provisioner()
        install_off_reason(self.off_reason)

    def _use_gpualloc_provisioner(self) -> None:
        """Make gpualloc the kernels' default provisioner (the default one kept to put back at stop)."""
        factory = KernelProvisionerFactory.instance(parent=self.serverapp)
        if "gpualloc" not in factory.provisioners:  # an editable checkout without installed entry points
            from importlib.metadata import EntryPoint
            factory.provisioners["gpualloc"] = EntryPoint(
                "gpualloc", PROVISIONER_ENTRY_POINT, KernelProvisionerFactory.GROUP_NAME)
        if self.all_kernels:
            self._default_provisioner = factory.default_provisioner_name
            factory.default_provisioner_name = "gpualloc"

    def _install_kernel_link(self) -> None:
        """What this server's kernels are given to reach the allocator: its client's URL and token."""
        self.kernel_link = KernelLink(self.client, self.client.url, self.kernel_token, self.monitor,
                                      self.kernel_wait_timeout)
        install_link(self.kernel_link)

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers.routes())
        web_app = self.serverapp.web_app
        if self.embedded is not None:
            # added as they are (URLSpecs with their kwargs), under the server's base URL
            web_app.add_handlers(".*$", self.embedded.handlers(web_app.settings["base_url"]))
        elif self.client is not None:  # kernels follow the service's events, and restart as GPU kernels, here
            base_url = web_app.settings["base_url"]
            web_app.add_handlers(".*$", [
                (url_path_join(base_url, EVENTS_PATH), KernelEventsHandler,
                 {"relay": self.kernel_events, "kernels_token": self.kernel_token}),
                (url_path_join(base_url, RELAY_ROOT) + RESTART_PATH, KernelRestartHandler,
                 {"restarts": self.gpu_restarts, "kernels_token": self.kernel_token})])

    def server_slices(self) -> list[dict]:
        """Slices of the server's own leases (kernels without a lease inherit the server's env)."""
        return [l["slice"] for l in self.server_leases if l.get("slice")]

    def granted_server_leases(self) -> list[dict]:
        return [l for l in self.server_leases if l.get("state") == "granted"]

    async def _send_utilization(self, lease_id: str, sm_percent: float) -> None:
        await self.client.utilization(lease_id, sm_percent)

    def caps(self, lease: dict) -> list[str]:
        return cap_mechanisms(lease, watchdog=self.watchdog is not None and self.watchdog.enabled)

    # ------------------------------------------------------------ running
    async def _start_jupyter_server_extension(self, serverapp) -> None:
        if self.client is None:
            return
        if self.embedded is not None and self.embedded_url() != self.client.url:
            # the port was only settled when the server bound it
            await self.client.close()
            self.client = self.monitor.client = GpuAllocClient(self.embedded_url(), self.server_token() or "unused")
            self.availability.url = self.client.url
            self._install_kernel_link()  # not _link_kernels: it would keep "gpualloc" as the default to put back
        if self.embedded is not None:
            self.embedded.broker.add_listener(self._on_core_event)
            self._every(self.tick_interval, self.embedded.tick)
        else:
            self.kernel_link.events_url = self.url_for_kernels(RELAY_ROOT)  # the port is settled now
            self._tasks.append(asyncio.ensure_future(self._relay_service_events()))
        self._every(self.report_interval, self._report)
        self.runner = JobRunner(self.client, service_url=self.client.url,
                                mps=bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")), on_activity=self._job_activity,
                                log=self.log, availability=self.availability)
        self._every(self.job_poll_interval, self.runner.poll)
        if self.watchdog is not None and self.watchdog.enabled:
            self._every(self.watchdog.interval, self._watch)
        if self.gpu_kernelspecs:
            self._tasks.append(asyncio.ensure_future(self._install_kernelspecs()))

    def _every(self, seconds: float, callback) -> None:
        """Run `callback` (sync or async) every `seconds`; its runs in flight are awaited at stop."""

        def run():
            result = callback()
            if not inspect.isawaitable(result):
                return None
            future = asyncio.ensure_future(result)
            self._in_flight.add(future)
            future.add_done_callback(self._in_flight.discard)
            return future

        pc = PeriodicCallback(run, seconds * 1000)
        pc.start()
        self._callbacks.append(pc)

    def _on_core_event(self, event) -> None:
        """Embedded mode: a core event into jupyter_events (a failure here must not fail the API call)."""
        data = event.to_json()
        try:
            self.events.relay_lease_event(data)
        except Exception:
            self.log.exception("gpualloc: cannot emit %s", data["type"])
        self._tasks.append(asyncio.ensure_future(self.monitor.on_event(data)))
        self._tasks = [t for t in self._tasks if not t.done()]

    async def _relay_service_events(self) -> None:
        """Remote mode: the service's event stream (this user's) into the kernels' relay, jupyter_events
        and the idle monitor. After a disconnect the stream resumes after the last event read, and the
        service replays what came meanwhile; when it cannot (`stream.reset`), the server reads its
        user's leases, jobs and usage quotas again and passes on what changed (resync.py)."""
        delay = 1.0
        while True:
            try:
                if self.stream_position.last_id is None:  # first connection: the state, and every event after it
                    start = await self.client.event_position()
                    self.stream_mirror.load(await self.client.leases(), await self._jobs(), await self._quotas())
                    self.stream_position.last_id = start
                async for event in self.client.events(position=self.stream_position):
                    delay = 1.0
                    self.availability.answered()
                    if event.get("type") == RESET:
                        await self._catch_up(event)
                    else:
                        await self._pass_on(event)
            except (GpuAllocError, OSError) as err:
                self.availability.failed(err)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)

    async def _pass_on(self, event: dict) -> None:
        self.stream_mirror.seen(event)
        self.kernel_events.publish(event)
        self.events.relay_lease_event(event)
        await self.monitor.on_event(event)

    async def _catch_up(self, reset: dict) -> None:
        """The service could not replay what this server missed: read the state, pass on what changed."""
        self.log.info("gpualloc: event stream reset (%s): reading leases and jobs again",
                      (reset.get("data") or {}).get("reason", ""))
        leases = await self.client.leases()
        ended: dict[str, dict | None] = {}
        for lease_id in self.stream_mirror.missing(leases):
            try:
                ended[lease_id] = await self.client.lease(lease_id)
            except NotFound:
                ended[lease_id] = None
        for event in self.stream_mirror.catch_up(leases, ended, await self._jobs(), reset.get("time") or 0.0,
                                                 await self._quotas()):
            await self._pass_on(event)

    async def _quotas(self) -> list[dict]:
        """This user's usage quotas and where each stands ([] when the service does not answer for
        them: the leases' and jobs' catch-up goes on without)."""
        try:
            return (await self.client.usage())["quotas"]
        except GpuAllocError as err:
            self.log.warning("gpualloc: cannot read the usage quotas: %s", err)
            return []

    async def _jobs(self) -> list[dict]:
        """This user's jobs ([] from a service without jobs)."""
        try:
            return await self.client.jobs()
        except NotFound:
            return []

    async def _report(self) -> None:
        try:
            await self.monitor.report()
            self.server_leases = [l for l in await self.client.leases() if l["holder"] == server_holder()]
        except GpuAllocError as err:
            self.availability.failed(err)
        else:
            self.availability.answered()

    def _job_activity(self) -> None:
        """Queued or running jobs count as activity, so JupyterHub's idle culler keeps this server."""
        self.serverapp.web_app.settings["last_activity_times"]["gpualloc_jobs"] = utcnow()

    async def _watch(self) -> None:
        await self.watchdog.check(time.time())

    async def _install_kernelspecs(self) -> None:
        try:
            sheet = await self.client.offer_sheet()
        except GpuAllocError as err:
            self.log.warning("gpualloc: no GPU kernelspecs installed, the offers are unavailable: %s", err)
            return
        offers = sheet["offers"]
        self.kernel_link.kernel_pods = bool(sheet.get("kernel_pods"))
        names = install_kernelspecs(offers, prefix=self.kernelspec_prefix or os.environ.get("CONDA_PREFIX")
                                    or sys.prefix)
        self.log.info("gpualloc: installed kernelspecs %s", ", ".join(names))

    async def stop_extension(self) -> None:
        """Stop the periodic work, shut the kernels down (releasing their slices), then close.

        Nothing in flight is cut midway: periodic runs are awaited (bounded), and kernel shutdowns
        (those the monitor began for ended leases included) each happen once, awaited (bounded).
        """
        for pc in self._callbacks:
            pc.stop()
        for task in self._tasks:  # the event relay and the kernelspec install; kernel shutdowns are shielded
            task.cancel()
        self.kernel_events.close()
        if self.client is not None:
            await self.gpu_restarts.close()
        if self._in_flight:
            await asyncio.wait(list(self._in_flight), timeout=IN_FLIGHT_WAIT)
        if self.runner is not None:  # embedded: the server no longer listens, its jobs are reported in-process
            await self.runner.close(self.embedded.finish_job if self.embedded is not None else None)
        if self.client is not None:
            kernels = self.serverapp.kernel_manager.list_kernel_ids()
            if self.embedded is not None:  # the server no longer listens: its kernels' provisioners cannot call it
                self.kernel_link.released_by_server = True
            left = await self.monitor.shut_down_all(KERNELS_STOP_WAIT)
            if left:
                self.log.warning("gpualloc: kernels %s are still shutting down", ", ".join(left))
            if self.embedded is not None:
                self.embedded.release_holders({kernel_holder(k) for k in kernels}, "its kernel stopped with the server")
            else:  # kernels whose end the service did not hear yet: told once more
                await self.monitor.report_gone()
        install_link(None)
        install_off_reason("")
        if self._sigint_handler is not None:
            signal.signal(signal.SIGINT, self._sigint_handler)
        if self._default_provisioner is not None:
            KernelProvisionerFactory.instance().default_provisioner_name = self._default_provisioner
        if self.client is not None:
            await self.client.close()
        if self.embedded is not None:
            self.embedded.close()
        elif self.watchdog is not None:
            self.watchdog.backend.close()
