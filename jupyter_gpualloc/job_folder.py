"""Where a job's files live in its working directory: the one place that spells the layout.

    .gpualloc/inputs/<random>.pkl    a cell's pickled inputs, written by %%gpu job
    .gpualloc/jobs/<id>/job.log      the job's log
    .gpualloc/jobs/<id>/executed.ipynb  the executed notebook
    .gpualloc/jobs/<id>/outputs.pkl  a cell's declared outputs

Imports only the standard library, so the client and the kernel's magics can use it.
"""

from __future__ import annotations

from pathlib import Path

INPUTS_DIR = Path(".gpualloc") / "inputs"  # relative to the job's working directory


def inside(workdir: str | Path, relative: str) -> Path:
    """`workdir/relative` for a file the job names (source.path, inputs_file); ValueError for a
    path that could leave workdir (absolute, or with a `..` component), which the API refuses."""
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or ".." in parts:
        raise ValueError(f"{relative!r} is not a path inside the job's working directory")
    return Path(workdir) / relative


class JobFolder:
    """The files of one job, under `<workdir>/.gpualloc/jobs/<id>/`."""

    def __init__(self, workdir: str | Path, job_id: str):
        self.path = Path(workdir) / ".gpualloc" / "jobs" / job_id

    @property
    def log(self) -> Path:
        return self.path / "job.log"

    @property
    def executed(self) -> Path:
        return self.path / "executed.ipynb"

    @property
    def outputs(self) -> Path:
        return self.path / "outputs.pkl"
