"""How the service process runs: its start-up heap kept out of the garbage collector's walks, and
the WAL checkpointed from a thread of its own."""

from __future__ import annotations

import gc
import time

from jupyter_gpualloc.service.app import freeze_startup_heap
from jupyter_gpualloc.service.checkpoint import WalCheckpointer

from ..core.test_store_checkpoint import leases_in_database_file, scheduler_on_a_store_checkpointed_by_hand
from ..core.test_store_failures import SHARED


class _Held:
    """A start-up object in a reference cycle."""

    def __init__(self) -> None:
        self.me = self


def test_startup_heap_is_frozen_and_full_collections_skip_it():
    held = [_Held() for _ in range(200_000)]
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= len(held)
        start = time.process_time()
        gc.collect()
        frozen_walk = time.process_time() - start
        gc.unfreeze()
        start = time.process_time()
        gc.collect()
        full_walk = time.process_time() - start
        assert frozen_walk < full_walk / 2
    finally:
        gc.unfreeze()


def test_checkpointer_copies_commits_into_the_database_file_until_stopped(tmp_path):
    path = tmp_path / "s.sqlite"
    store, s = scheduler_on_a_store_checkpointed_by_hand(path)
    checkpointer = WalCheckpointer(store, 0.05)
    checkpointer.start()
    try:
        s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
        deadline = time.monotonic() + 10
        while leases_in_database_file(path, tmp_path) != {"A"}:
            assert time.monotonic() < deadline, "no checkpoint within 10 s"
            time.sleep(0.02)
    finally:
        checkpointer.stop()
    assert not checkpointer._thread.is_alive()
    s.submit("bob", "kernel:b", SHARED, now=2, lease_id="B")
    time.sleep(0.2)
    assert leases_in_database_file(path, tmp_path) == {"A"}
    store.close()
