"""REST API v1: thin tornado handlers that validate input, call one scheduler method and write JSON.

Every error is JSON, `{"error": "..."}` plus what the client needs to act on it (`field`,
`quota`, `lease_id`, `reason`). A user sees only their own leases; another user's lease is
answered as if it did not exist (404). Scheduler calls run on the IOLoop thread only.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from http.client import responses
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

from tornado import web
from tornado.iostream import StreamClosedError
from tornado.log import app_log

from ..core.model import Lease, LeaseState, PriorityClass, SliceSpec, SpecError
from ..core.scheduler import HolderBusy, NotFound, QuotaExceeded, Scheduler
from .auth import Forbidden, Identity
from .events import EventBroker
from .metrics import CONTENT_TYPE, ServiceMetrics

LEASE_FIELDS = {"spec", "holder", "priority", "wait", "preemptible", "idle_timeout"}
TOUCH_FIELDS = {"last_activity", "busy", "connections"}
MAX_BODY_BYTES = 64 * 1024


@dataclass
class ServiceContext:
    """What every handler needs: the core, its events and metrics, who is calling, and limits."""

    scheduler: Scheduler
    broker: EventBroker
    metrics: ServiceMetrics
    authenticator: Any
    backend_name: str
    max_wait: float = 60.0
    retry_after: int = 30
    authenticate_prometheus: bool = True
    connections_are_activity: bool = False
    keepalive_interval: float = 15.0
    clock: Callable[[], float] = time.time
    jobs: Any = None  # core.jobs.Jobs: the job records over the same scheduler


class ApiError(web.HTTPError):
    """An HTTP error whose JSON body carries `extra` next to the message."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(status, reason=_reason_phrase(status))
        self.message = message
        self.headers = headers or {}
        self.extra = extra


def _reason_phrase(status: int) -> str:
    return responses.get(status, "Error")


class ApiHandler(web.RequestHandler):
    """Base of the API: authentication, JSON bodies and JSON errors."""

    auth_required = True
    identity: Identity

    def initialize(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    @property
    def scheduler(self) -> Scheduler:
        return self.ctx.scheduler

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    async def prepare(self) -> None:
        if not self.auth_required:
            return
        try:
            identity = await self.ctx.authenticator.identify(self)
        except Forbidden as err:
            raise ApiError(403, str(err)) from None
        if identity is None:
            raise ApiError(401, "authentication required: send 'Authorization: Bearer <token>'",
                           headers={"WWW-Authenticate": 'Bearer realm="gpualloc"'})
        self.identity = identity
        if self.request.method not in ("GET", "HEAD", "OPTIONS"):
            self.ctx.authenticator.check_xsrf(self)

    def check_xsrf_cookie(self) -> None:
        """XSRF is checked in prepare(), by the authenticator, once the caller is known."""

    def require_admin(self) -> None:
        if not self.identity.admin:
            raise ApiError(403, "this needs the allocator's admin permission")

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        exc = error_status(exc) or exc
        if isinstance(exc, ApiError):
            self.set_status(exc.status_code)
            for name, value in exc.headers.items():
                self.set_header(name, value)
            body = {"error": exc.message, **exc.extra}
        elif isinstance(exc, web.HTTPError) and status_code < 500:
            body = {"error": exc.log_message or _reason_phrase(status_code)}
        else:
            body = {"error": "internal error; the service log has the details"}
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps(body))

    def log_exception(self, typ, value, tb) -> None:
        """Errors about the request are logged as warnings, without a traceback."""
        mapped = error_status(value)
        if mapped is not None:
            self.log_request_error(mapped)
        else:
            super().log_exception(typ, value, tb)

    def log_request_error(self, error: ApiError) -> None:
        app_log.warning("%d %s %s: %s", error.status_code, self.request.method, self.request.path, error.message)

    def json_body(self) -> dict[str, Any]:
        """The request body as a JSON object; an empty body is an empty object."""
        raw = self.request.body
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes", field="body")
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as err:
            raise ApiError(400, f"body is not valid JSON: {err}", field="body") from None
        if not isinstance(data, dict):
            raise ApiError(400, "body must be a JSON object", field="body")
        return data

    def visible_lease(self, lease_id: str) -> Lease:
        """The lease if the caller may see it (theirs, or any for an admin); else 404."""
        try:
            lease = self.scheduler.lease(lease_id)
        except NotFound:
            lease = None
        if lease is None or (lease.user != self.identity.user and not self.identity.admin):
            raise ApiError(404, f"no lease {lease_id}")
        return lease

    def lease_json(self, lease: Lease) -> dict[str, Any]:
        data = lease.to_json()
        data["position"] = self.scheduler.position(lease.id) if lease.state is LeaseState.QUEUED else None
        return data


