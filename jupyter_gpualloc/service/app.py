"""`jupyter-gpualloc serve`: the scheduler core behind HTTP, as a JupyterHub service or standalone.

As a JupyterHub managed service it reads JUPYTERHUB_SERVICE_PREFIX, JUPYTERHUB_SERVICE_URL,
JUPYTERHUB_API_TOKEN and JUPYTERHUB_API_URL, serves under its prefix and authenticates callers
with JupyterHub. Standalone it listens on its own port and accepts the bearer tokens of
`c.GpuAllocService.api_tokens`.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import ipaddress
import logging
import os
import re
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Iterable
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.ioloop import PeriodicCallback
from tornado.log import access_log
from sqlalchemy.exc import SQLAlchemyError
from traitlets import Bool, CaselessStrEnum, Dict, Float, Int, List, TraitError, Unicode, default, validate
from traitlets.config import Application

from ..core.devices import BACKENDS
from ..core.devices.base import DeviceError, DeviceUnavailable
from ..core.devices.kubernetes import KubernetesBackend
from ..core.holders import JOB, KERNEL
from ..core.policy import SchedulerPolicy
from ..core.store import Store, sqlite_url
from ..core.wiring import device_backend, open_core
from ..kube.gpu import KubeGpu
from . import handlers as h
from .group_commit import GroupCommit
from .admin_page import page_routes
from .auth import ADMIN_SCOPE, HubAuthenticator, JobTokenAuthenticator, TokenAuthenticator
from .checkpoint import WalCheckpointer
from .cluster import ClusterReconciler
from .job_pods import JobPods
from .kernel_pods import KERNEL_POD_ROUTES, KernelPods
from .user_pods import UserPods
from .events import REPLAY_SIZE, AuditLog, EventBroker
from .jobs import JOB_ROUTES
from .reservations import RESERVATION_ROUTES
from .metrics import ServiceMetrics
from .openapi import openapi_document
from .deadlines import ExtendHandler
from .usage import EfficiencyHandler, HistoryHandler, UsageHandler, UtilizationHandler

API_PATH = "api/v1"
DEFAULT_PORT = 8765
LOOPBACK = ("127.0.0.0/8", "::1/128")
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
LABEL_VALUE = re.compile(r"(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")

# (path template under <prefix>api/v1, handler, route name)
ROUTES: list[tuple[str, type[h.ApiHandler], str]] = [
    ("/health", h.HealthHandler, "health"),
    ("/user", h.UserHandler, "user"),
    ("/inventory", h.InventoryHandler, "inventory"),
    ("/offers", h.OffersHandler, "offers"),
    ("/leases", h.LeasesHandler, "leases"),
    ("/leases/{lease_id}", h.LeaseHandler, "lease"),
    ("/leases/{lease_id}/touch", h.TouchHandler, "touch"),
    ("/heartbeat", h.HeartbeatHandler, "heartbeat"),
    ("/holders/gone", h.HoldersGoneHandler, "holders_gone"),
    ("/events", h.EventsHandler, "events"),
    *JOB_ROUTES,
    ("/gpus/{gpu_uuid}/drain", h.DrainHandler, "drain"),
    ("/metrics", h.MetricsHandler, "metrics"),
    ("/openapi.json", h.OpenApiHandler, "openapi"),
    ("/usage", UsageHandler, "usage"),
    ("/leases/{lease_id}/extend", ExtendHandler, "extend"),
    ("/usage/efficiency", EfficiencyHandler, "usage_efficiency"),
    ("/usage/history", HistoryHandler, "usage_history"),
    ("/leases/{lease_id}/utilization", UtilizationHandler, "utilization"),
    *RESERVATION_ROUTES,
    *KERNEL_POD_ROUTES,
]


# tornado allocates (and zeroes) a new buffer of this size for every read from a connection: its
# default, 64 KiB, cost about 130,000 instructions a request (two reads each), for requests of a
# kilobyte or two. Bodies up to h.MAX_BODY_BYTES still arrive, in more reads.
READ_CHUNK_BYTES = 8 * 1024


def route_regex(template: str) -> str:
    """'/leases/{lease_id}' -> '/leases/([^/]+)'."""
    return re.sub(r"\{[a-z_]+\}", "([^/]+)", template.replace(".", r"\."))


def join_url(*parts: str) -> str:
    """Join URL path parts with exactly one slash between them, keeping a leading slash."""
    text = "/".join(p.strip("/") for p in parts if p.strip("/"))
    return "/" + text


class OAuthCallbackHandler(HubOAuthCallbackHandler):
    """JupyterHub's OAuth callback, bound to this service's HubOAuth (not the process-wide singleton)."""

    def initialize(self) -> None:
        self.hub_auth = self.settings["hub_auth"]


class ServiceApplication(web.Application):
    """The API's tornado application; it reads a trusted proxy's forwarded-address headers itself
    (`ForwardedHeaders`, without tornado's `xheaders` and its getaddrinfo on every request)."""

    def __init__(self, handlers, forwarded: "ForwardedHeaders", **settings):
        super().__init__(handlers, **settings)
        self.forwarded = forwarded

    def find_handler(self, request, **kwargs):
        self.forwarded.apply(request)
        return super().find_handler(request, **kwargs)

    def log_request(self, handler: web.RequestHandler) -> None:
        """tornado's access log line, built only when its level is logged."""
        status = handler.get_status()
        level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
        if access_log.isEnabledFor(level):
            super().log_request(handler)


class ForwardedHeaders:
    """The client address and scheme a proxy forwards, believed only from `trusted_proxies`.

    A connection from a trusted proxy takes its client address from X-Real-Ip, else from the
    right-most X-Forwarded-For hop that is not itself a trusted proxy, and its scheme from X-Scheme
    or X-Forwarded-Proto (their last entry, http or https). A connection from anywhere else keeps
    its own address and scheme whatever it sends, and a value that is not an IP address is ignored.
    """

    MAX_HOPS = 16  # X-Forwarded-For hops examined from the right

    def __init__(self, trusted_proxies: Iterable[str]):
        self.networks = tuple(ipaddress.ip_network(n, strict=False) for n in trusted_proxies)
        self._peers: dict[str, bool] = {}  # connection address -> trusted

    def apply(self, request) -> None:
        headers = request.headers
        if not self.networks or not ("X-Real-Ip" in headers or "X-Forwarded-For" in headers
                                     or "X-Scheme" in headers or "X-Forwarded-Proto" in headers):
            return
        peer = request.remote_ip
        trusted = self._peers.get(peer)
        if trusted is None:
            trusted = self.is_trusted(parse_ip(peer))
            if len(self._peers) < 4096:
                self._peers[peer] = trusted
        if not trusted:
            return
        client = parse_ip(headers.get("X-Real-Ip", "").strip()) or self.client_of(headers.get("X-Forwarded-For", ""))
        if client is not None:
            request.remote_ip = str(client)
        scheme = headers.get("X-Scheme") or headers.get("X-Forwarded-Proto") or ""
        scheme = scheme.rsplit(",", 1)[-1].strip().lower()
        if scheme in ("http", "https"):
            request.protocol = scheme

    def client_of(self, forwarded_for: str):
        """The right-most hop not a trusted proxy (or the left-most examined); None if it is not an address."""
        client = None
        for hop in forwarded_for.rsplit(",", self.MAX_HOPS)[::-1][:self.MAX_HOPS]:
            client = parse_ip(hop.strip())
            if not self.is_trusted(client):
                break
        return client

    def is_trusted(self, address) -> bool:
        return address is not None and any(address in network for network in self.networks)


def parse_ip(text: str):
    """An IP address (an IPv4-mapped IPv6 address as IPv4), or None."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def make_app(ctx: h.ServiceContext, base_url: str = "/", hub_auth: HubOAuth | None = None,
             cookie_secret: bytes | None = None,
             trusted_proxies: Iterable[str] = LOOPBACK) -> web.Application:
    """The tornado application serving API v1 under `<base_url>api/v1/`."""
    api = join_url(base_url, API_PATH)
    cookie_name = hub_auth.cookie_name if hub_auth is not None else "gpualloc"
    document = openapi_document(api, cookie_name)
    handlers: list = []
    for template, handler, name in ROUTES:
        kwargs = {"ctx": ctx, "route": template}
        if handler is h.OpenApiHandler:
            kwargs["document"] = document
        handlers.append(web.url(api + route_regex(template), handler, kwargs, name=name))
    handlers += page_routes(base_url, ctx)
    if hub_auth is not None:
        callback = urlparse(hub_auth.oauth_redirect_uri).path
        handlers.append((callback, OAuthCallbackHandler))
    settings = {
        "base_url": base_url, "hub_auth": hub_auth,
        "cookie_secret": cookie_secret or secrets.token_bytes(32),
        "default_handler_class": h.NotFoundHandler, "default_handler_args": {"ctx": ctx},
    }
    return ServiceApplication(handlers, ForwardedHeaders(trusted_proxies), **settings)


class GpuAllocService(Application):
    """The scheduler service: REST API v1 over the GPU allocator's core."""

    name = "jupyter-gpualloc serve"
    description = __doc__
    examples = """
    jupyter-gpualloc serve --port 8765 --fleet fleet.yaml --db sqlite:///gpualloc.sqlite -f gpualloc_config.py
    jupyter-gpualloc serve --help-all
    """
    classes = [SchedulerPolicy, JobPods, UserPods, KubeGpu, HubOAuth]
    aliases = {
        "f": "GpuAllocService.config_file", "config": "GpuAllocService.config_file",
        "ip": "GpuAllocService.ip", "port": "GpuAllocService.port",
        "base-url": "GpuAllocService.base_url", "prefix": "GpuAllocService.base_url",
        "fleet": "GpuAllocService.fleet", "backend": "GpuAllocService.backend", "db": "GpuAllocService.db_url",
        "audit-log": "GpuAllocService.audit_log", "tick-interval": "GpuAllocService.tick_interval",
        "max-wait": "GpuAllocService.max_wait", "auth": "GpuAllocService.auth",
        "log-level": "Application.log_level", "placement": "SchedulerPolicy.placement",
    }

    config_file = Unicode(
        "", help="""The config file to load (a Python file setting `c.GpuAllocService...`,
        `c.SchedulerPolicy...`). Default: gpualloc_config.py in the current directory, if present.""",
    ).tag(config=True)
    ip = Unicode(
        help="Address to listen on. Default: the host of $JUPYTERHUB_SERVICE_URL, else 127.0.0.1.",
    ).tag(config=True)
    port = Int(
        help=f"Port to listen on. Default: the port of $JUPYTERHUB_SERVICE_URL, else {DEFAULT_PORT}.",
    ).tag(config=True)
    base_url = Unicode(
        help="URL prefix the service is served under. Default: $JUPYTERHUB_SERVICE_PREFIX, else /.",
    ).tag(config=True)
    fleet = Unicode("", help="""Fleet file (YAML or JSON) for the simulated backend, or a shipped example:
        example:demo (two MIG A100-80GB, a shared H100, an L4), example:multi-node, example:static-mig.""").tag(config=True)
    simulated_state = Unicode(
        help="""File where the simulated backend keeps its MIG layout across restarts, as real GPUs
        keep theirs. Default: beside the SQLite database (none for other databases).""",
    ).tag(config=True)
    backend = Unicode(
        "", help=f"Where GPUs come from: {', '.join(BACKENDS)}. Default: simulated when a fleet is given, else nvml.",
    ).tag(config=True)
    db_url = Unicode(
        help="""SQLAlchemy URL of the state database. Default: sqlite:///gpualloc.sqlite in the
        current directory (a JupyterHub managed service runs in its own working directory).""",
    ).tag(config=True)
    sqlite_synchronous = CaselessStrEnum(
        ["NORMAL", "FULL"], "NORMAL", help="""SQLite only: when a commit reaches the disk. NORMAL (WAL
        synced at checkpoints): an answered change survives the service's crash, but a power loss
        or kernel panic can take the changes since the last checkpoint (docs/reliability.md). FULL:
        every commit is synced (one fsync per group of changes), so a power loss takes nothing answered.""",
    ).tag(config=True)
    sqlite_checkpoint_interval = Float(
        1.0, help="""SQLite only: seconds between checkpoints of the WAL into the database file, run
        from a thread of their own (with synchronous NORMAL, about what a power loss can take). 0:
        SQLite's own, from the commit that takes the WAL past 1,000 pages, on the IOLoop's thread.""",
    ).tag(config=True)
    commit_in_background = Bool(
        None, allow_none=True, help="""Write each group of changes on a thread of its own while the
        IOLoop decides the next group's (docs/reliability.md, group commit): the IOLoop no longer
        waits for the commit, and a refused group takes the changes made since with it. Default:
        on for a database server (its commit waits for the server's fsync), off for SQLite (whose
        commit is the IOLoop's own CPU, unless sqlite_synchronous is FULL).""",
    ).tag(config=True)
    auth = Unicode(
        "", help="""How callers authenticate: 'hub' (JupyterHub tokens and OAuth cookies) or 'tokens'
        (the api_tokens map). Default: hub when $JUPYTERHUB_API_TOKEN is set, else tokens.""",
    ).tag(config=True)
    api_tokens = Dict(
        help="""Standalone mode: bearer tokens and who they are, e.g.
        {"TOKEN": {"user": "alice", "admin": False, "groups": ["students"]}}. Admins list and
        release every lease, drain GPUs and read /metrics.""",
    ).tag(config=True)
    admin_scope = Unicode(
        ADMIN_SCOPE, help="""Hub mode: the custom scope that makes a user an administrator of the
        allocator (declare it in c.JupyterHub.custom_scopes and grant it with a role).""",
    ).tag(config=True)
    audit_log = Unicode(
        "gpualloc-audit.jsonl", help="JSON-lines file every scheduler event is appended to; empty disables it.",
    ).tag(config=True)
    tick_interval = Float(
        5.0, help="Seconds between scheduler ticks (expire idle and dead leases, grant from the queue).",
    ).tag(config=True)
    activity_interval = Float(
        1.0, help="""Seconds between writes of the activity that touches report (a touch that only moves
        a lease's last activity is kept in memory until then; a restart goes on from the last one written).""",
    ).tag(config=True)
    max_wait = Float(60.0, help="The longest a POST /leases long-poll (`wait`) is held, in seconds.").tag(config=True)
    pod_unschedulable_timeout = Float(
        300.0, help="""With the kubernetes backend: seconds a lease's pod may stay unschedulable (the
        kube-scheduler cannot place it) before the lease ends with the kube-scheduler's message.""",
    ).tag(config=True)
    pod_missing_timeout = Float(
        120.0, help="""With the kubernetes backend: seconds after its grant a lease may have no pod in the
        cluster (its spawner has not made it yet) before it is released: its server never started, or its
        pod was deleted while the service was not watching.""",
    ).tag(config=True)
    namespace = Unicode(
        help="""With the kubernetes backend: the namespace of this install's pods (its users' servers, GPU
        kernels and jobs). A pod elsewhere is never this install's: it is outside use, never deleted.
        Default: the namespace of the service's own pod (its service account's), else 'default', as
        KubeSpawner.namespace.""",
    ).tag(config=True)
    instance = Unicode(
        help="""With the kubernetes backend: this install's name on the cluster, on every pod made for one of
        its leases (label gpualloc.jupyter.org/instance, beside the lease's gpualloc.jupyter.org/lease): a
        pod is this install's only in its namespace, with this name, and for a lease its store made; every
        other GPU pod is outside use, never touched. Set one per release where two installs share a cluster
        (e.g. 'staging', 'production'); a label value (at most 63 letters, digits, '-', '_', '.').
        Default: '<namespace>.<service name>' ($JUPYTERHUB_SERVICE_NAME, else 'gpualloc').""",
    ).tag(config=True)
    job_pods = Bool(
        False, help="""With the kubernetes backend: run each background job's attempt in a Kubernetes Job
        of its own, made from the submitting server's pod with the lease's GPU resources (a server pod
        cannot gain a device, so without this GPU jobs are refused there). Jobs then outlive their
        owner's server. Configure them with c.JobPods (service_url), c.UserPods and c.KubeGpu; the
        service's service account needs hub_config/gpualloc-rbac.yaml's Role.""",
    ).tag(config=True)
    kernel_pods = Bool(
        False, help="""With the kubernetes backend: run each GPU kernel (a kernelspec asking for a slice) in a
        pod of its own, made from its user's server pod with the lease's GPU resources and owned by the
        server pod; the server's provisioner asks for it. Without it GPU kernels are refused there.""",
    ).tag(config=True)
    job_workdir_roots = List(
        Unicode(), ["{home}"], help="""Where a job's working directory (`workdir`) may be, for a user with a
        local account (found by the user's name in the system's account database) other than the service's
        own: `{home}` stands for that account's home directory, `{user}` for the user's name, e.g.
        ["{home}", "/scratch/{user}"]. A workdir elsewhere is refused (400). Users without a local account,
        and the service's own account, are held only to the rules of every workdir (absolute, normalised,
        outside /proc, /sys and /dev). The links on the path of a root are followed when a job's log is
        read (the admin chose it); below it, none is. An empty list confines nobody.""",
    ).tag(config=True)
    retry_after = Int(30, help="Retry-After seconds sent with 503 answers (the fleet is drained).").tag(config=True)
    authenticate_prometheus = Bool(
        True, help="Whether /metrics needs admin credentials (turn off for a scraper inside a trusted network).",
    ).tag(config=True)
    connections_are_activity = Bool(
        False, help="Whether a touch reporting open connections (`connections` > 0) counts as activity now.",
    ).tag(config=True)
    keepalive_interval = Float(15.0, help="Seconds between keep-alive comments on idle event streams.").tag(config=True)
    event_replay_size = Int(
        REPLAY_SIZE, min=0, help="""How many of the latest events the service keeps in memory for event streams that
        resume (Last-Event-ID or ?since=): a client that missed more than this many (counting every user's)
        gets a stream.reset instead and reads the state again. 0 keeps none.""",
    ).tag(config=True)
    trusted_proxies = List(
        Unicode(), list(LOOPBACK), help="""Addresses or networks (CIDR) of the proxies whose forwarded
        headers are believed (X-Real-Ip, X-Forwarded-For, X-Forwarded-Proto, X-Scheme): the caller's
        address in the logs and its scheme come from them only on a connection from one of these.
        Default: loopback, where JupyterHub's proxy runs beside the hub; add the proxy's address or
        network when it runs elsewhere (e.g. ["10.0.0.0/8"] on Kubernetes); [] ignores the headers.""",
    ).tag(config=True)

    @validate("trusted_proxies")
    def _check_trusted_proxies(self, proposal) -> list[str]:
        for network in proposal["value"]:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise TraitError(f"trusted_proxies: {network!r} is not an IP address or network") from None
        return proposal["value"]

    cookie_secret_file = Unicode(
        "", help="""Hub mode: file with the secret signing the OAuth cookie; empty: a new secret
        each start (browsers then log in again).""",
    ).tag(config=True)

    @default("log_level")
    def _default_log_level(self) -> int:
        return logging.INFO

    @default("ip")
    def _default_ip(self) -> str:
        return urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "")).hostname or "127.0.0.1"

    @default("port")
    def _default_port(self) -> int:
        return urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "")).port or DEFAULT_PORT

    @default("base_url")
    def _default_base_url(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")

    @default("db_url")
    def _default_db_url(self) -> str:
        return sqlite_url(Path.cwd() / "gpualloc.sqlite")

    @default("namespace")
    def _default_namespace(self) -> str:
        account = Path(SERVICE_ACCOUNT_NAMESPACE)
        return account.read_text().strip() if account.is_file() else "default"

    @default("instance")
    def _default_instance(self) -> str:
        name = f"{self.namespace}.{os.environ.get('JUPYTERHUB_SERVICE_NAME') or 'gpualloc'}"
        return name if len(name) <= 63 else f"{name[:54]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"

    @validate("instance")
    def _check_instance(self, proposal) -> str:
        if not LABEL_VALUE.fullmatch(proposal["value"]):
            raise TraitError(f"instance {proposal['value']!r} is not a Kubernetes label value: at most 63 letters, "
                             "digits, '-', '_' or '.', beginning and ending with a letter or digit")
        return proposal["value"]

    @validate("base_url")
    def _check_base_url(self, proposal) -> str:
        return join_url(proposal["value"]).rstrip("/") + "/"

    @validate("backend")
    def _check_backend(self, proposal) -> str:
        if proposal["value"] not in ("", *BACKENDS):
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}")
        return proposal["value"]

    @validate("auth")
    def _check_auth(self, proposal) -> str:
        if proposal["value"] not in ("", "hub", "tokens"):
            raise ValueError("auth must be 'hub' or 'tokens'")
        return proposal["value"]

    def initialize(self, argv: list[str] | None = None) -> None:
        self.parse_command_line(argv)
        path = self.config_file or ("gpualloc_config.py" if Path("gpualloc_config.py").is_file() else "")
        if path:
            if not Path(path).is_file():
                raise ValueError(f"config file {path} not found")
            self.load_config_file(path)
        self.log_modules_here()
        self.build()

    def log_modules_here(self) -> None:
        """The package's module loggers (the cluster's reconciler, the pods and Jobs the service makes,
        the core) write through this application's handler at its level, as jupyter_server does
        with tornado's: without it their INFO lines went nowhere."""
        package = logging.getLogger(__package__.partition(".")[0])
        package.parent, package.propagate = self.log, True
        package.setLevel(logging.NOTSET)  # its effective level is this application's

    def _state_beside_db(self) -> str | None:
        prefix = "sqlite:///"
        if self.db_url.startswith(prefix) and len(self.db_url) > len(prefix):
            return self.db_url[len(prefix):] + ".mig-state.json"
        return None

    def build(self) -> None:
        """Backend, store, scheduler, events, metrics, authentication and the tornado app."""
        self.device_backend = device_backend(self.backend, fleet=self.fleet,
                                             state_file=self.simulated_state or self._state_beside_db())
        kube_gpu = KubeGpu(parent=self)
        if isinstance(self.device_backend, KubernetesBackend):  # nodes whose taints our pods do not tolerate drain
            self.device_backend.tolerations = list(kube_gpu.tolerations)
        self.store = Store(self.db_url, sqlite_synchronous=self.sqlite_synchronous.upper(),
                           sqlite_autocheckpoint=self.sqlite_checkpoint_interval <= 0)
        self.policy = SchedulerPolicy(parent=self)
        self.broker = EventBroker(AuditLog(self.audit_log) if self.audit_log else None, log=self.log,
                                  replay_size=self.event_replay_size)
        self.core = open_core(self.device_backend, self.store, self.policy, now=time.time(),
                              listeners=[self.broker.publish])
        self.scheduler, self.jobs = self.core.scheduler, self.core.jobs
        self.metrics = ServiceMetrics(self.scheduler, self.core.usage, self.policy.usage_metrics_per_user,
                                      broker=self.broker)
        self.broker.add_listener(self.metrics.observe)
        self.cluster = None
        if isinstance(self.device_backend, KubernetesBackend):
            self.cluster = ClusterReconciler(self.scheduler, self.device_backend, namespace=self.namespace,
                                             instance=self.instance, record=self.broker.publish, gpu=kube_gpu,
                                             pod_unschedulable_timeout=self.pod_unschedulable_timeout,
                                             pod_missing_timeout=self.pod_missing_timeout)
            self.log.info("Kubernetes: this install's pods are those of instance %s in namespace %s",
                          self.instance, self.namespace)
            self.metrics.cluster_stale.set_function(
                lambda: 0.0 if self.cluster.stale_since is None else time.time() - self.cluster.stale_since)
        self.job_runner_pods = self.gpu_kernel_pods = None
        if (self.job_pods or self.kernel_pods) and self.cluster is None:
            raise TraitError("GpuAllocService.job_pods and kernel_pods need the kubernetes backend")
        if self.job_pods or self.kernel_pods:
            user_pods = UserPods(kube_gpu, self.device_backend.node_resources, parent=self)
        if self.job_pods:
            self.job_runner_pods = JobPods(self.jobs, self.cluster.watch, user_pods, clock=time.time,
                                           claims=self.cluster.claims, parent=self)
            self.cluster.job_pods = self.job_runner_pods
        if self.kernel_pods:
            self.gpu_kernel_pods = KernelPods(self.scheduler, self.cluster.watch, user_pods, clock=time.time,
                                              claims=self.cluster.claims)
        self.scheduler.own_pod_holders = frozenset(
            kind for kind, on in ((JOB, self.job_pods), (KERNEL, self.kernel_pods)) if on)
        hub_mode = self.auth == "hub" or (not self.auth and bool(os.environ.get("JUPYTERHUB_API_TOKEN")))
        self.hub_auth = None
        if hub_mode:
            self.hub_auth = HubOAuth(parent=self, base_url=self.base_url)
            authenticator = HubAuthenticator(self.hub_auth, self.admin_scope)
        else:
            if not self.api_tokens:
                self.log.warning("no api_tokens configured: every API call will be refused (401)")
            authenticator = TokenAuthenticator(self.api_tokens)
        if self.job_runner_pods is not None:
            authenticator = JobTokenAuthenticator(self.jobs, authenticator)
        self.ctx = h.ServiceContext(
            scheduler=self.scheduler, jobs=self.jobs, usage=self.core.usage, broker=self.broker,
            metrics=self.metrics, authenticator=authenticator,
            backend_name=self.device_backend.name, max_wait=self.max_wait, retry_after=self.retry_after,
            authenticate_prometheus=self.authenticate_prometheus, cluster=self.cluster, job_pods=self.job_runner_pods,
            kernel_pods=self.gpu_kernel_pods, job_workdir_roots=tuple(self.job_workdir_roots),
            group=GroupCommit(self.scheduler, in_background=self._commits_in_background()),
            connections_are_activity=self.connections_are_activity, keepalive_interval=self.keepalive_interval)
        secret = Path(self.cookie_secret_file).read_bytes().strip() if self.cookie_secret_file else None
        self.web_app = make_app(self.ctx, self.base_url, self.hub_auth, secret, self.trusted_proxies)

    def _commits_in_background(self) -> bool:
        if self.commit_in_background is not None:
            return self.commit_in_background
        return not self.store.url.startswith("sqlite") or self.sqlite_synchronous.upper() == "FULL"

    def tick(self) -> None:
        with self.metrics.timed("tick"):
            self.core.tick(time.time())
            if self.cluster is not None:
                self.cluster.tick()
            if self.job_runner_pods is not None:
                self.job_runner_pods.tick()

    def write_activity(self) -> None:
        self.scheduler.write_activity(time.time())

    async def serve(self) -> None:
        """Listen, tick periodically, and stop cleanly on SIGTERM or SIGINT."""
        freeze_startup_heap()
        checkpointer = None
        if self.sqlite_checkpoint_interval > 0 and self.store.url.startswith("sqlite"):
            checkpointer = WalCheckpointer(self.store, self.sqlite_checkpoint_interval, self.log)
            checkpointer.start()
        if self.cluster is not None:
            await self.cluster.start()  # the cluster's pods are in the view before the first request
        # forwarded headers: ServiceApplication; reads into READ_CHUNK_BYTES buffers (see there)
        server = HTTPServer(self.web_app, chunk_size=READ_CHUNK_BYTES)
        server.listen(self.port, self.ip)
        ticker = PeriodicCallback(self.tick, self.tick_interval * 1000)
        ticker.start()
        activity = PeriodicCallback(self.write_activity, self.activity_interval * 1000)
        activity.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        mode = "JupyterHub" if self.hub_auth is not None else "standalone"
        self.log.info("gpualloc service (%s, %s backend) at http://%s:%d%s", mode, self.device_backend.name,
                      self.ip, self.port, join_url(self.base_url, API_PATH) + "/")
        await stop.wait()
        ticker.stop()
        activity.stop()
        self.write_activity()
        server.stop()
        for pods in (self.job_runner_pods, self.gpu_kernel_pods):
            if pods is not None:
                await pods.close()
        if self.cluster is not None:
            await self.cluster.close()
        self.ctx.group.close()
        self.broker.close()
        if checkpointer is not None:
            checkpointer.stop()
        self.core.close()

    def start(self) -> None:
        asyncio.run(self.serve())


def freeze_startup_heap() -> None:
    """Move what start-up built (imported modules, parsers, the fleet's layout tables: about 250,000
    objects) out of the garbage collector's reach: each full collection walked all of it, 50-260 ms
    on the IOLoop's thread, a few times a minute under load. What is built later is collected as usual."""
    gc.collect()
    gc.freeze()


USE_SIMULATED = "No GPU here? Run on a simulated fleet: --backend simulated --fleet FLEET.yaml (examples/fleets/)"


def main(argv: list[str] | None = None) -> int:
    """Run the service; configuration errors print one line and return 1."""
    app = GpuAllocService()
    try:
        app.initialize(sys.argv[1:] if argv is None else argv)
    except SystemExit as done:
        return int(done.code or 0)
    except (DeviceError, ValueError, OSError, TraitError, SQLAlchemyError) as err:
        hint = f". {USE_SIMULATED}" if isinstance(err, DeviceUnavailable) else ""
        print(f"error: {' '.join(str(err).split())}{hint}", file=sys.stderr)
        return 1
    app.start()
    return 0
