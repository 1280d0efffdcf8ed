"""WAL checkpoints off the IOLoop's thread.

SQLite checkpoints its WAL from whichever commit takes it past 1,000 pages: on the service's
IOLoop, where the copy into the database file and its two fsyncs (about 5 ms) stalled every
request waiting behind that commit. The service instead turns automatic checkpoints off and runs
a PASSIVE one every `interval` seconds from a thread of its own; sqlite3 lets go of the GIL while
it copies and syncs. With `synchronous=NORMAL` this also bounds what a power loss can take to
about one interval of answered changes (docs/reliability.md).
"""

from __future__ import annotations

import logging
import threading

from ..core.store import Store, StoreError


class WalCheckpointer:
    """Checkpoints `store` every `interval` seconds on a daemon thread until stop()."""

    def __init__(self, store: Store, interval: float, log: logging.Logger | None = None):
        self.store = store
        self.interval = interval
        self.log = log or logging.getLogger(__name__)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpualloc-wal-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop checkpointing and wait for a checkpoint in progress to finish."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.store.checkpoint()
            except StoreError as err:
                self.log.warning("WAL checkpoint failed (the next one retries): %s", err)