# -------------------------------------------------------------------- validation


def _number(body: dict, name: str, *, minimum: float = 0.0) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise ApiError(400, f"{name} must be a number >= {minimum:g}", field=name)
    return float(value)


def _bool(body: dict, name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false", field=name)
    return value


def _reject_unknown(body: dict, allowed: set[str]) -> None:
    for key in body:
        if key not in allowed:
            raise ApiError(400, f"unknown field {key!r}", field=key)


def parse_timestamp(value: Any, name: str) -> float | None:
    """Epoch seconds or an ISO-8601 string (a naive one is UTC) -> epoch seconds."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ApiError(400, f"{name} must be epoch seconds or an ISO-8601 time", field=name) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ApiError(400, f"{name} must be epoch seconds or an ISO-8601 time", field=name)
    return float(value)


# -------------------------------------------------------------------- handlers


def _package_version() -> str:
    try:
        return version("jupyter-gpualloc")
    except PackageNotFoundError:
        return "unknown"


class HealthHandler(ApiHandler):
    auth_required = False

    def get(self) -> None:
        gpus = sum(len(n.gpus) for n in self.scheduler.nodes)
        self.write_json({"status": "ok", "version": _package_version(), "backend": self.ctx.backend_name, "gpus": gpus})


class UserHandler(ApiHandler):
    def get(self) -> None:
        self.write_json(self.identity.to_json())


class InventoryHandler(ApiHandler):
    def get(self) -> None:
        inventory = self.scheduler.inventory()
        if not self.identity.admin:
            mine = {l.id for l in self.scheduler.leases(self.identity.user)}
            for node in inventory["nodes"]:
                for gpu in node["gpus"]:
                    for holder in gpu.get("instances", []) + gpu.get("shares", []):
                        if holder.get("lease_id") is not None and holder["lease_id"] not in mine:
                            holder["lease_id"] = "other"
        self.write_json(inventory)


class OffersHandler(ApiHandler):
    def get(self) -> None:
        self.write_json({"offers": self.scheduler.offers(self.identity.user, self.identity.groups)})


class LeasesHandler(ApiHandler):
    def get(self) -> None:
        everyone = self.get_query_argument("all", "0") not in ("0", "", "false")
        if everyone:
            self.require_admin()
        leases = self.scheduler.leases(None if everyone else self.identity.user)
        self.write_json({"leases": [self.lease_json(l) for l in leases]})

    async def post(self) -> None:
        body = self.json_body()
        _reject_unknown(body, LEASE_FIELDS)
        if "spec" not in body:
            raise ApiError(400, "spec is required", field="spec")
        spec = SliceSpec.from_json(body["spec"])
        holder = body.get("holder")
        if not isinstance(holder, str):
            raise ApiError(400, "holder is required: 'server', 'kernel:<id>' or 'job:<id>'", field="holder")
        try:
            priority = PriorityClass(body.get("priority", "interactive"))
        except (ValueError, TypeError):
            raise ApiError(400, "priority must be 'interactive' or 'batch'", field="priority") from None
        wait = _number(body, "wait")
        preemptible = _bool(body, "preemptible")
        idle_timeout = _number(body, "idle_timeout")
        with self.ctx.metrics.timed("submit"):
            lease = self.scheduler.submit(
                self.identity.user, holder, spec, priority, now=self.ctx.clock(), groups=self.identity.groups,
                preemptible=preemptible, wait=wait != 0, idle_timeout=idle_timeout)
        if lease.state is LeaseState.QUEUED and wait:
            await self.ctx.broker.wait_for_change(lease.id, min(wait, self.ctx.max_wait))
            lease = self.scheduler.lease(lease.id)
        self.respond_with(lease)

    def respond_with(self, lease: Lease) -> None:
        if lease.state.active:
            self.set_header("Location", self.reverse_url("lease", lease.id))
            self.write_json(self.lease_json(lease), 201 if lease.state is LeaseState.GRANTED else 202)
        elif lease.reason.startswith("drained"):
            raise ApiError(503, lease.reason, headers={"Retry-After": str(self.ctx.retry_after)},
                           reason=lease.reason, lease=lease.to_json())
        else:
            raise ApiError(409, lease.reason, reason=lease.reason, lease=lease.to_json())


class LeaseHandler(ApiHandler):
    def get(self, lease_id: str) -> None:
        self.write_json(self.lease_json(self.visible_lease(lease_id)))

    def delete(self, lease_id: str) -> None:
        lease = self.visible_lease(lease_id)
        if not lease.state.active:
            raise ApiError(404, f"lease {lease_id} has already ended", state=lease.state.value)
        with self.ctx.metrics.timed("release"):
            lease = self.scheduler.release(lease_id, now=self.ctx.clock(),
                                           reason=f"released by {self.identity.user}")
        self.write_json(self.lease_json(lease))


class TouchHandler(ApiHandler):
    def post(self, lease_id: str) -> None:
        lease = self.visible_lease(lease_id)
        body = self.json_body()
        _reject_unknown(body, TOUCH_FIELDS)
        now = self.ctx.clock()
        last_activity = parse_timestamp(body.get("last_activity"), "last_activity")
        busy = _bool(body, "busy")
        connections = body.get("connections")
        if connections is not None and (isinstance(connections, bool) or not isinstance(connections, int)
                                        or connections < 0):
            raise ApiError(400, "connections must be a non-negative integer", field="connections")
        if connections and self.ctx.connections_are_activity:
            last_activity = now
        if not lease.state.active:
            raise ApiError(404, f"lease {lease_id} has already ended", state=lease.state.value)
        with self.ctx.metrics.timed("touch"):
            lease = self.scheduler.touch(lease_id, now=now, last_activity=last_activity, busy=busy)
        self.write_json(self.lease_json(lease))


class HeartbeatHandler(ApiHandler):
    def post(self) -> None:
        body = self.json_body()
        _reject_unknown(body, {"holders"})
        holders = body.get("holders")
        if holders is not None and (not isinstance(holders, list) or not all(isinstance(h, str) for h in holders)):
            raise ApiError(400, "holders must be a list of holder names", field="holders")
        leases = self.scheduler.heartbeat(self.identity.user, holders, now=self.ctx.clock())
        self.write_json({"leases": [self.lease_json(l) for l in leases]})


class DrainHandler(ApiHandler):
    def post(self, gpu_uuid: str) -> None:
        self._drain(gpu_uuid, True)

    def delete(self, gpu_uuid: str) -> None:
        self._drain(gpu_uuid, False)

    def _drain(self, gpu_uuid: str, drained: bool) -> None:
        self.require_admin()
        with self.ctx.metrics.timed("drain"):
            self.scheduler.drain(gpu_uuid, drained, now=self.ctx.clock())
        self.write_json({"gpu": gpu_uuid, "drained": drained})


class EventsHandler(ApiHandler):
    """Server-sent events: one `data: {json}` message per event the caller may see."""

    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("X-Accel-Buffering", "no")
        self.stream = stream = self.ctx.broker.open_stream(self.identity)
        try:
            self.write(": connected\n\n")
            await self.flush()
            while True:
                try:
                    event = await stream.next(self.ctx.keepalive_interval)
                except EOFError as err:
                    if self.request.connection.stream.closed():
                        return
                    self.write(f"event: end\ndata: {json.dumps({'error': str(err)})}\n\n")
                    break
                self.write(": keepalive\n\n" if event is None else f"data: {json.dumps(event)}\n\n")
                await self.flush()
        except StreamClosedError:
            return
        finally:
            self.ctx.broker.close_stream(stream)
        self.finish()

    def on_connection_close(self) -> None:
        stream = getattr(self, "stream", None)
        if stream is not None:
            self.ctx.broker.close_stream(stream, "the client went away")


class MetricsHandler(ApiHandler):
    async def prepare(self) -> None:
        self.auth_required = self.ctx.authenticate_prometheus
        await super().prepare()

    def get(self) -> None:
        if self.ctx.authenticate_prometheus:
            self.require_admin()
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.ctx.metrics.render())


class OpenApiHandler(ApiHandler):
    auth_required = False

    def initialize(self, ctx: ServiceContext, document: dict) -> None:
        super().initialize(ctx)
        self.document = document

    def get(self) -> None:
        self.write_json(self.document)


class NotFoundHandler(ApiHandler):
    auth_required = False

    def prepare(self) -> None:
        raise ApiError(404, f"no such endpoint: {self.request.method} {self.request.path}")


def error_status(exc: BaseException) -> ApiError | None:
    """The API error for an exception the core raises about a request, or None for others."""
    if isinstance(exc, SpecError):
        return ApiError(400, str(exc), field=exc.field)
    if isinstance(exc, QuotaExceeded):
        return ApiError(403, str(exc), quota={"scope": exc.scope, "key": exc.key, "limit": exc.limit})
    if isinstance(exc, HolderBusy):
        return ApiError(409, str(exc), lease_id=exc.lease_id)
    if isinstance(exc, NotFound):
        return ApiError(404, str(exc))
    return None
