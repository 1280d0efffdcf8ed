"""The notebook a job runs: a cell between the loading of its inputs and the saving of its outputs,
or a notebook with its parameters injected after the cell tagged `parameters` (as papermill does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode

from ..job_folder import JobFolder, inside
from ..user_files import read_regular

INJECTED_TAG = "injected-parameters"


def job_notebook(job: dict[str, Any]) -> NotebookNode:
    """The notebook to execute for a job (its JSON as REST API v1 gives it)."""
    source = job["source"]
    if source["kind"] == "notebook":
        text = read_regular(str(inside(job["workdir"], source["path"]))).decode("utf-8")
        return with_parameters(nbformat.reads(text, as_version=4), source.get("parameters") or {})
    return cell_notebook(source, Path(job["workdir"]), JobFolder(job["workdir"], job["id"]))


def cell_notebook(source: dict[str, Any], workdir: Path, folder: JobFolder) -> NotebookNode:
    """Load the inputs (a cloudpickle dict), run the cell, save the declared outputs."""
    cells = []
    if source.get("inputs"):
        path = str(inside(workdir, source["inputs_file"]))
        cells.append(_cell(
            "import cloudpickle as _gpualloc_pickle\n"
            f"with open({path!r}, 'rb') as _gpualloc_file:\n"
            "    globals().update(_gpualloc_pickle.load(_gpualloc_file))\n"
            "del _gpualloc_file, _gpualloc_pickle", "gpualloc-inputs"))
    cells.append(_cell(source["code"]))
    if source.get("outputs"):
        names = list(source["outputs"])
        cells.append(_cell(
            "import cloudpickle as _gpualloc_pickle\n"
            f"_gpualloc_missing = [n for n in {names!r} if n not in globals()]\n"
            "if _gpualloc_missing:\n"
            "    raise NameError(f'declared output {_gpualloc_missing[0]!r} was not set by the cell')\n"
            f"with open({str(folder.outputs)!r}, 'wb') as _gpualloc_file:\n"
            f"    _gpualloc_pickle.dump({{n: globals()[n] for n in {names!r}}}, _gpualloc_file)\n"
            "del _gpualloc_file, _gpualloc_pickle, _gpualloc_missing", "gpualloc-outputs"))
    return nbformat.v4.new_notebook(cells=cells)


def with_parameters(nb: NotebookNode, parameters: dict[str, Any]) -> NotebookNode:
    """Insert `name = value` lines after the cell tagged `parameters` (at the top when none is)."""
    nb.cells = [c for c in nb.cells if INJECTED_TAG not in c.get("metadata", {}).get("tags", [])]
    if not parameters:
        return nb
    text = "# Parameters\n" + "".join(f"{name} = {value!r}\n" for name, value in parameters.items())
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    nb.cells.insert(tagged[0] + 1 if tagged else 0, _cell(text, INJECTED_TAG))
    return nb


def _cell(text: str, tag: str | None = None) -> NotebookNode:
    cell = nbformat.v4.new_code_cell(text)
    if tag:
        cell.metadata["tags"] = [tag]
    return cell
