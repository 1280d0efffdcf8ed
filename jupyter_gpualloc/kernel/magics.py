"""The `%gpu` line magic: ask the allocator for a slice from inside a kernel, see it, give it back.

A granted slice takes effect in the running kernel (CUDA_VISIBLE_DEVICES and the memory-cap
variables in `os.environ`, framework caps on import) when no CUDA context exists yet; otherwise
the magic says the kernel must restart, and the lease stays with the kernel so the kernel
provisioner applies it at the restart. Releasing it gives the kernel back its JupyterHub server's
slice when the server holds one. Every failure prints one line to stderr, never a traceback.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
from typing import Callable, MutableMapping

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from ..core.holders import KERNEL, kernel_of
from ..core.holders import kernel_holder as holder_of_kernel
from ..holder import Keepalive, Waiting, WaitGaveUp
from ..holder_lease import HolderLease
from ..lease_env import IN_A_POD_VARIABLE, KEPT_ALIVE_VARIABLE, OFF_VARIABLE
from .arguments import JOB_WORDS, gpu_parser, parse_gpu_line, request_arguments, spec_from_args
from .caps import FrameworkCaps, MemoryCap, apply_lease_env, cap_from_env, clear_lease_env, restore_env, slice_variables
from .cuda_state import cuda_initialised_by, memory_used_mib
from .extend import extend_lines
from .notices import LeaseNotices
from .sizes import InputError, format_duration, format_mib, parse_duration
from .status import describe_lease, describe_request, describe_slice, error_line, is_reported, lease_table, \
    mig_memory, status_lines
from .usage import usage_lines

ACTIVE = ("queued", "granted")
HEARTBEAT_INTERVAL = 30.0
POLL_INTERVAL = 1.0
SERVER_NAME_VARIABLE = "JUPYTERHUB_SERVER_NAME"  # JupyterHub sets it in every single-user server
# A failed heartbeat is tried again at the next one; the lease's notices say what matters to the user,
# so nothing of it is printed into a cell.
QUIET_LOG = logging.getLogger("jupyter_gpualloc.kernel.keepalive")
QUIET_LOG.addHandler(logging.NullHandler())
QUIET_LOG.propagate = False


def kernel_holder(environ: MutableMapping[str, str], connection_file: str | None) -> str:
    """$GPUALLOC_HOLDER, else 'kernel:<id>' from ipykernel's connection file kernel-<id>.json."""
    holder = environ.get("GPUALLOC_HOLDER")
    if holder:
        return holder
    if connection_file:
        match = re.fullmatch(r"kernel-(.+)\.json", os.path.basename(connection_file))
        if match:
            return holder_of_kernel(match.group(1))
    return holder_of_kernel(f"pid-{os.getpid()}")


def server_holder_of(environ: MutableMapping[str, str]) -> str | None:
    """The holder of the lease of the JupyterHub server this kernel runs in; None outside JupyterHub."""
    if SERVER_NAME_VARIABLE not in environ:
        return None
    from ..lease_env import server_holder

    return server_holder(environ[SERVER_NAME_VARIABLE])


def running_connection_file() -> str | None:
    """The connection file of the ipykernel this code runs in, or None outside a kernel."""
    if "ipykernel.kernelapp" not in sys.modules:
        return None
    from ipykernel.kernelapp import IPKernelApp

    return IPKernelApp.instance().connection_file if IPKernelApp.initialized() else None


class Progress:
    """One line updated in place: a display in a notebook, a carriage-return line in a terminal."""

    def __init__(self, in_kernel: bool):
        self.in_kernel = in_kernel
        self._handle = None
        self._width = 0

    def show(self, text: str) -> None:
        if self.in_kernel:
            from IPython.display import display

            if self._handle is None:
                self._handle = display({"text/plain": text}, raw=True, display_id=True)
            else:
                self._handle.update({"text/plain": text}, raw=True)
        else:
            sys.stdout.write("\r" + text.ljust(self._width))
            sys.stdout.flush()
            self._width = len(text)

    def done(self, text: str) -> None:
        self.show(text)
        if not self.in_kernel:
            sys.stdout.write("\n")
            sys.stdout.flush()


