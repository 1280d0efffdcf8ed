"""The JupyterHub demo: `python -m jupyter_gpualloc.hub.demo` starts hub_config/jupyterhub_config.py.

The hub listens on http://127.0.0.1:8000 (or $GPUALLOC_DEMO_IP / $GPUALLOC_DEMO_PORT, or --ip /
--port) and keeps its databases, logs and the users' homes in the runtime directory (`.demo/` in
the checkout, or $GPUALLOC_DEMO_DIR). configurable-http-proxy is taken from the project's set-up
(.venv/node) or PATH. Stopping the demo stops the servers it started (the config itself keeps
servers across hub restarts, as production wants).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "hub_config" / "jupyterhub_config.py"
PROXY_IN_VENV = REPO / ".venv" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"

GUIDE = """\
JupyterHub on GPU slices: {url}

  Log in as alice, bob or carol (any password; any other name works too), or as `admin`.
  1. The spawn form lists the GPU offers with how many are free now: pick "MIG 1g.10gb" and
     start. The server's CUDA_VISIBLE_DEVICES is its MIG device (open a terminal or a notebook
     and run `env | grep -E "CUDA|GPUALLOC"`).
  2. In a second browser profile, log in as bob and pick "Whole H100"; then as carol: her form
     greys "Whole H100" out, "(over your quota: at most 20 GiB)". Pick it as
     another user (e.g. dave) while bob holds it: the spawn page shows "waiting for a whole GPU
     on H100 80GB HBM3: position 1 in queue" until bob stops his server (Hub Control Panel ->
     Stop My Server); then dave's server starts.
  3. As admin, the Hub Control Panel shows every server; in the same browser the allocator's API
     shows {url}/services/gpualloc/api/v1/leases?all=1 (every lease) and .../inventory (every GPU,
     with who holds each slice).
  Runtime files: {runtime}. Ctrl-C stops the hub and the servers it started.
"""


def find_proxy() -> str | None:
    if PROXY_IN_VENV.exists():
        return str(PROXY_IN_VENV)
    return shutil.which("configurable-http-proxy")


def demo_env(runtime: Path, ip: str, port: int, proxy: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("JUPYTERHUB_API_TOKEN", None)
    env["PATH"] = os.pathsep.join([str(Path(proxy).parent), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["GPUALLOC_DEMO_DIR"] = str(runtime)
    env["GPUALLOC_DEMO_IP"] = ip
    env["GPUALLOC_DEMO_PORT"] = str(port)
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jupyter-gpualloc demo", description=__doc__.splitlines()[0])
    parser.add_argument("--ip", default=os.environ.get("GPUALLOC_DEMO_IP") or "127.0.0.1",
                        help="address the hub listens on (default $GPUALLOC_DEMO_IP, else 127.0.0.1)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GPUALLOC_DEMO_PORT") or 8000),
                        help="port of the hub (default $GPUALLOC_DEMO_PORT, else 8000)")
    parser.add_argument("--runtime-dir", type=Path,
                        default=Path(os.environ.get("GPUALLOC_DEMO_DIR") or REPO / ".demo"),
                        help="where the hub keeps its state (default: .demo/ in the checkout)")
    parser.add_argument("--config", type=Path, default=CONFIG, help="the JupyterHub config file")
    args = parser.parse_args(argv)
    proxy = find_proxy()
    if proxy is None:
        print(f"error: configurable-http-proxy not found (looked at {PROXY_IN_VENV} and on PATH); install it "
              "with `npm install --prefix .venv/node configurable-http-proxy@4`", file=sys.stderr)
        return 1
    runtime = args.runtime_dir.resolve()
    runtime.mkdir(parents=True, exist_ok=True)
    print(GUIDE.format(url=f"http://{args.ip}:{args.port}", runtime=runtime), flush=True)
    # The config keeps servers across hub restarts (production); the demo stops what it started.
    hub = [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(args.config.resolve()),
           "--JupyterHub.cleanup_servers=True"]
    os.chdir(runtime)
    # This process becomes the hub, so Ctrl-C and SIGTERM reach it (and it stops its proxy and service).
    os.execve(hub[0], hub, demo_env(runtime, args.ip, args.port, proxy))


if __name__ == "__main__":
    sys.exit(main())
