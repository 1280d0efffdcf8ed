"""The sidebar's API under `<base_url>gpualloc/api/`: the caller's slices and kernels, the inventory, offers,
request, release, extend (idle), deadline extension, usage, jobs, status and an event stream.

Every handler is authenticated (`@web.authenticated`) and authorized (`@authorized`, resource
`gpualloc`) by jupyter_server; the extension calls the scheduler with the server's credentials.
The sidebar sends `no_track_activity=1`, so its polling does not count as server activity.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web
from tornado.iostream import StreamClosedError

from ..client import GpuAllocError
from ..core.devices.base import DeviceError
from ..core.holders import KERNEL, is_server, kernel_holder, kernel_of, server_holder
from ..holder_lease import HolderLease
from ..service.validation import InputError, parse_json
from ..job_folder import JobFolder
from ..user_files import FILE_THREADS, Refused, read_regular
from ..kernel.cuda_state import driver_loaded
from .embedded import AUTH_RESOURCE
from .gpu_restart import RestartRefused
from .watchdog import classify, process_tree_map

KEEPALIVE_SECONDS = 15.0


class SidebarHandler(ExtensionHandlerMixin, APIHandler):
    """Base: the extension's state, JSON bodies, and service errors as HTTP errors."""

    auth_resource = AUTH_RESOURCE

    def initialize(self, name: str = "gpualloc", *args: Any, **kwargs: Any) -> None:
        super().initialize(name, *args, **kwargs)

    @property
    def ext(self):
        return self.extensionapp

    needs_allocator = True  # False: answers even when no allocator is configured (503 otherwise)

    async def prepare(self) -> None:
        """jupyter_server's checks (Host, identity, XSRF, Origin); a foreign Origin is 403, as on the v1 routes."""
        try:
            await super().prepare()
        except web.HTTPError as err:
            if err.status_code == 404 and not self.check_origin():
                raise web.HTTPError(403, "cross-origin request refused") from None
            raise
        if self.needs_allocator and self.ext.client is None:
            raise web.HTTPError(503, self.ext.off_reason)

    def body(self) -> dict[str, Any]:
        """The JSON object sent, with the API's bounds (depth, NaN, lone surrogates); 400 naming the field."""
        try:
            data = parse_json(self.request.body) if self.request.body.strip() else {}
        except InputError as err:
            raise web.HTTPError(400, str(err)) from None
        if not isinstance(data, dict):
            raise web.HTTPError(400, "body must be a JSON object")
        for name, value in data.items():
            if name in ("offer", "kernel_id", "lease_id") and not isinstance(value, str):
                raise web.HTTPError(400, f"{name} must be a string")
        return data

    def lease_id(self) -> str:
        """The body's `lease_id`; 400 when it is missing or empty."""
        lease_id = self.body().get("lease_id")
        if not isinstance(lease_id, str) or not lease_id:
            raise web.HTTPError(400, "lease_id is required")
        return lease_id

    async def service(self, coro):
        """Await a client call; the service's error becomes this request's (status and message)."""
        try:
            return await coro
        except GpuAllocError as err:
            raise web.HTTPError(err.status if 400 <= err.status < 600 else 502, str(err)) from None

    def lease_entry(self, lease: dict, memory: dict[str, int] | None = None) -> dict[str, Any]:
        """A lease as the sidebar shows it: plus its kernel (if on this server), the caps in force and,
        from `memory` (see kernel_memory), the GPU memory its kernel uses (None where not measured)."""
        entry = dict(lease)
        kernel_id = kernel_of(lease["holder"])
        km = self.ext.serverapp.kernel_manager
        entry["kernel"] = None
        if kernel_id is not None and kernel_id in km:
            kernel = km.get_kernel(kernel_id)
            entry["kernel"] = {"id": kernel_id, "name": kernel.kernel_name,
                               "execution_state": kernel.execution_state}
        entry["caps"] = self.ext.caps(lease)
        entry["used_mib"] = (memory or {}).get(kernel_id) if kernel_id is not None else None
        if entry["kernel"] is not None:  # what the kernel made of a slice granted to it from here
            note = self.ext.monitor.slices.note(kernel_id, lease["id"], lambda: self.kernel_uses_gpu(kernel_id))
            if note:
                entry["note"] = note
        return entry

    def kernel_memory(self) -> dict[str, int]:
        """MiB of GPU memory held by each kernel's processes, as the watchdog's backend reads them."""
        watchdog = self.ext.watchdog
        if watchdog is None:
            return {}
        owners = process_tree_map(watchdog.kernel_pids())
        try:
            processes = watchdog.backend.process_memory()
        except DeviceError:
            return {}
        used: dict[str, int] = {}
        for process in processes:
            kernel_id = owners.get(process.pid)
            if kernel_id is not None and process.used_mib is not None:
                used[kernel_id] = used.get(kernel_id, 0) + process.used_mib
        return used

    def server_memory(self, slice_: dict, leased_kernels: set[str]) -> int | None:
        """MiB of GPU memory this server's own processes hold on a slice the server holds (its kernels' too,
        but for those with a slice of their own); None where not measured or no process holds any."""
        watchdog = self.ext.watchdog
        if watchdog is None:
            return None
        owners = process_tree_map(watchdog.kernel_pids())
        tree = process_tree_map({"server": os.getpid()})
        try:
            processes = watchdog.backend.process_memory()
        except DeviceError:
            return None
        used = [p.used_mib for p in processes if p.pid in tree and p.used_mib is not None
                and owners.get(p.pid) not in leased_kernels and classify(p, [slice_])[1] is not None]
        return sum(used) if used else None

    def kernel_uses_gpu(self, kernel_id: str) -> bool:
        """Whether a kernel of this server may hold a CUDA context: the device backend counts memory
        of its processes, or the CUDA driver library is mapped into its process."""
        km = self.ext.serverapp.kernel_manager
        if kernel_id not in km:
            return False
        if kernel_id in self.kernel_memory():
            return True
        pid = getattr(getattr(km.get_kernel(kernel_id), "provisioner", None), "pid", None)
        return pid is not None and driver_loaded(f"/proc/{pid}/maps")


