"""A database server that dropped the store's writer connection (a restart, an idle timeout) costs
the next write a reconnect, not an error: the write was never committed, so it is tried again once."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from jupyter_gpualloc.core.model import Lease, LeaseState, PriorityClass, SliceSpec
from jupyter_gpualloc.core.store import Store
from tests.stores import StoreUrls, postgres_server


def lease(lease_id: str) -> Lease:
    return Lease(id=lease_id, user="ann", holder="server", spec=SliceSpec.from_json({"kind": "shared", "memory_gib": 8}),
                 priority=PriorityClass.INTERACTIVE, state=LeaseState.QUEUED, created_at=1.0, seq=1)


@pytest.fixture
def pg_store(tmp_path):
    urls = StoreUrls("postgresql", tmp_path)
    store = Store(urls.fresh())
    yield store
    store.close()
    urls.close()


def test_a_write_after_the_server_dropped_the_writer_connection_reconnects_and_succeeds(pg_store):
    pg_store.save([lease("A")], [], 1)
    backend = pg_store._writer.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    pg_store._writer.rollback()
    admin = create_engine(postgres_server())
    try:
        with admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend}).scalar()
    finally:
        admin.dispose()
    pg_store.save([lease("B")], [], 2)
    assert pg_store.load_lease("B").state is LeaseState.QUEUED
    assert pg_store._writer.exec_driver_sql("SELECT pg_backend_pid()").scalar() != backend
