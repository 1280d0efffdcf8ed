"""The kernels' event stream: the server's one stream from the service, passed on to its kernels.

In remote mode each kernel holding a lease follows its lease's events (kernel/notices.py). Rather
than one service connection per kernel, the extension serves the events it already receives from
the service, unchanged (REST API v1's event JSON), at `<base_url>gpualloc/relay/api/v1/events`;
kernels are given that root as $GPUALLOC_EVENTS_URL. The stream asks for the token the kernels
were given for the service (the same user's), so it shows nothing its caller could not read there,
and answers only the Host names the server answers to (its allow-list against DNS rebinding).
`KernelsApiHandler` is that check for every path of the server's kernels under RELAY_ROOT (a
kernel restarting as a GPU kernel: server/gpu_restart.py).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any, Mapping

from jupyter_server.base.handlers import JupyterHandler
from tornado.iostream import StreamClosedError

RELAY_ROOT = "gpualloc/relay"
EVENTS_PATH = RELAY_ROOT + "/api/v1/events"
KEEPALIVE_SECONDS = 15.0
QUEUE_LIMIT = 1000  # events a slow reader may fall behind by; later ones are dropped for it


class KernelEventRelay:
    """Fans the events of the server's service stream out to the kernels' streams."""

    def __init__(self) -> None:
        self._readers: set[asyncio.Queue] = set()

    def subscribe(self) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(maxsize=QUEUE_LIMIT)
        self._readers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._readers.discard(queue)

    def publish(self, event: Mapping[str, Any]) -> None:
        for queue in self._readers:
            if not queue.full():
                queue.put_nowait(event)

    def close(self) -> None:
        """End every kernel's stream (server stop); a kernel reconnects to the next server."""
        for queue in self._readers:
            while queue.full():
                queue.get_nowait()
            queue.put_nowait(None)


class KernelsApiHandler(JupyterHandler):
    """A path of this server for its kernels: a JupyterHandler for the server's Host allow-list and
    headers; the caller is the kernels' token, not the server's own authentication."""

    def initialize(self, kernels_token: str) -> None:
        self.kernels_token = kernels_token

    def _authorized(self) -> bool:
        scheme, _, given = self.request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() in ("bearer", "token") and bool(given) and \
            hmac.compare_digest(given.strip().encode(), self.kernels_token.encode())

    def prepare(self) -> None:
        """Nothing of the server's own prepare(): these paths have their own token, checked by admitted()."""

    def refuse(self, status: int, error: str, field: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": error, "field": field}))

    def admitted(self) -> bool:
        """The kernels' token, on a Host this server answers to; else refused, and False."""
        if not self._authorized():
            self.refuse(401, "this path needs the token this server gave its kernels", "Authorization")
            return False
        if not self.check_host():
            self.refuse(403, "this Jupyter server does not answer to that Host", "Host")
            return False
        return True


class KernelEventsHandler(KernelsApiHandler):
    """GET: server-sent events, `data: {event JSON}` each, as the service sent them to this server."""

    def initialize(self, relay: KernelEventRelay, kernels_token: str) -> None:  # type: ignore[override]
        super().initialize(kernels_token)
        self.relay = relay

    async def get(self) -> None:
        if not self.admitted():
            return
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        queue = self.relay.subscribe()
        try:
            self.write(": connected\n\n")
            await self.flush()
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
                except asyncio.TimeoutError:
                    self.write(": keepalive\n\n")
                else:
                    if event is None:
                        break
                    self.write(f"data: {json.dumps(event)}\n\n")
                await self.flush()
        except StreamClosedError:
            pass
        finally:
            self.relay.unsubscribe(queue)
