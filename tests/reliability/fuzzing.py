"""schemathesis against the OpenAPI document an API serves, as one caller, with our own checks added.

Used by the suite (a short run) and by benchmarks/fuzz_api.py (a long one). The document's
endpoints are all fuzzed except the two streams, /events and /jobs/{job_id}/log (follow=1 streams
until the job ends), on which a request/response fuzzer can only time out; the auth matrix and
tests/service cover them. Requests may wait 75 s: a long-poll (`wait`) is held up to the
service's max_wait (60 s in embedded mode). `use_after_free` is left out: DELETE ends a lease, which stays readable
with its final state, as the document says.
Requests and 5xx answers are counted from the server's own request log, independently of
schemathesis' report.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PHASES = "examples,coverage,fuzzing,stateful"
# A request the document calls valid may be refused for this fleet's sake (400 on a spec.* field,
# see schemathesis_checks.py); an invalid one may be refused for its size (413) or media type (415).
CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "400", "401", "403", "404", "409"]
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "409", "413", "415"]
"""
# An access-log line: "<status> <METHOD> <uri> (<who>) <ms>ms", in tornado's and jupyter_server's forms
# (the API's own "<status> <METHOD> <path>: <error>" warnings are not requests of their own).
_REQUEST_LINE = re.compile(r"\b([1-5][0-9]{2}) ([A-Z]+) (/\S*) \([^)]*\) [0-9.]+ms")


@dataclass
class FuzzRun:
    """What one schemathesis run did and found."""

    returncode: int
    output: str
    seconds: float
    requests: int
    server_errors: int

    @property
    def summary(self) -> str:
        lines = [l for l in self.output.splitlines() if l.strip()]
        headings = ("FAILURES", "ERRORS", "SUMMARY")
        start = next((i for i, l in enumerate(lines) if any(h in l for h in headings)), max(len(lines) - 40, 0))
        return "\n".join(lines[start:start + 80])


def count_requests(log_text: str, api_path: str) -> tuple[int, int]:
    """(requests to the API, those answered 5xx), from a tornado request log."""
    requests = errors = 0
    for match in _REQUEST_LINE.finditer(log_text):
        if match.group(3).startswith(api_path):
            requests += 1
            errors += match.group(1).startswith("5")
    return requests, errors


def run_schemathesis(document_url: str, headers: dict[str, str], workdir: Path, log_file: Path, api_path: str, *,
                     max_examples: int, seed: int, user: str = "", phases: str = PHASES,
                     timeout: float = 600) -> FuzzRun:
    """One run of every phase over every operation but the streams; `user` enables the no-other-users check."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [str(Path(sys.executable).with_name("st")), "--config-file", str(config), "run", document_url,
               "--checks", "all", "--max-examples", str(max_examples), "--seed", str(seed),
               "--phases", phases, "--exclude-path", "/events", "--exclude-path", "/jobs/{job_id}/log",
               "--exclude-checks", "use_after_free", "--workers", "1", "--no-color",
               "--request-timeout", "75", "--suppress-health-check", "all"]
    for name, value in headers.items():
        command += ["--header", f"{name}: {value}"]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.reliability.schemathesis_checks",
           "GPUALLOC_FUZZ_USER": user, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    before = log_file.read_text(errors="replace") if log_file.exists() else ""
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=workdir, timeout=timeout)
    seconds = time.monotonic() - started
    after = log_file.read_text(errors="replace")
    requests, errors = count_requests(after[len(before):], api_path)
    return FuzzRun(done.returncode, done.stdout + done.stderr, seconds, requests, errors)
