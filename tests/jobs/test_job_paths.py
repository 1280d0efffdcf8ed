"""The runner reads only inside a job's workdir, and only regular files, even for a record the
API would refuse today (one stored before its paths were confined)."""

from __future__ import annotations

import asyncio
import os
import threading

import nbformat
import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpualloc.jobs.notebook import job_notebook
from jupyter_gpualloc.user_files import Refused
from tests.jobs.conftest import cell_job


def notebook_job(workdir, path: str) -> dict:
    return {"id": "0123456789ab", "workdir": str(workdir), "source": {"kind": "notebook", "path": path}}


def test_a_notebook_outside_the_workdir_is_not_read(tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("secret = 1")]), tmp_path / "a.ipynb")
    assert job_notebook(notebook_job(tmp_path, "a.ipynb")).cells[0].source == "secret = 1"
    for path in ("../a.ipynb", str(tmp_path / "a.ipynb")):
        with pytest.raises(ValueError, match="not a path inside the job's working directory"):
            job_notebook(notebook_job(workdir, path))


def test_inputs_outside_the_workdir_are_not_loaded(tmp_path):
    job = {"id": "0123456789ab", "workdir": str(tmp_path),
           "source": {"kind": "cell", "code": "print(a)", "inputs": ["a"], "inputs_file": "../../etc/passwd"}}
    with pytest.raises(ValueError, match="not a path inside"):
        job_notebook(job)


def test_a_fifo_named_as_the_notebook_is_refused_at_once(tmp_path):
    fifo = tmp_path / "a.ipynb"
    os.mkfifo(fifo)
    outcome = []

    def read():
        try:
            job_notebook(notebook_job(tmp_path, "a.ipynb"))
        except Exception as err:
            outcome.append(err)
    reading = threading.Thread(target=read, daemon=True)
    reading.start()
    reading.join(5)
    if reading.is_alive():  # blocked on the FIFO: let it go before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reading.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], Refused) and "a FIFO" in str(outcome[0]), outcome


async def test_the_executed_notebook_is_served_only_as_a_regular_file(jobs_client, workdir, jp_fetch):
    job = await jobs_client.submit_job(cell_job(workdir, "x = 1"))
    await jobs_client.cancel_job(job["id"])  # the runner leaves it alone: the test writes its folder
    folder = workdir / ".gpualloc" / "jobs" / job["id"]
    folder.mkdir(parents=True, exist_ok=True)
    executed = folder / "executed.ipynb"
    executed.unlink(missing_ok=True)
    os.mkfifo(executed)
    with pytest.raises(HTTPClientError) as refused:
        await asyncio.wait_for(jp_fetch("gpualloc", "api", "jobs", job["id"], "executed"), 10)
    assert refused.value.code == 404
    executed.unlink()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), executed)
    answer = await jp_fetch("gpualloc", "api", "jobs", job["id"], "executed")
    assert nbformat.reads(answer.body.decode(), as_version=4).cells[0].source == "x = 1"
