"""How the service process runs: its start-up heap kept out of the garbage collector's walks."""

from __future__ import annotations

import gc
import time

from jupyter_gpualloc.service.app import freeze_startup_heap


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
