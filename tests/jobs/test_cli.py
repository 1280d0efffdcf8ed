"""`jupyter-gpualloc job submit analysis.ipynb --param k=v` against a real server, whose runner executes it."""

from __future__ import annotations

import asyncio
import re
import sys

import nbformat

from tests.jobs.conftest import job_ends


def analysis_notebook(path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("learning_rate = 0.1\nepochs = 1\nlabel = 'default'"),
        nbformat.v4.new_code_cell("print(f'{label}: {epochs} epochs at {learning_rate}')"),
    ])
    nb.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(nb, path)


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "jupyter_gpualloc.cli", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


async def test_a_notebook_job_with_parameters(jobs_client, workdir, gpualloc):
    analysis_notebook(workdir / "analysis.ipynb")
    where = ["--url", gpualloc.client.url, "--token", gpualloc.server_token()]
    code, out, err = await cli("job", "submit", str(workdir / "analysis.ipynb"), "--mig", "1g.5gb",
                               "--param", "epochs=3", "-p", "label=sweep", *where)
    assert code == 0, err
    job_id = re.fullmatch(r"job (\w+) has its slice and is starting: .*/job\.log, then executed\.ipynb\n", out).group(1)
    done = await job_ends(jobs_client, job_id)
    assert done["state"] == "succeeded", done["reason"]
    executed = nbformat.read(workdir / ".gpualloc" / "jobs" / job_id / "executed.ipynb", as_version=4)
    assert executed.cells[1].metadata["tags"] == ["injected-parameters"]
    assert executed.cells[1].source == "# Parameters\nepochs = 3\nlabel = 'sweep'\n"
    assert executed.cells[2].outputs[0]["text"] == "sweep: 3 epochs at 0.1\n"
    code, out, _ = await cli("job", "list", *where)
    assert code == 0 and job_id in out and "succeeded" in out and "1g.5gb" in out


async def test_submit_errors_are_one_line(jobs_client, workdir, gpualloc):
    where = ["--url", gpualloc.client.url, "--token", gpualloc.server_token()]
    code, _, err = await cli("job", "submit", str(workdir / "missing.ipynb"), "--mig", "1g.5gb", *where)
    assert code == 1 and err == f"error: {workdir / 'missing.ipynb'} is not a notebook file (.ipynb)\n"
    analysis_notebook(workdir / "analysis.ipynb")
    code, _, err = await cli("job", "submit", str(workdir / "analysis.ipynb"), "--mig", "9g.99gb", *where)
    assert code == 1 and err.startswith("error: spec.profile") and err.count("\n") == 1, err
    code, _, err = await cli("job", "submit", str(workdir / "analysis.ipynb"), "--mig", "1g.5gb", "-p", "x", *where)
    assert code == 2 and "must look like name=value" in err
