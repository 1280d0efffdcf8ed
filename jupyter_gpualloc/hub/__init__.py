"""JupyterHub side of the GPU allocator: spawners whose servers run on GPU slices.

    c.JupyterHub.spawner_class = "jupyter_gpualloc.hub.GPULocalProcessSpawner"

The spawners are imported on first use, so importing this package needs no JupyterHub.
"""

from importlib import import_module

_LAZY = {
    "GPUSpawnerMixin": "mixin", "GPULocalProcessSpawner": "local", "GPUSameUserSpawner": "local",
    "GPUKubeSpawner": "kube", "slice_env": "env",
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
