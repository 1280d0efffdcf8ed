"""SQLite checkpoints: a store made without automatic checkpoints keeps commits in the WAL until
its owner calls checkpoint(), which copies them into the database file."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store, sqlite_url

from .test_store_failures import FLEET, POLICY, SHARED


def leases_in_database_file(path: Path, tmp_path: Path) -> set[str]:
    """The lease ids in the database file alone, as a power loss with an unsynced WAL would leave it."""
    copy = tmp_path / "file-only.sqlite"
    shutil.copyfile(path, copy)
    with sqlite3.connect(copy) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM leases")}


@pytest.mark.parametrize("auto", [True, False])
def test_automatic_checkpoints_are_the_stores_choice(tmp_path, auto):
    store = Store(sqlite_url(tmp_path / "s.sqlite"), sqlite_autocheckpoint=auto)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == (1000 if auto else 0)
    store.close()


def scheduler_on_a_store_checkpointed_by_hand(path: Path) -> tuple[Store, Scheduler]:
    """A store without automatic checkpoints (its tables already in the database file), and a scheduler on it."""
    store = Store(sqlite_url(path), sqlite_autocheckpoint=False)
    scheduler = Scheduler(SimulatedBackend(FLEET), store, SchedulerPolicy(**POLICY))
    store.checkpoint()
    return store, scheduler


def test_checkpoint_copies_the_wal_into_the_database_file(tmp_path):
    path = tmp_path / "s.sqlite"
    store, s = scheduler_on_a_store_checkpointed_by_hand(path)
    s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    assert leases_in_database_file(path, tmp_path) == set()
    store.checkpoint()
    assert leases_in_database_file(path, tmp_path) == {"A"}
    store.close()
