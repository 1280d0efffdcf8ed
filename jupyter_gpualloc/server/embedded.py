"""Embedded mode: the scheduler core hosted inside the Jupyter server, serving REST API v1 itself.

With no JupyterHub and no service configured, `pip install` plus `jupyter lab` on one
workstation is enough: the core runs in-process (SQLite file under the Jupyter data dir, NVML
backend or a simulated fleet) and the service's own REST API v1 handlers are mounted at
`<base_url>gpualloc/api/v1/`, authenticated by jupyter_server's identity provider and authorizer.
"""

from __future__ import annotations

import inspect
import logging
import re
import time
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import JupyterHandler
from tornado import web
from tornado.escape import url_escape
from traitlets.config import Configurable

from ..core.devices.base import DeviceBackend
from ..core.policy import SchedulerPolicy
from ..core.store import Store
from ..core.wiring import device_backend, open_core
from ..service import handlers as h
from ..service.app import API_PATH, ROUTES, join_url, route_regex
from ..service.auth import Forbidden, Identity
from ..service.events import REPLAY_SIZE, AuditLog, EventBroker
from ..service.metrics import ServiceMetrics
from ..service.openapi import openapi_document

AUTH_RESOURCE = "gpualloc"
URL_ROOT = "gpualloc"


class JupyterServerAuthenticator:
    """REST API v1 authentication by the Jupyter server's own identity provider and authorizer.

    A Jupyter server has one owner: every caller the identity provider accepts (the server's
    token, its login cookie, a kernel's GPUALLOC_TOKEN) and the authorizer lets use the
    `gpualloc` resource acts as `user`, an administrator of the allocator when `admin`.
    """

    def __init__(self, user: str, admin: bool = True):
        self.identity = Identity(user, admin)

    async def identify(self, handler: JupyterHandler) -> Identity | None:
        user = handler.current_user  # found by jupyter_server's prepare(), which every route runs first
        if user is None:
            return None
        action = "read" if handler.request.method in ("GET", "HEAD", "OPTIONS") else "write"
        allowed = handler.authorizer.is_authorized(handler, user, action, AUTH_RESOURCE)
        if inspect.isawaitable(allowed):
            allowed = await allowed
        if not allowed:
            raise Forbidden(f"{user.username} may not {action} {AUTH_RESOURCE}")
        return self.identity

    def check_xsrf(self, handler: JupyterHandler) -> None:
        """jupyter_server's prepare() has checked it: browser writes need the server's XSRF token."""


def embedded_handler(cls: type[h.ApiHandler], paths: dict[str, str]) -> type:
    """The service's handler class, running as a JupyterHandler in the server's web app.

    Every request first passes jupyter_server's own prepare(): its Host allow-list (no DNS
    rebinding), identity, CORS headers, XSRF and authentication; then its Origin check, as
    jupyter_server's API handlers do; only then the service's own checks. `paths` (route name ->
    path template) serves reverse_url: tornado cannot reverse a pattern whose base URL holds a
    %-escape (e.g. /a%40b/).
    """

    async def prepare(self) -> None:
        if not self.check_host():
            self.current_user = self._jupyter_current_user = None
            raise h.ApiError(403, "this Jupyter server does not answer to that Host", field="Host")
        try:
            await JupyterHandler.prepare(self, _redirect_to_login=False)
        except web.HTTPError as err:
            if not self.check_origin():  # its XSRF check refuses a foreign Origin with a bare 404
                raise h.ApiError(403, "cross-origin request refused", field="Origin") from None
            raise h.ApiError(err.status_code, err.log_message or "authentication required: send this "
                             "Jupyter server's token ('Authorization: token <token>')") from None
        if not self.check_origin():
            raise h.ApiError(403, "cross-origin request refused", field="Origin")
        await cls.prepare(self)

    def reverse_url(self, name: str, *args: Any) -> str:
        values = iter(url_escape(str(a), plus=False) for a in args)
        return re.sub(r"\{[a-z_]+\}", lambda _: next(values), paths[name])

    members: dict[str, Any] = {"auth_resource": AUTH_RESOURCE, "reverse_url": reverse_url, "prepare": prepare,
                               "check_xsrf_cookie": JupyterHandler.check_xsrf_cookie}
    if not cls.auth_required:  # health and the OpenAPI document stay public, as in the service
        members["get"] = allow_unauthenticated(cls.get)
    return type(f"Embedded{cls.__name__}", (cls, JupyterHandler), members)