class SlicesHandler(SidebarHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        leases = await self.service(self.ext.client.leases())
        memory = self.kernel_memory()
        entries = [self.lease_entry(l, memory) for l in leases]
        leased_kernels = {kernel_of(l["holder"]) for l in leases} - {None}
        for entry in entries:
            if entry["holder"] == server_holder() and entry.get("slice"):
                entry["used_mib"] = self.server_memory(entry["slice"], leased_kernels)
        utilization = await asyncio.gather(*(self.recent_utilization(e) for e in entries))
        for entry, samples in zip(entries, utilization):
            entry["utilization"] = samples
        self.finish(json.dumps({"slices": entries}))

    async def recent_utilization(self, lease: dict) -> dict | None:
        """A granted lease's SM utilisation samples of the last minutes (`window`, `now`, `samples`);
        None for a queued lease, or when the allocator does not say."""
        if lease["state"] != "granted":
            return None
        try:
            found = await self.ext.client.recent_utilization(lease["id"])
        except GpuAllocError:  # e.g. released meanwhile: the sparkline waits for the next poll
            return None
        return {key: found[key] for key in ("window", "now", "samples")}


class KernelsHandler(SidebarHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        km = self.ext.serverapp.kernel_manager
        leases = {kernel_of(l["holder"]): l for l in await self.service(self.ext.client.leases())}
        kernels = []
        for kernel_id in km.list_kernel_ids():
            kernel = km.get_kernel(kernel_id)
            lease = leases.get(kernel_id)
            pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
            kernels.append({
                "id": kernel_id, "name": kernel.kernel_name, "execution_state": kernel.execution_state,
                **self.ext.monitor.activity(kernel_id), "pid": pid,
                "lease": self.lease_entry(lease) if lease else None})
        self.finish(json.dumps({"kernels": kernels}))


class InventoryHandler(SidebarHandler):
    """The fleet (REST API v1's inventory) with the caller's name; an admin also sees who holds each slice."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        inventory = await self.service(self.ext.client.inventory())
        identity = await self.service(self.ext.client.whoami())
        if identity["admin"]:
            users = {l["id"]: l["user"] for l in await self.service(self.ext.client.leases(all_users=True))}
            for node in inventory["nodes"]:
                for gpu in node["gpus"]:
                    for held in gpu.get("instances", []) + gpu.get("shares", []):
                        if held.get("lease_id") in users:
                            held["user"] = users[held["lease_id"]]
        self.finish(json.dumps({**inventory, "user": identity["user"], "admin": identity["admin"]}))


class OffersHandler(SidebarHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The service's offers, and the kinds of holder that get no slice here (`refused_holders`), with why."""
        self.finish(json.dumps(await self.service(self.ext.client.offer_sheet())))


class ReservationsHandler(SidebarHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The reservations the caller may use (every one for an admin), each with its one-line summary."""
        self.finish(json.dumps({"reservations": await self.service(self.ext.client.reservations())}))


class RequestHandler(SidebarHandler):
    """POST {"offer": name} or {"spec": {...}}, optional "kernel_id" (else the server holds it), "wait",
    and "restart": where GPU kernels run in pods of their own (Kubernetes), the kernel restarts as one
    (its variables are lost: the sidebar asks first), 202; without it such a request is a 409 saying so."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.body()
        unknown = set(body) - {"offer", "spec", "kernel_id", "wait", "restart"}
        if unknown:
            raise web.HTTPError(400, f"unknown field {sorted(unknown)[0]!r}")
        spec, offer = body.get("spec"), body.get("offer")
        if offer is not None:  # its spec is shown to people; the service resolves the name (and its terms) itself
            offers = {o["name"]: o for o in await self.service(self.ext.client.offers())}
            if offer not in offers:
                raise web.HTTPError(400, f"no offer {offer!r}")
            spec = offers[offer]["spec"]
        if not isinstance(spec, dict):
            raise web.HTTPError(400, "give an offer name or a spec object")
        kernel_id = body.get("kernel_id")
        if kernel_id is not None and kernel_id not in self.ext.serverapp.kernel_manager:
            raise web.HTTPError(404, f"no kernel {kernel_id} on this server")
        if body.get("restart") is not None and not isinstance(body["restart"], bool):
            raise web.HTTPError(400, "restart must be true or false")
        if body.get("restart"):
            await self._restart_as_gpu_kernel(kernel_id, spec, offer or "")
            return
        sheet = await self.service(self.ext.client.offer_sheet())
        refused = sheet.get("refused_holders", {})
        if KERNEL in refused:  # a running process here cannot gain a device: neither a kernel nor the server
            raise web.HTTPError(409, refused[KERNEL] if kernel_id and not sheet.get("kernel_pods") else (
                "a running kernel cannot gain a GPU here: confirm a restart as a GPU kernel (restart: true)"
                if kernel_id else "your running server cannot gain a GPU here: open a notebook and restart its "
                                  "kernel as a GPU kernel, or start your server with a GPU from the hub"))
        holder = kernel_holder(kernel_id) if kernel_id else server_holder()
        wait = body.get("wait")
        if wait is not None and (isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0):
            raise web.HTTPError(400, "wait must be a number of seconds")
        lease = await self.service(HolderLease(self.ext.client, holder).acquire(offer, spec=spec, wait=wait))
        if kernel_id and lease["state"] == "granted":
            self.ext.monitor.attach(kernel_id, lease)
            self.ext.monitor.slices.tell(kernel_id, lease["id"])  # it takes effect before the kernel's next cell
        elif kernel_id:
            self.ext.monitor.slices.awaiting[lease["id"]] = kernel_id  # told once granted
        else:
            self.ext.monitor.extra_holders.add(server_holder())
        self.set_status(201 if lease["state"] == "granted" else 202)
        self.finish(json.dumps(self.lease_entry(lease)))


    async def _restart_as_gpu_kernel(self, kernel_id: str | None, spec: dict, offer: str) -> None:
        if not kernel_id:
            raise web.HTTPError(400, "restart needs a kernel_id: the kernel that restarts as a GPU kernel")
        if self.ext.gpu_restarts is None:
            raise web.HTTPError(409, "no GPU allocator is configured for this server")
        try:
            note = await self.ext.gpu_restarts.start(kernel_id, spec, offer=offer)
        except RestartRefused as err:
            raise web.HTTPError(err.status, str(err)) from None
        self.set_status(202)
        self.finish(json.dumps({"kernel_id": kernel_id, "restarting": True, "offer": offer, "note": note}))


class ReleaseHandler(SidebarHandler):
    """POST {"lease_id": id}. A granted slice of a kernel of this server ends with the kernel: the
    kernel is shut down (its variables are lost: the sidebar asks first), and its slice returns to
    the pool only once the kernel's process has ended (its provisioner reports it gone), as after an
    idle release. A queued request is withdrawn; a kernel's slice held elsewhere returns at once. A
    JupyterHub server's slice returns once the hub has stopped the server (hub/mixin.py); in embedded
    mode the server's own slice runs nothing of its own, so it returns at once."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        lease_id = self.lease_id()
        held = {l["id"]: l for l in await self.service(self.ext.client.leases())}.get(lease_id)
        kernel_id = kernel_of(held["holder"]) if held else None
        stops_kernel = kernel_id in self.ext.serverapp.kernel_manager and held["state"] == "granted"
        server_slice = held is not None and is_server(held["holder"])
        gone = (kernel_id is not None and not stops_kernel) or (server_slice and self.ext.embedded is not None)
        lease = await self.service(self.ext.client.release(lease_id, holder_gone=gone))
        if kernel_id is not None:
            self.ext.monitor.detach(kernel_id)
        note = None
        if stops_kernel:
            stopped = await self.ext.monitor.shut_down(kernel_id)
            lease = await self.service(self.ext.client.lease(lease_id))
            note = "the kernel was shut down, and its slice returned to the pool" if stopped else \
                "the kernel could not be shut down: its slice returns to the pool when it stops"
        entry = self.lease_entry(lease)
        if note:
            entry["note"] = note
        self.finish(json.dumps(entry))


class ExtendHandler(SidebarHandler):
    """POST {"lease_id": id}: count now as the holder's activity, which clears an idle warning."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        lease = await self.service(self.ext.client.touch(self.lease_id(), last_activity=time.time()))
        self.finish(json.dumps(self.lease_entry(lease)))


class DeadlineExtendHandler(SidebarHandler):
    """POST {"lease_id": id}: move a time-boxed lease's deadline later (REST API v1's extend); 409 says why not."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        lease = await self.service(self.ext.client.extend(self.lease_id()))
        self.finish(json.dumps(self.lease_entry(lease)))


class UsageHandler(SidebarHandler):
    """GET: the caller's GPU-hours this month, usage quotas (REST API v1's usage report, the caller's own) and
    `history`: their GPU-hours per day of the last 14 days, split by offer."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        identity = await self.service(self.ext.client.whoami())
        usage, history = await asyncio.gather(self.service(self.ext.client.usage(user=identity["user"])),
                                              self.service(self.ext.client.usage_history(user=identity["user"])))
        self.finish(json.dumps({**usage, "history": history["days"]}))


class JobsHandler(SidebarHandler):
    """GET: the caller's background jobs; POST: submit one (REST API v1's job object). Embedded and remote alike."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(json.dumps({"jobs": await self.service(self.ext.client.jobs())}))

    @web.authenticated
    @authorized
    async def post(self) -> None:
        job = await self.service(self.ext.client.submit_job(self.body()))
        self.set_status(201)
        self.finish(json.dumps(job))


class JobHandler(SidebarHandler):
    """GET: one of the caller's jobs; DELETE: cancel it."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        self.finish(json.dumps(await self.service(self.ext.client.job(job_id))))

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        self.finish(json.dumps(await self.service(self.ext.client.cancel_job(job_id))))


class JobRerunHandler(SidebarHandler):
    """POST: run a finished job again, as a new job."""

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        job = await self.service(self.ext.client.rerun_job(job_id))
        self.set_status(201)
        self.finish(json.dumps(job))


class JobLogHandler(SidebarHandler):
    """GET: a job's log as text; with follow=1, streamed as it grows until the job ends."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        await self.service(self.ext.client.job(job_id))  # an unknown job is a 404 before any text is sent
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        if self.get_query_argument("follow", "0") in ("0", "", "false"):
            self.finish(await self.service(self.ext.client.job_log(job_id)))
            return
        self.set_header("Cache-Control", "no-store")
        chunks = self.ext.client.follow_job_log(job_id)
        try:
            async for chunk in chunks:
                self.write(chunk)
                await self.flush()
        except StreamClosedError:
            return
        except GpuAllocError as err:
            self.write(f"\n(the log stopped: {err})\n")
        finally:
            await chunks.aclose()
        self.finish()


class ExecutedNotebookHandler(SidebarHandler):
    """GET: a notebook job's executed notebook, as JSON; its `.gpualloc/` folder is hidden from the contents API."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        job = await self.service(self.ext.client.job(job_id))
        path = JobFolder(job["workdir"], job["id"]).executed
        try:  # read as this server's user would, off the IOLoop: a FIFO there never blocks it
            notebook = await asyncio.get_running_loop().run_in_executor(FILE_THREADS, read_regular, str(path))
        except (OSError, Refused):
            raise web.HTTPError(404, f"job {job_id} has no executed notebook (yet)") from None
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(notebook)


class StatusHandler(SidebarHandler):
    """Mode (`off` when no allocator is configured, with the `reason`), API root, and the watchdog's settings."""

    needs_allocator = False

    @web.authenticated
    @authorized
    async def get(self) -> None:
        watchdog, client = self.ext.watchdog, self.ext.client
        self.finish(json.dumps({
            "mode": "off" if client is None else "embedded" if self.ext.embedded is not None else "remote",
            "reason": self.ext.off_reason if client is None else None,
            "api_url": None if client is None else client.url,
            "watchdog": None if watchdog is None else {"enabled": watchdog.enabled, "interval": watchdog.interval,
                                                       "grace": watchdog.grace, "action": watchdog.action},
        }))


class EventsHandler(SidebarHandler):
    """Server-sent events: each gpualloc event (lease.*, kernel.*, watchdog.*) as `data: {json}`."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        queue: asyncio.Queue = asyncio.Queue(maxsize=1000)

        async def listener(event_type: str, data: dict) -> None:
            if not queue.full():
                queue.put_nowait({"type": event_type, **data})

        remove = self.ext.events.add_listener(listener)
        try:
            self.write(": connected\n\n")
            await self.flush()
            while not self.request.connection.stream.closed():
                try:
                    event = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
                    self.write(f"data: {json.dumps(event)}\n\n")
                except asyncio.TimeoutError:
                    self.write(": keepalive\n\n")
                await self.flush()
        except StreamClosedError:
            pass
        finally:
            remove()


def routes() -> list[tuple[str, type]]:
    """(path, handler) pairs, under the server's base URL."""
    return [
        (r"/gpualloc/api/slices", SlicesHandler),
        (r"/gpualloc/api/kernels", KernelsHandler),
        (r"/gpualloc/api/inventory", InventoryHandler),
        (r"/gpualloc/api/offers", OffersHandler),
        (r"/gpualloc/api/reservations", ReservationsHandler),
        (r"/gpualloc/api/request", RequestHandler),
        (r"/gpualloc/api/release", ReleaseHandler),
        (r"/gpualloc/api/extend", ExtendHandler),
        (r"/gpualloc/api/deadline/extend", DeadlineExtendHandler),
        (r"/gpualloc/api/usage", UsageHandler),
        (r"/gpualloc/api/jobs", JobsHandler),
        (r"/gpualloc/api/jobs/([^/]+)", JobHandler),
        (r"/gpualloc/api/jobs/([^/]+)/rerun", JobRerunHandler),
        (r"/gpualloc/api/jobs/([^/]+)/log", JobLogHandler),
        (r"/gpualloc/api/jobs/([^/]+)/executed", ExecutedNotebookHandler),
        (r"/gpualloc/api/status", StatusHandler),
        (r"/gpualloc/api/events", EventsHandler),
    ]
