"""schemathesis against the OpenAPI document each way the API is served, as a user and as an admin.

Every phase (examples, coverage, fuzzing, stateful), fixed seeds, every built-in check plus ours
(schemathesis_checks.py): zero 5xx, every answer as the document says. benchmarks/fuzz_api.py
runs the same at 10,000+ requests.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from .fuzzing import run_schemathesis
from .servers import ADMIN, USER, EmbeddedServer, bearer, start_standalone

EXAMPLES = 3


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    service, api = start_standalone(tmp_path_factory.mktemp("standalone"))
    yield service, api
    service.kill()


@pytest.mark.parametrize(("token", "user"), [(USER, "alice"), (ADMIN, "")], ids=["user", "admin"])
def test_standalone_service_answers_as_documented(standalone, tmp_path, token, user):
    service, api = standalone
    run = run_schemathesis(api.url + "openapi.json", bearer(token), tmp_path, service.workdir / "service.log",
                           "/api/v1/", max_examples=EXAMPLES, seed=11, user=user)
    assert run.returncode == 0, run.summary
    assert run.server_errors == 0 and run.requests > 300, (run.requests, run.server_errors)
    api.release_all()


def test_embedded_mode_answers_as_documented(tmp_path):
    """A server whose owner is a plain user and one whose owner is an admin, fuzzed side by side."""
    servers = {admin: EmbeddedServer(tmp_path / f"server-{admin}", admin=admin, debug=True) for admin in (False, True)}

    def fuzz(admin: bool):
        api = servers[admin].api()
        return run_schemathesis(api.url + "openapi.json", api.user, tmp_path / f"fuzz-{admin}",
                                servers[admin].log_file, "/gpualloc/api/v1/", max_examples=EXAMPLES, seed=12,
                                user="" if admin else "owner")

    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda server: server.start(), servers.values()))
            runs = list(pool.map(fuzz, servers))
    finally:
        for server in servers.values():
            server.stop()
    for run in runs:
        assert run.returncode == 0, run.summary
        assert run.server_errors == 0 and run.requests > 300, (run.requests, run.server_errors)
