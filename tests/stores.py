"""The databases the store's tests run on: SQLite always, PostgreSQL when a server is named.

`GPUALLOC_TEST_PG_URL` names a PostgreSQL server (`postgresql+psycopg://user@host:port/db`;
`.ci/run` starts a throwaway one and sets it). Each database a test asks for is a fresh schema
there, dropped afterwards. Without a server the PostgreSQL cases skip and say why; under CI
(`CI` set) they fail instead, so CI never passes without having run them.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from jupyter_gpualloc.core.store import sqlite_url

PG_ENV = "GPUALLOC_TEST_PG_URL"
STORE_KINDS = ("sqlite", "postgresql")
_reachable: dict[str, str | None] = {}  # server URL -> why it cannot be used (None: it can)


def postgres_server() -> str:
    """The PostgreSQL server to test on; skips the test (fails it under CI) when there is none."""
    url = os.environ.get(PG_ENV, "")
    if not url:
        problem = f"{PG_ENV} is not set (.ci/run starts a PostgreSQL server and sets it)"
    else:
        if url not in _reachable:
            engine = create_engine(url)
            try:
                with engine.connect():
                    _reachable[url] = None
            except Exception as err:  # noqa: BLE001 - any failure means: no server to test on
                _reachable[url] = f"no PostgreSQL server answers at {PG_ENV}: {type(err).__name__}: {err}"
            finally:
                engine.dispose()
        problem = _reachable[url]
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test the store on PostgreSQL: {problem}")
        pytest.skip(problem)
    return url


class StoreUrls:
    """Fresh, empty databases of one kind (`sqlite` or `postgresql`), each given as a store URL."""

    def __init__(self, kind: str, folder: Path):
        self.kind = kind
        self.folder = folder
        self._made = 0
        self._schemas: list[str] = []
        self._admin = create_engine(postgres_server()) if kind == "postgresql" else None

    def fresh(self) -> str:
        self._made += 1
        if self._admin is None:
            return sqlite_url(self.folder / f"store{self._made}.sqlite")
        schema = f"gpualloc_test_{secrets.token_hex(6)}"
        with self._admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        self._schemas.append(schema)
        url = make_url(os.environ[PG_ENV]).update_query_dict({"options": f"-csearch_path={schema}"})
        return url.render_as_string(hide_password=False)

    def close(self) -> None:
        if self._admin is None:
            return
        with self._admin.begin() as conn:
            for schema in self._schemas:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        self._admin.dispose()


@pytest.fixture(params=STORE_KINDS)
def store_urls(request, tmp_path):
    """Fresh store URLs; a test using this runs once on SQLite and once on PostgreSQL."""
    urls = StoreUrls(request.param, tmp_path)
    yield urls
    urls.close()
