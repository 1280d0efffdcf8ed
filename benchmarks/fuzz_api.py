"""A long schemathesis run against REST API v1: both ways it is served, as a user and as an admin.

Starts a standalone `jupyter-gpualloc serve` (tests/service/fleet.yaml) and a `jupyter server`
in embedded mode (tests/server/fleet.yaml), each on a temporary SQLite file, and runs
schemathesis against the OpenAPI document each serves: every phase (examples, coverage, fuzzing,
stateful), every built-in check plus the project's own (tests/reliability/schemathesis_checks.py),
fixed seeds. Requests and 5xx answers are counted from the servers' own request logs. Run
``python benchmarks/fuzz_api.py`` (about 10 minutes on 2 cores for the default 10,000+ requests);
it writes docs/benchmarks/fuzz_api.md and exits 1 if any run found a failure or a 5xx.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.reliability.fuzzing import FuzzRun, run_schemathesis  # noqa: E402
from tests.reliability.servers import ADMIN, USER, EmbeddedServer, bearer, start_standalone  # noqa: E402

OUT = ROOT / "docs" / "benchmarks" / "fuzz_api.md"


def fuzz_standalone(workdir: Path, examples: int, seed: int) -> list[tuple[str, FuzzRun]]:
    service, api = start_standalone(workdir / "service")
    try:
        runs = []
        for role, token, user in (("user", USER, "alice"), ("admin", ADMIN, "")):
            runs.append((f"standalone, {role}", run_schemathesis(
                api.url + "openapi.json", bearer(token), workdir / f"st-{role}", service.workdir / "service.log",
                "/api/v1/", max_examples=examples, seed=seed, user=user, timeout=3600)))
            api.release_all()
        return runs
    finally:
        service.kill()


def fuzz_embedded(workdir: Path, examples: int, seed: int) -> list[tuple[str, FuzzRun]]:
    runs = []
    for role, admin in (("user", False), ("admin", True)):
        server = EmbeddedServer(workdir / f"server-{role}", admin=admin, debug=True).start()
        try:
            api = server.api()
            runs.append((f"embedded, {role}", run_schemathesis(
                api.url + "openapi.json", api.user, workdir / f"emb-{role}", server.log_file, "/gpualloc/api/v1/",
                max_examples=examples, seed=seed + 1, user="" if admin else "owner", timeout=3600)))
        finally:
            server.stop()
    return runs


def report(runs: list[tuple[str, FuzzRun]], examples: int, seed: int) -> str:
    lines = [
        "# REST API v1 under schemathesis",
        "",
        f"`python benchmarks/fuzz_api.py --max-examples {examples} --seed {seed}` on {platform.node() or 'a host'} "
        f"({platform.machine()}, Python {platform.python_version()}), {time.strftime('%Y-%m-%d')}. Every phase "
        "(examples, coverage, fuzzing, stateful), every schemathesis check plus the project's own; requests and "
        "5xx counted from the servers' request logs.",
        "",
        "| served as | caller | requests | 5xx | schemathesis failures | seconds |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, run in runs:
        mode, role = name.split(", ")
        failures = "0" if run.returncode == 0 else "see below"
        lines.append(f"| {mode} | {role} | {run.requests:,} | {run.server_errors} | {failures} | {run.seconds:.0f} |")
    total = sum(r.requests for _, r in runs)
    errors = sum(r.server_errors for _, r in runs)
    lines += ["", f"Total: {total:,} requests, {errors} answered 5xx."]
    for name, run in runs:
        if run.returncode != 0:
            lines += ["", f"## {name}", "", "```", run.summary, "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-examples", type=int, default=120, help="schemathesis examples per operation and phase")
    parser.add_argument("--seed", type=int, default=2026, help="schemathesis seed (embedded runs use seed + 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        runs = fuzz_standalone(workdir, args.max_examples, args.seed)
        runs += fuzz_embedded(workdir, args.max_examples, args.seed)
    text = report(runs, args.max_examples, args.seed)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(text)
    return 0 if all(r.returncode == 0 and r.server_errors == 0 for _, r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
