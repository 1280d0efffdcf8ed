"""How the store writes: statements compiled once to a dialect's SQL and run through the driver,
and the writes of a group, kept by key so that one transaction writes each row once, as it was
last, with one executemany per statement."""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql import Executable

if TYPE_CHECKING:
    from .store import Store


class Records:
    """What `Store.save` writes besides leases and usage, by key: instance rows (None: removed), drain
    and returning marks (True: set), fulfilled intents, deadline rows (None: removed). A key's write
    sets its whole state: the last wins."""

    def __init__(self) -> None:
        self.instances: dict[str, dict | None] = {}
        self.drains: dict[str, bool] = {}
        self.returning: dict[str, bool] = {}
        self.intents_done: dict[str, None] = {}
        self.deadlines: dict[str, dict | None] = {}

    def __bool__(self) -> bool:
        return bool(self.instances or self.drains or self.returning or self.intents_done or self.deadlines)

    def update(self, other: "Records") -> None:
        self.instances.update(other.instances)
        self.drains.update(other.drains)
        self.returning.update(other.returning)
        self.intents_done.update(other.intents_done)
        self.deadlines.update(other.deadlines)


class Group:
    """Writes waiting for one transaction: leases by id (the last row of each), `save`'s other
    records by key (Records), the others in order, then usage segments by (lease, start) (the last
    row of each: an accrual's end only moves on). Keyed rows go in one executemany per statement."""

    def __init__(self) -> None:
        self.leases: dict[str, dict] = {}
        self.records = Records()
        self.writes: list[Callable[[Connection], None]] = []
        self.usage: dict[tuple[str, float], dict] = {}
        self.seq: int | None = None
        self.refused: list[Callable[[], None]] = []  # see Store.if_refused

    def __bool__(self) -> bool:
        return bool(self.leases or self.records or self.writes or self.usage or self.seq is not None)

    def copy(self) -> "Group":
        other = Group()
        other.leases, other.writes, other.seq = dict(self.leases), list(self.writes), self.seq
        other.usage, other.refused = dict(self.usage), list(self.refused)
        other.records.update(self.records)
        return other

    def add(self, write: Callable[[Connection], None] | None, lease_rows: Sequence[dict], seq: int | None,
            usage_rows: Sequence[dict] = (), records: Records | None = None) -> None:
        self.leases.update((row["id"], row) for row in lease_rows)
        self.usage.update(((row["lease_id"], row["start"]), row) for row in usage_rows)
        if records is not None:
            self.records.update(records)
        if write is not None:
            self.writes.append(write)
        if seq is not None:
            self.seq = seq

    def write(self, conn: Connection, store: Store) -> None:
        if self.leases:
            store._upsert_leases.run_many(conn, self.leases.values())
        if self.records:
            store._write_records(conn, self.records)
        for write in self.writes:
            write(conn)
        if self.usage:
            store._upsert_usage.run_many(conn, self.usage.values())
        if self.seq is not None:
            store._upsert_meta_row.run(conn, {"key": "seq", "value": str(self.seq)})


class DriverStatement:
    """A write compiled once, to one dialect's SQL, and run through the driver with
    `Connection.exec_driver_sql`: no compile-cache lookup, parameter processing or post-compile
    step per execution, while the transaction, the engine's events and the wrapping of the
    driver's errors stay SQLAlchemy's. A row maps every name in `keys` to a value the driver
    binds as it is (str, int, float, bool or None: no column of the store needs a type's processing;
    a column's Python-side default is not applied, so every row names every column)."""

    def __init__(self, statement: Executable, dialect: Dialect, keys: list[str]):
        compiled = statement.compile(dialect=dialect, column_keys=keys)
        names = list(compiled.positiontup or ()) if compiled.positional else list(compiled.bind_names.values())
        if sorted(names) != sorted(keys) or compiled.post_compile_params or compiled.literal_execute_params:
            raise ValueError(f"{compiled.string!r} does not take exactly {keys} as plain parameters")
        self.sql = compiled.string
        # Positional paramstyles (SQLite's qmark) take a tuple in the statement's order; named ones the row.
        self._params: Callable[[Mapping[str, Any]], Any] = (_in_order(names) if compiled.positional
                                                             else _as_is)

    def run(self, conn: Connection, row: Mapping[str, Any]) -> None:
        conn.exec_driver_sql(self.sql, self._params(row))

    def run_many(self, conn: Connection, rows: Iterable[Mapping[str, Any]]) -> None:
        """One executemany of `rows` (one execute when there is one, none when there are none)."""
        params = [self._params(row) for row in rows]
        if params:
            conn.exec_driver_sql(self.sql, params)


def _in_order(names: list[str]) -> Callable[[Mapping[str, Any]], tuple]:
    """A row's values as a tuple in the order of `names`."""
    if len(names) == 1:
        name = names[0]
        return lambda row: (row[name],)
    return itemgetter(*names)


def _as_is(row: Mapping[str, Any]) -> Mapping[str, Any]:
    return row
