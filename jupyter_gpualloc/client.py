"""The one client of the scheduler service's REST API v1: async, with a thin sync wrapper.

    client = GpuAllocClient()            # URL and token from the environment (see discover)
    lease = await client.request_lease({"profile": "1g.10gb"}, holder="kernel:abc", wait=30)
    await client.release(lease["id"])

Errors are typed (`QuotaExceeded`, `NoCapacity`, `NotFound`, `Unauthorized`, `ServiceUnavailable`,
...); connection errors are retried with exponential backoff, nothing else is.
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from urllib.parse import quote, urlencode, urlparse

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.iostream import StreamClosedError

from .job_folder import JobFolder
from .user_files import FILE_THREADS, Refused, read_regular
from .lease_env import server_holder

DEFAULT_SERVICE_NAME = "gpualloc"
API_PATH = "api/v1/"
STREAM_TIMEOUT = 7 * 24 * 3600.0
LOG_POLL_SECONDS = 0.5  # how often a followed log on this machine's disk is read again


class GpuAllocError(Exception):
    """An error answer of the service: `status` and the JSON `body` it sent."""

    def __init__(self, message: str, status: int = 0, body: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.status = status
        self.body = dict(body or {})


class BadRequest(GpuAllocError):
    """400: `field` names what was wrong."""

    @property
    def field(self) -> str | None:
        return self.body.get("field")


class Unauthorized(GpuAllocError):
    """401 (no or unknown credentials) or 403 (not permitted)."""


class QuotaExceeded(GpuAllocError):
    """403 with the quota that refused the request: `scope`, `key`, `limit`."""

    @property
    def quota(self) -> dict[str, Any]:
        return dict(self.body.get("quota") or {})


class NotFound(GpuAllocError):
    """404: no such lease, GPU or endpoint (or another user's lease)."""


class NoCapacity(GpuAllocError):
    """409: nothing fits now and the request did not wait; `reason` says why."""

    @property
    def reason(self) -> str:
        return self.body.get("reason", str(self))


class HolderBusy(GpuAllocError):
    """409: this holder already has a lease (`lease_id`)."""

    @property
    def lease_id(self) -> str | None:
        return self.body.get("lease_id")


class Conflict(GpuAllocError):
    """409: the job's state does not allow this (e.g. cancelling a finished job); `state` says what it is."""

    @property
    def state(self) -> str | None:
        return self.body.get("state")


class ServiceUnavailable(GpuAllocError):
    """503 (e.g. the fleet is drained; `retry_after` seconds), or the service cannot be reached."""

    def __init__(self, message: str, status: int = 0, body: Mapping[str, Any] | None = None,
                 retry_after: float | None = None):
        super().__init__(message, status, body)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Endpoint:
    """Where the service is and how to authenticate to it."""

    url: str
    token: str = field(repr=False)


@dataclass
class StreamPosition:
    """Where a reader of GET /events is: the id of the last message it read, to resume after."""

    last_id: str | None = None


def discover(url: str | None = None, token: str | None = None, env: Mapping[str, str] | None = None) -> Endpoint:
    """The service URL and token: explicit arguments, else the environment.

    URL: `url`, else $GPUALLOC_URL, else JupyterHub's public hub URL ($JUPYTERHUB_PUBLIC_HUB_URL,
    as set inside single-user servers) + `services/<$GPUALLOC_SERVICE_NAME or gpualloc>/`.
    Token: `token`, else $GPUALLOC_TOKEN, else $JUPYTERHUB_API_TOKEN (a server's or kernel's own
    token is accepted by the service for that user).
    """
    env = os.environ if env is None else env
    url = url or env.get("GPUALLOC_URL")
    if not url:
        public = env.get("JUPYTERHUB_PUBLIC_HUB_URL") or env.get("JUPYTERHUB_PUBLIC_URL")
        if public:
            parsed = urlparse(public)
            base = env.get("JUPYTERHUB_BASE_URL", "/")
            name = env.get("GPUALLOC_SERVICE_NAME", DEFAULT_SERVICE_NAME)
            path = "/".join(p for p in (base.strip("/"), "services", name) if p)
            url = f"{parsed.scheme}://{parsed.netloc}/{path}/"
    if not url:
        raise ValueError("cannot find the gpualloc service: set GPUALLOC_URL (or pass url=...), or start "
                         "this from a Jupyter server whose jupyter_gpualloc extension runs (without GPUs: "
                         "c.GpuAllocExtension.fleet in ~/.jupyter/jupyter_server_config.py)")
    token = token or env.get("GPUALLOC_TOKEN") or env.get("JUPYTERHUB_API_TOKEN")
    if not token:
        raise ValueError("no token for the gpualloc service: set GPUALLOC_TOKEN (or pass token=...)")
    return Endpoint(url if url.endswith("/") else url + "/", token)


def error_for(status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> GpuAllocError:
    """The typed error for an error answer."""
    message = str(body.get("error") or f"HTTP {status}")
    if status == 400 or status == 413:
        return BadRequest(message, status, body)
    if status == 401:
        return Unauthorized(message, status, body)
    if status == 403:
        return (QuotaExceeded if "quota" in body else Unauthorized)(message, status, body)
    if status == 404:
        return NotFound(message, status, body)
    if status == 409:
        if "state" in body:
            return Conflict(message, status, body)
        return (HolderBusy if "lease_id" in body else NoCapacity)(message, status, body)
    if status == 503:
        retry = (headers or {}).get("Retry-After")
        return ServiceUnavailable(message, status, body, float(retry) if retry and retry.isdigit() else None)
    return GpuAllocError(message, status, body)


class Availability:
    """Whether the allocator answers, as a server's periodic work (reports, event relay, job runner)
    last found it: told once per change, so a hub whose allocator is down keeps working with one
    line in the server's log when it goes away and one when it is back."""

    def __init__(self, url: str, log: logging.Logger):
        self.url = url
        self.log = log
        self.down: str | None = None  # why it did not answer, while it does not

    def failed(self, error: BaseException) -> None:
        """A call failed: the first failure in a row is logged, the retries are quiet."""
        if self.down is None:
            self.log.warning("gpualloc: the GPU allocator at %s does not answer (%s); kernels start without "
                             "GPU slices, and this server keeps trying quietly", self.url, error)
        self.down = str(error)

    def answered(self) -> None:
        if self.down is not None:
            self.log.info("gpualloc: the GPU allocator at %s answers again", self.url)
        self.down = None


async def _read_local_log(log: Path, offset: int) -> bytes:
    """What a job's log on this machine's disk holds from `offset` (read as this process's user
    would, off the IOLoop, up to its size now); nothing while it is missing or not a regular file."""
    try:
        return await asyncio.get_running_loop().run_in_executor(FILE_THREADS, read_regular, str(log), offset)
    except (FileNotFoundError, Refused):
        return b""


class GpuAllocClient:
    """Async client of REST API v1 (tornado's HTTP client; usable in any asyncio program)."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 retries: int = 3, backoff: float = 0.2, max_clients: int = 10,
                 env: Mapping[str, str] | None = None):
        endpoint = discover(url, token, env)
        # the server this process belongs to (its own, or its kernel's or terminal's): it runs the jobs submitted here
        self.server = server_holder((os.environ if env is None else env).get("JUPYTERHUB_SERVER_NAME", ""))
        self.url = endpoint.url
        self.api_url = self.url + API_PATH
        self._token = endpoint.token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._max_clients = max_clients
        self._http: AsyncHTTPClient | None = None

    @property
    def http(self) -> AsyncHTTPClient:
        if self._http is None:
            self._http = AsyncHTTPClient(force_instance=True, max_clients=self._max_clients)
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    async def __aenter__(self) -> "GpuAllocClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _request(self, method: str, path: str, body: Any = None, timeout: float | None = None,
                 **kwargs: Any) -> HTTPRequest:
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        elif method in ("POST", "PUT", "PATCH"):
            data = ""
        return HTTPRequest(self.api_url + path, method=method, headers=headers, body=data,
                           request_timeout=timeout or self.timeout, connect_timeout=self.timeout, **kwargs)

    async def call(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        """One API call: the decoded JSON answer, or the typed error; retries connection errors."""
        attempt = 0
        while True:
            try:
                response = await self.http.fetch(self._request(method, path, body, timeout), raise_error=False)
            except (OSError, StreamClosedError) as err:
                if attempt >= self.retries:
                    raise ServiceUnavailable(f"cannot reach the gpualloc service at {self.url}: {err}") from err
                await asyncio.sleep(self.backoff * 2 ** attempt)
                attempt += 1
                continue
            if response.code == 599:
                raise ServiceUnavailable(f"no answer from the gpualloc service at {self.url}: {response.error}")
            text = response.body.decode("utf-8", "replace") if response.body else ""
            if response.code >= 400:
                try:
                    body_json = json.loads(text)
                except ValueError:
                    body_json = {"error": text.strip() or f"HTTP {response.code}"}
                if not isinstance(body_json, dict):
                    body_json = {"error": str(body_json)}
                raise error_for(response.code, body_json, response.headers)
            if response.headers.get("Content-Type", "").startswith("application/json"):
                return json.loads(text)
            return text

    # ------------------------------------------------------------------ API
    async def health(self) -> dict:
        return await self.call("GET", "health")

    async def whoami(self) -> dict:
        return await self.call("GET", "user")

    async def inventory(self) -> dict:
        return await self.call("GET", "inventory")

    async def offers(self) -> list[dict]:
        return (await self.offer_sheet())["offers"]

    async def offer_sheet(self) -> dict:
        """The offers and, under `refused_holders`, each kind of holder that gets no slice here, with why."""
        return await self.call("GET", "offers")

    async def request_kernel_pod(self, kernel_id: str, request: Mapping[str, Any]) -> dict:
        """Ask for a GPU kernel's pod (Kubernetes; see the KernelPodRequest schema); where it is."""
        return await self.call("POST", f"kernels/{quote(kernel_id, safe='')}/pod", dict(request))

    async def kernel_pod(self, kernel_id: str) -> dict:
        """Where a kernel's pod is: queued (position), starting, running (ip) or ended (reason)."""
        return await self.call("GET", f"kernels/{quote(kernel_id, safe='')}/pod")

    async def end_kernel_pod(self, kernel_id: str) -> dict:
        """The kernel shut down: its lease ends, then its pod."""
        return await self.call("DELETE", f"kernels/{quote(kernel_id, safe='')}/pod")

    async def restart_as_gpu_kernel(self, kernel_id: str, spec: Mapping[str, Any]) -> dict:
        """A kernel's server (this client's URL is its kernels' root, $GPUALLOC_EVENTS_URL) restarts the
        kernel as a GPU kernel in a pod of its own with `spec` (Kubernetes): {kernel_id, restarting, note}."""
        return await self.call("POST", f"kernels/{quote(kernel_id, safe='')}/restart", {"spec": dict(spec)})

    async def leases(self, all_users: bool = False) -> list[dict]:
        return (await self.call("GET", "leases?all=1" if all_users else "leases"))["leases"]

    async def lease(self, lease_id: str) -> dict:
        return await self.call("GET", f"leases/{quote(lease_id, safe='')}")

    async def request_lease(self, spec: Mapping[str, Any] | None, holder: str, *, offer: str | None = None,
                            priority: str = "interactive", wait: float | None = None,
                            preemptible: bool | None = None, idle_timeout: float | None = None) -> dict:
        """Ask for a slice, by `offer` name or by `spec`: the lease, granted or queued (see its `state`
        and `position`). Its idle timeout and time limit are the policy's for the offer;
        `idle_timeout` may only shorten it.

        `wait`: None queues without waiting, 0 raises NoCapacity if nothing fits now, N long-polls
        up to N seconds for the grant.
        """
        body: dict[str, Any] = {"offer": offer} if offer is not None else {"spec": dict(spec or {})}
        body.update(holder=holder, priority=priority)
        for name, value in (("wait", wait), ("preemptible", preemptible), ("idle_timeout", idle_timeout)):
            if value is not None:
                body[name] = value
        return await self.call("POST", "leases", body, timeout=self.timeout + (wait or 0))

    async def release(self, lease_id: str, *, holder_gone: bool = False) -> dict:
        """End a lease. Its slice returns to the pool once its holder is gone: at once with
        `holder_gone` (the caller knows the holder no longer uses the GPU), else when holders_gone()
        names the holder or its heartbeats stop."""
        query = "?holder_gone=true" if holder_gone else ""
        return await self.call("DELETE", f"leases/{quote(lease_id, safe='')}{query}")

    async def holders_gone(self, holders: list[str]) -> list[dict]:
        """Say that these holders of the caller's (a kernel's process, a server, a job's process)
        have ended: their leases end and their slices return to the pool. The leases whose slices returned."""
        return (await self.call("POST", "holders/gone", {"holders": list(holders)}))["leases"]

    async def extend(self, lease_id: str) -> dict:
        """Move a time-boxed lease's deadline later; NoCapacity (409) with the reason when refused."""
        return await self.call("POST", f"leases/{quote(lease_id, safe='')}/extend")

    async def touch(self, lease_id: str, *, last_activity: float | str | None = None, busy: bool | None = None,
                    connections: int | None = None) -> dict:
        body = {k: v for k, v in (("last_activity", last_activity), ("busy", busy),
                                   ("connections", connections)) if v is not None}
        return await self.call("POST", f"leases/{quote(lease_id, safe='')}/touch", body)

    async def utilization(self, lease_id: str, sm_percent: float) -> dict:
        """Report a GPU utilisation sample (SM %, 0-100) of a granted lease; the lease."""
        return await self.call("POST", f"leases/{quote(lease_id, safe='')}/utilization", {"sm_percent": sm_percent})

    async def recent_utilization(self, lease_id: str) -> dict:
        """A lease's GPU utilisation samples of the last minutes (`samples`: `at`, `sm_percent`)."""
        return await self.call("GET", f"leases/{quote(lease_id, safe='')}/utilization")

    async def heartbeat(self, holders: list[str] | None = None) -> list[dict]:
        body = {} if holders is None else {"holders": list(holders)}
        return (await self.call("POST", "heartbeat", body))["leases"]

    async def drain(self, gpu_uuid: str, drained: bool = True) -> dict:
        return await self.call("POST" if drained else "DELETE", f"gpus/{quote(gpu_uuid, safe='')}/drain")

    async def metrics(self) -> str:
        return await self.call("GET", "metrics")

    async def usage(self, *, since: str | float | None = None, until: str | float | None = None,
                    by: str = "user", user: str | None = None) -> dict:
        """GPU-hours per `by` (user, group, model, kind, offer, holder_kind, day) and the caller's usage quotas."""
        query = {k: str(v) for k, v in (("since", since), ("until", until), ("by", by), ("user", user))
                 if v is not None}
        return await self.call("GET", f"usage?{urlencode(query)}")

    async def usage_history(self, *, user: str | None = None) -> dict:
        """GPU-hours per day of the last 14 days, split by offer (the caller's; `user`: admins)."""
        query = {"user": user} if user is not None else {}
        return await self.call("GET", f"usage/history?{urlencode(query)}")

    async def usage_efficiency(self, *, since: str | float | None = None, until: str | float | None = None,
                               user: str | None = None) -> dict:
        """Leases with GPU utilisation samples: GPU-hours held vs. busy, least efficient first."""
        query = {k: str(v) for k, v in (("since", since), ("until", until), ("user", user)) if v is not None}
        return await self.call("GET", f"usage/efficiency?{urlencode(query)}")

    async def reservations(self) -> list[dict]:
        """Reservations: every one for admins, the caller's (as a member) for others."""
        return (await self.call("GET", "reservations"))["reservations"]

    async def create_reservation(self, request: Mapping[str, Any]) -> dict:
        """Hold capacity for users and groups in a window (admins; see the ReservationRequest schema)."""
        return await self.call("POST", "reservations", dict(request))

    async def delete_reservation(self, name: str) -> dict:
        return await self.call("DELETE", f"reservations/{quote(name, safe='')}")

    async def submit_job(self, request: Mapping[str, Any]) -> dict:
        """Queue a background job (see the JobRequest schema), run by this process's server unless
        `runner` says otherwise; the job, queued."""
        return await self.call("POST", "jobs", {"runner": self.server, **request})

    async def jobs(self, all_users: bool = False) -> list[dict]:
        return (await self.call("GET", "jobs?all=1" if all_users else "jobs"))["jobs"]

    async def job(self, job_id: str) -> dict:
        return await self.call("GET", f"jobs/{quote(job_id, safe='')}")

    async def cancel_job(self, job_id: str) -> dict:
        return await self.call("DELETE", f"jobs/{quote(job_id, safe='')}")

    async def rerun_job(self, job_id: str) -> dict:
        return await self.call("POST", f"jobs/{quote(job_id, safe='')}/rerun")

    async def start_job(self, job_id: str, runner: str | None = None) -> dict:
        """The runner's claim on a queued job of this server (or of `runner`: 'pod') whose slice is granted."""
        return await self.call("POST", f"jobs/{quote(job_id, safe='')}/start", {"runner": runner or self.server})

    async def runner_gone(self) -> list[dict]:
        """This server's job runner stops: its jobs wait for it (no slice, no quota) until it heartbeats them again."""
        return (await self.call("POST", "jobs/runners/gone", {"runner": self.server}))["jobs"]

    async def finish_job(self, job_id: str, attempt: int, outcome: str, reason: str = "") -> dict:
        """The runner's report of how an attempt ended."""
        return await self.call("POST", f"jobs/{quote(job_id, safe='')}/finish",
                               {"attempt": attempt, "outcome": outcome, "reason": reason})

    async def job_log(self, job_id: str) -> str:
        """The job's log: read where it lies when this process sees the job's folder (the owner's
        server and kernels do, also on Kubernetes, where the service does not see the homes),
        else from the service."""
        log = await self._local_log(job_id)
        if log is not None:
            return (await _read_local_log(log, 0)).decode("utf-8", "replace")
        return await self.call("GET", f"jobs/{quote(job_id, safe='')}/log")

    async def follow_job_log(self, job_id: str) -> AsyncIterator[str]:
        """The job's log as it grows, chunk by chunk, until the job ends (read where it lies, as job_log)."""
        log = await self._local_log(job_id)
        if log is not None:
            async for text in self._follow_local_log(job_id, log):
                yield text
            return
        chunks = self._stream(f"jobs/{quote(job_id, safe='')}/log?follow=1", "job log", {})
        try:
            async for chunk in chunks:
                yield chunk.decode("utf-8", "replace")
        finally:
            await chunks.aclose()

    async def _local_log(self, job_id: str) -> Path | None:
        """The path of the job's log when its working directory is on this machine's disk, else None."""
        job = await self.job(job_id)
        return JobFolder(job["workdir"], job["id"]).log if Path(job["workdir"]).is_dir() else None

    async def _follow_local_log(self, job_id: str, log: Path) -> AsyncIterator[str]:
        offset, decoder = 0, codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            try:
                active = (await self.job(job_id))["state"] in ("queued", "running")
            except ServiceUnavailable as err:  # as a followed stream that broke
                raise ServiceUnavailable(f"the job log from {self.url} broke: {err}") from err
            new = await _read_local_log(log, offset)
            if new:
                offset += len(new)
                yield decoder.decode(new)
            if not active:
                return
            await asyncio.sleep(LOG_POLL_SECONDS)

    async def _stream(self, path: str, what: str, headers: Mapping[str, str]) -> AsyncIterator[bytes]:
        """The body of a long GET, chunk by chunk as it arrives. A refusal comes out as the error of its
        status; a connection that drops or never opens as ServiceUnavailable, never tornado's own."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        request = self._request("GET", path, timeout=STREAM_TIMEOUT, streaming_callback=queue.put_nowait)
        request.headers.update(headers)
        stream_http = AsyncHTTPClient(force_instance=True)
        fetch = asyncio.ensure_future(stream_http.fetch(request, raise_error=False))

        def ended(done: asyncio.Future) -> None:
            if not done.cancelled():
                done.exception()  # counts as read: a reader that stopped early never reads it
            queue.put_nowait(None)

        fetch.add_done_callback(ended)
        try:
            while (chunk := await queue.get()) is not None:
                yield chunk
            try:
                response = fetch.result()
            except (OSError, StreamClosedError, HTTPClientError) as err:  # e.g. the connection dropped
                raise ServiceUnavailable(f"the {what} from {self.url} broke: {err}") from err
            if response.code >= 400:
                raise error_for(response.code, {"error": f"{what} refused (HTTP {response.code})"})
        finally:
            stream_http.close()

    async def events(self, query: Mapping[str, str] | None = None,
                     position: StreamPosition | None = None) -> AsyncIterator[dict]:
        """Server-sent events, one dict per event, until the stream ends or the caller stops.

        With `position`, the stream resumes after `position.last_id` (sent as Last-Event-ID) and
        keeps it up to date: the id of each event once the caller has taken it, and the positions
        the service sends in between. The service replays what was missed, or sends a
        `stream.reset` event first when it cannot.
        """
        messages = self._event_messages(query, position)
        try:
            async for event in messages:
                if event is not None:
                    yield event
        finally:
            await messages.aclose()

    async def event_position(self) -> str:
        """Where the event stream is now (the id its opening comment carries): a position to resume after
        later, for a reader that reads the state first and wants every event after that."""
        position = StreamPosition()
        messages = self._event_messages(None, position)
        try:
            async for _ in messages:
                if position.last_id:
                    return position.last_id
        finally:
            await messages.aclose()
        raise ServiceUnavailable(f"the event stream from {self.url} ended before it said where it was")

    async def _event_messages(self, query: Mapping[str, str] | None,
                              position: StreamPosition | None) -> AsyncIterator[dict | None]:
        """Each message of GET /events: its event, or None for one that only moves `position`."""
        suffix = f"?{urlencode(query)}" if query else ""
        headers = {"Accept": "text/event-stream"}
        if position is not None and position.last_id:
            headers["Last-Event-ID"] = position.last_id
        chunks = self._stream("events" + suffix, "event stream", headers)
        buffer = b""
        try:
            async for chunk in chunks:
                buffer += chunk
                while b"\n\n" in buffer:
                    message, buffer = buffer.split(b"\n\n", 1)
                    fields = [line.partition(b":") for line in message.split(b"\n") if line and line[:1] != b":"]
                    data = [value.removeprefix(b" ") for name, _, value in fields if name == b"data"]
                    ids = [value.strip().decode() for name, _, value in fields if name == b"id"]
                    moved = ids and position is not None
                    if data:
                        yield json.loads(b"\n".join(data))  # taken by the caller before the position moves
                    if moved:
                        position.last_id = ids[-1]
                    if moved and not data:
                        yield None
        finally:
            await chunks.aclose()


class SyncGpuAllocClient:
    """The same API, blocking: for the kernel side, where an event loop may already be running.

    Calls run on a private event loop in a daemon thread, so they work inside Jupyter kernels.
    """

    def __init__(self, url: str | None = None, token: str | None = None, **options: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gpualloc-client", daemon=True)
        self._thread.start()
        self._client = GpuAllocClient(url, token, **options)
        self.url = self._client.url

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def run(self, work: Callable[[GpuAllocClient], Awaitable[Any]]) -> Any:
        """Run `work(async client)` on this client's loop and wait for it; an interrupt (a kernel's
        Ctrl-C reaches this thread) cancels it there, then goes on up."""
        future = asyncio.run_coroutine_threadsafe(work(self._client), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    @property
    def asynchronous(self) -> GpuAllocClient:
        """The async client underneath, for work run on this client's loop (`run`, `on_loop`)."""
        return self._client

    def on_loop(self, callback: Callable[[], Any]) -> None:
        """Call `callback()` soon on this client's loop (e.g. a holder joining or leaving a Keepalive
        that beats there), after what was asked of the loop before."""
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(callback)

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def __enter__(self) -> "SyncGpuAllocClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def health(self) -> dict:
        return self._run(self._client.health())

    def restart_as_gpu_kernel(self, kernel_id: str, spec: Mapping[str, Any]) -> dict:
        return self._run(self._client.restart_as_gpu_kernel(kernel_id, spec))

    def whoami(self) -> dict:
        return self._run(self._client.whoami())

    def inventory(self) -> dict:
        return self._run(self._client.inventory())

    def offers(self) -> list[dict]:
        return self._run(self._client.offers())

    def offer_sheet(self) -> dict:
        return self._run(self._client.offer_sheet())

    def leases(self, all_users: bool = False) -> list[dict]:
        return self._run(self._client.leases(all_users))

    def lease(self, lease_id: str) -> dict:
        return self._run(self._client.lease(lease_id))

    def request_lease(self, spec: Mapping[str, Any], holder: str, **options: Any) -> dict:
        return self._run(self._client.request_lease(spec, holder, **options))

    def release(self, lease_id: str, *, holder_gone: bool = False) -> dict:
        return self._run(self._client.release(lease_id, holder_gone=holder_gone))

    def holders_gone(self, holders: list[str]) -> list[dict]:
        return self._run(self._client.holders_gone(holders))

    def extend(self, lease_id: str) -> dict:
        return self._run(self._client.extend(lease_id))

    def touch(self, lease_id: str, **report: Any) -> dict:
        return self._run(self._client.touch(lease_id, **report))

    def utilization(self, lease_id: str, sm_percent: float) -> dict:
        return self._run(self._client.utilization(lease_id, sm_percent))

    def heartbeat(self, holders: list[str] | None = None) -> list[dict]:
        return self._run(self._client.heartbeat(holders))

    def drain(self, gpu_uuid: str, drained: bool = True) -> dict:
        return self._run(self._client.drain(gpu_uuid, drained))

    def metrics(self) -> str:
        return self._run(self._client.metrics())

    def usage(self, **query: Any) -> dict:
        return self._run(self._client.usage(**query))

    def usage_efficiency(self, **query: Any) -> dict:
        return self._run(self._client.usage_efficiency(**query))

    def reservations(self) -> list[dict]:
        return self._run(self._client.reservations())

    def create_reservation(self, request: Mapping[str, Any]) -> dict:
        return self._run(self._client.create_reservation(request))

    def delete_reservation(self, name: str) -> dict:
        return self._run(self._client.delete_reservation(name))

    def submit_job(self, request: Mapping[str, Any]) -> dict:
        return self._run(self._client.submit_job(request))

    def jobs(self, all_users: bool = False) -> list[dict]:
        return self._run(self._client.jobs(all_users))

    def job(self, job_id: str) -> dict:
        return self._run(self._client.job(job_id))

    def cancel_job(self, job_id: str) -> dict:
        return self._run(self._client.cancel_job(job_id))

    def rerun_job(self, job_id: str) -> dict:
        return self._run(self._client.rerun_job(job_id))

    def job_log(self, job_id: str) -> str:
        return self._run(self._client.job_log(job_id))

    def watch_events(self, on_event: Callable[[dict], Any], query: Mapping[str, str] | None = None,
                     position: StreamPosition | None = None) -> concurrent.futures.Future:
        """Call `on_event` (on the client's thread) with each event of the stream until it ends
        (resuming after `position`, see GpuAllocClient.events); cancelling the returned future closes the stream."""
        async def follow() -> None:
            async for event in self._client.events(query, position):
                on_event(event)

        return asyncio.run_coroutine_threadsafe(follow(), self._loop)

    def follow_job_log(self, job_id: str):
        """The job's log chunks as they come (blocking iterator)."""
        agen = self._client.follow_job_log(job_id)
        while True:
            try:
                yield self._run(agen.__anext__())
            except StopAsyncIteration:
                return