class EmbeddedScheduler:
    """The core, its events and metrics, and the REST API v1 routes, inside the Jupyter server."""

    def __init__(self, backend: DeviceBackend, db_url: str, policy: SchedulerPolicy, *, user: str,
                 admin: bool = True, audit_log: str = "", replay_size: int = REPLAY_SIZE,
                 log: logging.Logger | None = None):
        self.log = log or logging.getLogger(__name__)
        self.broker = EventBroker(AuditLog(audit_log) if audit_log else None, log=self.log, replay_size=replay_size)
        self.core = open_core(backend, Store(db_url), policy, now=time.time(), listeners=[self.broker.publish])
        self.backend, self.store = backend, self.core.store
        self.scheduler, self.jobs = self.core.scheduler, self.core.jobs
        self.metrics = ServiceMetrics(self.scheduler, self.core.usage, policy.usage_metrics_per_user,
                                      broker=self.broker)
        self.broker.add_listener(self.metrics.observe)
        self.ctx = h.ServiceContext(
            scheduler=self.scheduler, jobs=self.jobs, usage=self.core.usage, broker=self.broker, metrics=self.metrics,
            authenticator=JupyterServerAuthenticator(user, admin), backend_name=backend.name)

    @classmethod
    def from_config(cls, *, backend: str, fleet: str, process_dir: str, state_file: str, db_url: str,
                    parent: Configurable, user: str, admin: bool, audit_log: str, replay_size: int,
                    log: logging.Logger) -> "EmbeddedScheduler":
        """Build the backend (simulated when a fleet is given, else NVML) and the core."""
        devices = device_backend(backend, fleet=fleet, state_file=state_file, process_dir=process_dir)
        return cls(devices, db_url, SchedulerPolicy(parent=parent), user=user, admin=admin,
                   audit_log=audit_log, replay_size=replay_size, log=log)

    def handlers(self, base_url: str) -> list[web.URLSpec]:
        """REST API v1 at `<base_url>gpualloc/api/v1/...`, the service's own handlers."""
        api = join_url(base_url, URL_ROOT, API_PATH)
        document = openapi_document(api)
        paths = {name: api + template for template, _, name in ROUTES}
        routes = []
        for template, handler, name in ROUTES:
            kwargs: dict[str, Any] = {"ctx": self.ctx, "route": template}
            if handler is h.OpenApiHandler:
                kwargs["document"] = document
            routes.append(web.url(api + route_regex(template), embedded_handler(handler, paths), kwargs))
        return routes

    def tick(self) -> None:
        with self.metrics.timed("tick"):
            self.core.tick(time.time())

    def release_holders(self, holders: set[str], reason: str) -> None:
        """These holders are gone (at server stop, its kernels shut down, when the API is no longer
        served): end their leases in-process and return every slice they held."""
        now = time.time()
        held = self.scheduler.leases() + self.scheduler.returning()
        for user in sorted({l.user for l in held if l.holder in holders}):
            try:
                self.scheduler.holders_gone(user, holders, now=now, reason=reason)
            except Exception as err:  # e.g. the store refused: the slices return with the heartbeat TTL
                self.log.warning("gpualloc: cannot return the slices of %s's %s: %s", user, sorted(holders), err)

    def finish_job(self, job_id: str, attempt: int, outcome: str, reason: str) -> None:
        """Report a job attempt's end in-process (at server stop, when the API is no longer served)."""
        try:
            self.jobs.finish(job_id, attempt, outcome, reason, now=time.time())
        except Exception as err:  # moved on meanwhile, or the store refused: the restarted runner reports it
            self.log.warning("gpualloc jobs: cannot report job %s (%s): %s", job_id, outcome, err)

    def close(self) -> None:
        self.broker.close()
        self.core.close()
