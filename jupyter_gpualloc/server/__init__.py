"""The Jupyter server extension of jupyter-gpualloc (see app.py)."""

from __future__ import annotations


def _jupyter_server_extension_points() -> list[dict]:
    from .app import GpuAllocExtension

    return [{"module": "jupyter_gpualloc.server", "app": GpuAllocExtension}]
