"""A heartbeat keeps its lease alive through a store outage; the accrual it could not write is
written by the first heartbeat after the store is back."""

from __future__ import annotations

import signal
import time

from sqlalchemy import create_engine, inspect, text

from tests.service.conftest import ALICE, ServiceProcess

TTL = 2.0


def rename_tables(database, suffix_from: str, suffix_to: str) -> None:
    with database.begin() as conn:
        for table in inspect(database).get_table_names():
            if table.endswith(suffix_from):
                conn.execute(text(f"ALTER TABLE {table} RENAME TO {table[:len(table) - len(suffix_from)]}{suffix_to}"))


def test_a_heartbeat_keeps_its_lease_through_a_store_outage_and_its_accrual_is_written_after(tmp_path):
    svc = ServiceProcess(tmp_path, config=f"c.SchedulerPolicy.heartbeat_ttl = {TTL}\n",
                         args=("--tick-interval", "0.2")).start()
    database = create_engine(svc.db)
    try:
        lease = svc.call("POST", "leases", {"spec": {"kind": "shared", "memory_gib": 4}, "holder": "kernel:k"},
                         ALICE).json()
        rename_tables(database, "", "_away")  # the whole database goes away under the running service
        outage_ends = time.monotonic() + 3 * TTL
        while time.monotonic() < outage_ends:
            beat = svc.call("POST", "heartbeat", {}, ALICE)
            assert beat.status == 200, beat
            assert [l["id"] for l in beat.json()["leases"]] == [lease["id"]]
            time.sleep(TTL / 4)
        held = svc.call("GET", "leases", token=ALICE).json()["leases"]
        assert [(l["id"], l["state"]) for l in held] == [(lease["id"], "granted")]  # outlived 3 TTLs

        rename_tables(database, "_away", "")
        assert svc.call("POST", "heartbeat", {}, ALICE).status == 200
        with database.connect() as conn:
            end, = conn.execute(text("SELECT max(\"end\") FROM usage WHERE lease_id = :id"), {"id": lease["id"]}).one()
        # the accrual runs from the grant through the outage to the last heartbeat
        assert end - lease["granted_at"] >= 3 * TTL
    finally:
        svc.kill(signal.SIGKILL)
        database.dispose()
