"""Kernelspecs from the offers: "Python 3 (GPU 1g.10gb)" and the like, each launched by the gpualloc provisioner."""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

KERNEL_PREFIX = "gpualloc-"
PROVISIONER = "gpualloc"


def slice_words(spec: Mapping[str, Any], with_model: bool = False) -> str:
    """'1g.10gb', '8 GiB shared', 'whole L4' (plus ' on <model>' when asked)."""
    model = spec.get("model")
    if spec.get("profile"):
        words = spec["profile"]
    elif spec.get("kind") == "shared":
        words = f"{spec.get('memory_gib', 0):g} GiB shared"
    elif spec.get("kind") == "whole":
        count = spec.get("count", 1)
        return f"{count} x {model or 'GPU'}" if count > 1 else f"whole {model or 'GPU'}"
    else:
        words = f"{spec.get('memory_gib', 0):g} GiB"
    return f"{words} {model}" if with_model and model else words


def kernel_name(offer: Mapping[str, Any]) -> str:
    return KERNEL_PREFIX + re.sub(r"[^a-z0-9._-]+", "-", str(offer["name"]).lower()).strip("-")


def kernelspecs_for_offers(offers: Iterable[Mapping[str, Any]], argv: list[str] | None = None,
                           language: str = "python", label: str = "Python 3") -> dict[str, dict]:
    """Kernel name -> kernel.json for each offer; display names name the model only where needed."""
    offers = list(offers)
    argv = argv or [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    plain = Counter(slice_words(o["spec"]) for o in offers)
    specs = {}
    for offer in offers:
        words = slice_words(offer["spec"], with_model=plain[slice_words(offer["spec"])] > 1)
        config: dict[str, Any] = {"spec": dict(offer["spec"]), "offer": offer["name"]}
        specs[kernel_name(offer)] = {
            "argv": argv, "display_name": f"{label} (GPU {words})", "language": language,
            "metadata": {"kernel_provisioner": {"provisioner_name": PROVISIONER, "config": config},
                         "debugger": True},
        }
    return specs


def install_kernelspecs(offers: Iterable[Mapping[str, Any]], *, prefix: str | None = None, user: bool = False,
                        manager: KernelSpecManager | None = None) -> list[str]:
    """Install a kernelspec per offer (and remove gpualloc kernelspecs no longer offered); the names installed."""
    manager = manager or KernelSpecManager()
    specs = kernelspecs_for_offers(offers)
    for name, spec in specs.items():
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
            manager.install_kernel_spec(tmp, name, user=user, prefix=prefix)  # replaces an installed one
    for name in manager.find_kernel_specs():
        if name.startswith(KERNEL_PREFIX) and name not in specs:
            try:
                manager.remove_kernel_spec(name)
            except (NoSuchKernel, OSError):
                continue
    return sorted(specs)