class KernelGpu:
    """This kernel's side of the allocator: its holder name, its lease, and making a grant take effect."""

    def __init__(self, *, environ: MutableMapping[str, str] | None = None, in_kernel: bool = False,
                 poll_interval: float = POLL_INTERVAL, heartbeat_interval: float = HEARTBEAT_INTERVAL,
                 clock: Callable[[], float] = time.time):
        self.environ = os.environ if environ is None else environ
        self.holder = kernel_holder(self.environ, running_connection_file())
        self.in_kernel = in_kernel
        self.poll_interval = poll_interval
        self.clock = clock
        self._client = None
        self._events_client = None
        # a lease the provisioner applied at launch is in effect already (or, in a server holding
        # a slice, the server's lease: `status` tells them apart by holder)
        self.lease_id: str | None = self.environ.get("GPUALLOC_LEASE_ID") or None
        self.launch_env = {name: self.environ[name] for name in slice_variables() if name in self.environ}
        self.applied_id: str | None = self.lease_id
        self.restart_needed_for: str | None = None
        self.caps = FrameworkCaps()
        self.heartbeat_interval = heartbeat_interval
        self._keeper: Keepalive | None = None  # this process's one heartbeat, on the client's loop
        # this kernel's own lease (asked for by %gpu): the one holder lifecycle, run on the client's loop
        self.gpu_lease = HolderLease(lambda: self.client.asynchronous, self.holder)
        self.notices = LeaseNotices(lambda: self.events_client, lambda: self.lease_id,
                                    read_lease=lambda lease_id: self.client.lease(lease_id),
                                    read_quotas=self.usage_quotas)
        cap = cap_from_env(self.environ)
        if cap is not None:
            self.caps.install(cap)

    # ------------------------------------------------------------ plumbing
    @property
    def client(self):
        """The service client, made on first use (so loading the extension touches no network)."""
        if self._client is None:
            from ..client import SyncGpuAllocClient

            off = self.environ.get(OFF_VARIABLE)
            if off and not self.environ.get("GPUALLOC_URL"):
                raise InputError(off)
            try:
                self._client = SyncGpuAllocClient(env=self.environ)
            except ValueError as err:
                raise InputError(str(err).split(" (or pass")[0]) from None
        return self._client

    @property
    def events_client(self):
        """Where this kernel follows its lease's events: the server's relay ($GPUALLOC_EVENTS_URL, one
        service stream per server, not per kernel) when its server gives one, else the service."""
        url = self.environ.get("GPUALLOC_EVENTS_URL")
        if not url:
            return self.client
        if self._events_client is None:
            from ..client import SyncGpuAllocClient

            self._events_client = SyncGpuAllocClient(url, env=self.environ)
        return self._events_client

    @property
    def service_url(self) -> str:
        return getattr(self._client, "url", "") or self.environ.get("GPUALLOC_URL", "")

    @property
    def kept_alive_by_server(self) -> bool:
        """This kernel's Jupyter server heartbeats every kernel it runs (its extension's activity
        report): the kernel adds no heartbeat of its own."""
        return bool(self.environ.get(KEPT_ALIVE_VARIABLE))

    def _holding(self) -> None:
        """This kernel holds a lease: keep it alive (unless its server does: it joins the process's
        Keepalive), and say when the service warns about it."""
        if not self.kept_alive_by_server:
            if self._keeper is None:
                self._keeper = Keepalive(self.client.asynchronous.heartbeat, self.heartbeat_interval, log=QUIET_LOG)
            keeper = self._keeper
            self.client.on_loop(lambda: self.gpu_lease.keepalive(keeper))
        self.notices.start()

    def follow_lease_from_launch(self) -> None:
        """A kernel launched with its slice (a GPU kernelspec) tells its lease's notices (the idle
        warning, the time limit, its end) from the start, without a %gpu command; its server keeps
        the lease alive."""
        if self.in_kernel and self.lease_id and self.environ.get("GPUALLOC_URL"):
            self.notices.start()

    def _not_holding(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            def leave() -> None:
                self.gpu_lease.leave_keepalive()
                keeper.stop()

            self.client.on_loop(leave)
        self.notices.stop()

    def close(self) -> None:
        """Stop heartbeats, notices and framework caps, and close the client."""
        self._not_holding()
        self.caps.uninstall()
        for client in (self._client, self._events_client):
            if client is not None:
                client.close()
        self._client = self._events_client = None

    def current(self) -> dict | None:
        """This holder's active lease (queued or granted), or None."""
        lease = self.client.run(lambda _: self.gpu_lease.find())
        if lease is not None:
            self.lease_id = lease["id"]
            self._holding()
            return lease
        self._not_holding()
        return None

    def server_lease(self) -> dict | None:
        """The granted lease of the JupyterHub server this kernel runs in, or None."""
        holder = server_holder_of(self.environ)
        if holder is None:
            return None
        granted = [lease for lease in self.client.leases() if lease["holder"] == holder and lease["state"] == "granted"]
        return granted[-1] if granted else None

    def _gpu_memory_mib(self, slice_: dict) -> int | None:
        """The total memory of the slice's GPU, from the inventory (None if it is not listed)."""
        for node in self.client.inventory()["nodes"]:
            for gpu in node["gpus"]:
                if gpu["uuid"] in slice_["gpu_uuids"]:
                    return gpu["memory_mib"]
        return None

    # ------------------------------------------------------------ actions
    def request(self, spec: dict, *, mode: str = "now", timeout: float = math.inf) -> list[str]:
        """Ask for a slice. mode: 'now' (fail if nothing fits), 'wait' (up to `timeout` s), 'queue'."""
        lease = None
        try:
            lease = self.client.run(lambda _: self.gpu_lease.acquire(spec=spec, wait=0 if mode == "now" else None))
            self.lease_id = lease["id"]
            self._holding()
            if lease["state"] == "queued":
                if mode == "queue":
                    return [f"gpu: queued at position {lease.get('position')} for {describe_request(lease, article=True)} "
                            f"(lease {lease['id']}): %gpu status applies it once granted"]
                lease = self._wait(lease, timeout)
        except KeyboardInterrupt:
            return [self._withdraw(lease)]
        if lease["state"] != "granted":
            self._not_holding()
            if lease["state"] == "cancelled":  # _wait withdrew it at the timeout and said so
                return []
            return [f"gpu: the request ended ({lease['state']}): {lease.get('reason') or 'no reason given'}"]
        return [self.take_effect(lease)]

    def adopt(self, lease_id: str) -> str:
        """A lease granted to this kernel from outside it (the sidebar): it takes effect now, as `%gpu
        status` makes it, and its notices are told here (the server that asked for it keeps it alive).
        The line that says so ('' when in effect already)."""
        lease = self.client.lease(lease_id)
        if lease["holder"] != self.holder or lease["state"] != "granted":
            return f"gpu: lease {lease_id} is not a granted slice of this kernel"
        self.lease_id = lease_id
        self.notices.start()
        if lease_id in (self.applied_id, self.restart_needed_for):
            return ""
        return self.take_effect(lease)

    def restart_as_gpu_kernel(self, spec: dict) -> list[str]:
        """Where GPU kernels run in pods of their own (Kubernetes): this kernel's server restarts it as one."""
        if self.environ.get(IN_A_POD_VARIABLE):
            raise InputError("this kernel is a GPU kernel in a pod of its own already: shut it down to give its "
                             "slice back, then start another")
        if not self.environ.get("GPUALLOC_EVENTS_URL") or kernel_of(self.holder) is None:
            raise InputError("--restart is for a kernel of a Jupyter server whose GPU kernels run in pods of their "
                             "own (Kubernetes); here %gpu request works without it")
        return [f"gpu: {self.events_client.restart_as_gpu_kernel(kernel_of(self.holder), spec)['note']}"]

    def _wait(self, lease: dict, timeout: float) -> dict:
        """Wait in the queue (HolderLease.wait, on the client's loop), showing the position, the
        reason and when it gives up, until the lease is granted, ends, or `timeout` passes (then it is
        withdrawn)."""
        progress = Progress(self.in_kernel)
        what, a_what = describe_request(lease), describe_request(lease, article=True)
        started = self.clock()

        def tell(waiting: Waiting) -> None:
            why = f" ({waiting.reason})" if waiting.reason else ""
            left = f", gives up in {format_duration(waiting.left)}" if waiting.left != math.inf else ""
            progress.show(f"gpu: queued for {a_what}: position {waiting.position}{why}, waited "
                          f"{format_duration(waiting.waited)}{left} (interrupt to withdraw)")

        try:
            lease = self.client.run(lambda _: self.gpu_lease.wait(patience=timeout, on_round=tell,
                                                                  poll=self.poll_interval))
        except WaitGaveUp:
            withdrawn = self.client.run(lambda _: self.gpu_lease.release())
            progress.done(f"gpu: no {what} within {format_duration(timeout)}: request withdrawn "
                          f"(use a longer --wait, or --no-wait)")
            return withdrawn or {**lease, "state": "cancelled"}
        if lease["state"] == "granted":
            progress.done(f"gpu: granted after {format_duration(self.clock() - started)} in the queue")
        return lease

    def _withdraw(self, lease: dict | None) -> str:
        """After an interrupt: withdraw the request (found by holder if the POST was cut short)."""
        if lease is None or lease["state"] not in ACTIVE:
            lease = self.current()
        self._not_holding()
        if lease is None:
            return "gpu: interrupted before the request reached the service: nothing requested"
        self.gpu_lease.adopt(lease)
        self.client.run(lambda _: self.gpu_lease.release())
        if lease["state"] == "granted":
            return f"gpu: interrupted: {describe_lease(lease)} released (lease {lease['id']})"
        where = f" at position {lease['position']}" if lease.get("position") else ""
        return f"gpu: interrupted: request for {describe_request(lease, article=True)} withdrawn (was queued{where})"

    def take_effect(self, lease: dict) -> str:
        """Make a granted lease this process's slice, or say that the kernel must restart for it."""
        what = describe_slice(lease["slice"])
        busy = cuda_initialised_by()
        if busy:
            self.restart_needed_for = lease["id"]
            return (f"gpu: granted {what} (lease {lease['id']}), but CUDA is already initialised in this kernel "
                    f"({', '.join(busy)}): restart the kernel to use it (the lease stays with this kernel)")
        shared = lease["slice"]["kind"] == "shared"
        env = apply_lease_env(lease, self._gpu_memory_mib(lease["slice"]) if shared else None, self.environ)
        cap = self._cap_frameworks()
        self.applied_id = lease["id"]
        self.restart_needed_for = None
        line = f"gpu: granted {what} (lease {lease['id']}): CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}"
        if lease["slice"]["kind"] == "mig":
            line += f"; {mig_memory(lease)}"
        if cap is not None:
            fraction = f", fraction {cap.fraction:g} of the GPU" if cap.fraction is not None else ""
            line += f"; memory capped at {format_mib(cap.limit_mib)}{fraction}"
        return line

    def _cap_frameworks(self) -> MemoryCap | None:
        """Cap the frameworks with the cap the environment now names (none: uncapped); returns it."""
        cap = cap_from_env(self.environ)
        if cap is not None:
            self.caps.install(cap)
        else:
            self.caps.uninstall()
        return cap

    def forget(self, lease: dict) -> str:
        """After a release: the server's slice (if its server holds one) or none. Returns a note, or ''."""
        self._not_holding()
        note = ""
        if lease["id"] == self.applied_id:
            note = self._fall_back_to_server()
            self.applied_id = None
            busy = cuda_initialised_by()
            if busy:
                note += f"; CUDA in this kernel ({', '.join(busy)}) keeps its context, and the slice stays out of the pool, until the kernel restarts"
        if lease["id"] == self.restart_needed_for:
            self.restart_needed_for = None
        return note

    def _fall_back_to_server(self) -> str:
        """Give this process its server's slice again, or no GPU when the server holds none. Returns a note."""
        note = ""
        try:
            server = self.server_lease()
        except Exception as err:
            if not is_reported(err):
                raise
            server, note = None, f"; could not ask for the server's slice ({error_line(err)[5:]}): no GPU visible"
        if server is None:
            clear_lease_env(self.environ)
            self.caps.uninstall()
            return note
        if self.launch_env.get("GPUALLOC_LEASE_ID") == server["id"]:
            restore_env(self.launch_env, self.environ)  # exactly what the spawner set
        else:
            shared = server["slice"]["kind"] == "shared"
            apply_lease_env(server, self._gpu_memory_mib(server["slice"]) if shared else None, self.environ)
        self._cap_frameworks()
        return (f"; this kernel uses its server's {describe_slice(server['slice'])} again: "
                f"CUDA_VISIBLE_DEVICES={self.environ.get('CUDA_VISIBLE_DEVICES', '')}")

    def end(self, lease: dict) -> dict:
        """Release a lease of this kernel: its slice returns to the pool at once unless this process
        may still use it (a CUDA context on it), else when the kernel ends."""
        in_use = lease["id"] == self.applied_id and bool(cuda_initialised_by())
        self.gpu_lease.adopt(lease)
        return self.client.run(lambda _: self.gpu_lease.release(gone=not in_use)) or lease

    def release(self) -> list[str]:
        lease = self.current()
        if lease is None:
            return ["gpu: this kernel holds no GPU slice"]
        ended = self.end(lease)
        note = self.forget(ended)
        if lease["state"] == "queued":
            return [f"gpu: withdrew the request for {describe_request(lease, article=True)} (lease {lease['id']})"]
        return [f"gpu: released {describe_lease(lease)} (lease {lease['id']}){note}"]

    def status(self) -> tuple[list[str], dict | None]:
        """Status lines, and the lease when there is one to show in a view."""
        lease = self.current()
        lines: list[str] = []
        if lease is None:
            ended = None
            if self.lease_id:
                from ..client import NotFound

                try:
                    ended = self.client.lease(self.lease_id)
                except NotFound:
                    ended = None
                if ended is not None and ended["holder"] != self.holder:  # the server's, inherited at launch
                    ended = self.lease_id = self.applied_id = None
                if ended is not None and ended["id"] == self.applied_id:
                    self.forget(ended)
            return status_lines(None, now=self.clock(), in_effect=False, environ=self.environ, ended=ended,
                                server=self.server_lease(), quotas=self.usage_standing()), None
        if lease["state"] == "granted" and lease["id"] not in (self.applied_id, self.restart_needed_for):
            lines.append(self.take_effect(lease))
        in_effect = lease["id"] == self.applied_id
        lines += status_lines(lease, now=self.clock(), in_effect=in_effect, environ=self.environ,
                              frameworks=self.caps.describe(), used_mib=memory_used_mib() if in_effect else None,
                              quotas=self.usage_standing())
        return lines, lease

    def usage_standing(self) -> list[str]:
        """One sentence per usage quota of the user ('you have used 12.50 of 40 GPU-hours this week
        (resets ...)'); none when the service does not answer for usage (the status goes without it)."""
        from ..client import GpuAllocError

        try:
            return [quota["message"] for quota in self.usage_quotas()]
        except GpuAllocError:
            return []

    def usage_quotas(self) -> list[dict]:
        """The user's usage quotas and where each stands (UsageQuota JSON), from the service (the
        report's default period, so that no clock but the service's is read)."""
        return self.client.usage().get("quotas", [])

    def reservations(self) -> list[str]:
        """'  ML101 reservation: 22 of 30 free until 12:00 UTC' for each reservation the user may use
        now or later; none when the service does not say (the status goes without them)."""
        from ..client import GpuAllocError

        try:
            return [f"  {r['summary']}" for r in self.client.reservations() if r["state"] != "ended"]
        except GpuAllocError:
            return []

    def offers(self) -> list[str]:
        """The offers and how to ask for each; where a kernel can get no slice (Kubernetes without
        kernel pods), that first, with why, instead of commands that would be refused."""
        sheet = self.client.offer_sheet()
        offers, refused = sheet["offers"], sheet["refused_holders"]
        if not offers:
            return ["gpu: no slices are offered"] + self.reservations()
        lines = [f"gpu: {refused[KERNEL]}"] if KERNEL in refused else []
        width = max(len(offer["label"]) for offer in offers)
        lines.append("gpu: offers (available now" + (")" if KERNEL in refused else ", and how to ask)"))
        for offer in offers:
            how = "" if KERNEL in refused else f"   %gpu request {request_arguments(offer['spec'])}"
            lines.append(f"  {offer['label']:<{width}} {offer['available']:>3} available{how}")
        return lines + self.reservations()

    def list(self) -> list[str]:
        leases = self.client.leases()
        if not leases:
            return ["gpu: you hold no GPU slices"]
        mine = any(lease["holder"] == self.holder for lease in leases)
        return ["gpu: your leases" + (" (* this kernel)" if mine else ""), *lease_table(leases, self.holder)]


@magics_class
class GpuMagics(Magics):
    """`%gpu`: this kernel's GPU slice."""

    def __init__(self, shell, kernel_gpu: KernelGpu):
        super().__init__(shell)
        self.kernel_gpu = kernel_gpu

    @line_magic
    def gpu(self, line: str) -> None:
        if line.split(None, 1)[:1] in ([word] for word in JOB_WORDS):
            from .job_magics import job_line

            job_line(self.kernel_gpu, self.shell, line)
            return
        try:
            args = parse_gpu_line(line)
        except (UsageError, ValueError) as err:  # ValueError: shlex's unbalanced quotes; InputError: the action
            print(f"gpu: {err} (%gpu? shows the usage)", file=sys.stderr)
            return
        try:
            self._run(args)
        except Exception as err:
            if not is_reported(err):
                raise
            print(error_line(err, self.kernel_gpu.service_url), file=sys.stderr)

    gpu.__doc__ = gpu_parser().format_help()

    def _run(self, args) -> None:
        if args.action != "request" and (args.size or args.mig or args.shared or args.whole or args.model
                                         or args.wait is not None or args.no_wait or args.restart):
            raise InputError(f"'%gpu {args.action}' takes no size or options")
        if args.action == "request":
            spec = spec_from_args(" ".join(args.size), args.mig, args.shared, args.whole, args.model)
            if args.wait is not None and args.no_wait:
                raise InputError("give --wait or --no-wait, not both")
            if args.restart:
                if args.wait is not None or args.no_wait:
                    raise InputError("--restart waits in the queue as the kernel starts: leave out --wait and --no-wait")
                _say(self.kernel_gpu.restart_as_gpu_kernel(spec))
                return
            mode, timeout = "now", math.inf
            if args.no_wait:
                mode = "queue"
            elif args.wait is not None:
                mode, timeout = "wait", parse_duration(args.wait) if args.wait else math.inf
            _say(self.kernel_gpu.request(spec, mode=mode, timeout=timeout))
        elif args.action == "release":
            _say(self.kernel_gpu.release())
        elif args.action == "status":
            lines, lease = self.kernel_gpu.status()
            self._show_status(lines, lease)
            _say(self.kernel_gpu.reservations())
        elif args.action == "offers":
            _say(self.kernel_gpu.offers())
        elif args.action == "usage":
            _say(usage_lines(self.kernel_gpu.client.usage(by="model")))
        elif args.action == "extend":
            _say(extend_lines(self.kernel_gpu))
        else:
            _say(self.kernel_gpu.list())

    def _show_status(self, lines: list[str], lease: dict | None) -> None:
        """A widget (with the same text for terminals) in a kernel; plain text elsewhere."""
        if lease is None or not self.kernel_gpu.in_kernel:
            _say(lines)
            return
        try:
            from .widget import FOLLOW_SECONDS, LeaseView
        except ImportError:
            _say(lines)
            return
        from IPython.display import display

        notes = [line for line in lines if line.startswith("gpu: granted")]
        _say(notes)
        gpu = self.kernel_gpu
        quotas = [line.removeprefix("  usage: ") for line in lines if line.startswith("  usage: ")]
        view = LeaseView(gpu.client, lease, environ=gpu.environ, in_effect=lease["id"] == gpu.applied_id,
                         frameworks=gpu.caps.describe(), clock=gpu.clock, release=gpu.end, on_release=gpu.forget, quotas=quotas,
                         follow=FOLLOW_SECONDS)
        display(view)


def _say(lines: list[str]) -> None:
    for line in lines:
        print(line)
