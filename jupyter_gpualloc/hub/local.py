"""Spawners for one machine: each server is a local process on its GPU slice.

- `GPULocalProcessSpawner`: JupyterHub's LocalProcessSpawner (one OS user per hub user).
- `GPUSameUserSpawner`: every server runs as the hub's own OS user, each with its own home
  under `home_dir_template` (like JupyterHub's SimpleLocalProcessSpawner): for demos and tests,
  never for production (users are not isolated from each other).
"""

from __future__ import annotations

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner

from .mixin import GPUSpawnerMixin


class GPULocalProcessSpawner(GPUSpawnerMixin, LocalProcessSpawner):
    """LocalProcessSpawner whose servers run on GPU slices from the scheduler service."""


class GPUSameUserSpawner(GPUSpawnerMixin, SimpleLocalProcessSpawner):
    """Demo spawner: servers on GPU slices, all run as the hub's OS user, one home each."""
