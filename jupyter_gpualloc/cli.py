"""jupyter-gpualloc: the allocator's service, the JupyterHub demo, the simulators, and the fleet, usage, job and reservation commands.

`serve` is a traitlets application (`--help-all` lists every option); `demo` starts the local
JupyterHub demo; the simulators and the inventory view are plain argparse commands that drive
the same scheduler core.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path
from typing import Iterable, TextIO

from .core.holders import job_holder
from .core.devices.base import DeviceError, DeviceUnavailable

# ----------------------------------------------------------------- simulate openb


def parse_seeds(text: str) -> list[int]:
    """'42-51' or '42,43,50' -> a list of seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        if "-" in part.strip("-"):
            lo, hi = part.split("-", 1)
            seeds.extend(range(int(lo), int(hi) + 1))
        else:
            seeds.append(int(part))
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return seeds


def simulate_openb(args: argparse.Namespace, out: TextIO) -> int:
    from .core import openb
    from .core.placement import POLICY_NAMES

    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown:
        print(f"unknown policy {unknown[0]!r}: choose from {', '.join(POLICY_NAMES)}", file=sys.stderr)
        return 2
    trace = openb.trace_dir() if (args.nodes is None or args.pods is None) else None
    nodes = args.nodes or trace / "openb_node_list_gpu_node.csv"
    pods = args.pods or trace / "openb_pod_list_default.csv"
    for name in policies:
        result = openb.replay(nodes, pods, name, args.seeds)
        if args.json:
            print(json.dumps(result), file=out)
        else:
            a100, a130 = result["alloc_pct"]["100"], result["alloc_pct"]["130"]
            print(f"{name:>10}: GPU allocation {a100['mean']:6.2f}% ±{a100['sd']:.2f} at 100% arrived, "
                  f"{a130['mean']:6.2f}% ±{a130['sd']:.2f} at 130%  "
                  f"({len(result['seeds'])} seeds, {result['decisions']} decisions, {result['elapsed_s']:.1f} s)",
                  file=out)
        out.flush()
    return 0


# -------------------------------------------------------------- simulate requests


def simulate_requests(args: argparse.Namespace, out: TextIO) -> int:
    """Replay a JSON-lines stream of submit/release/tick operations through the core."""
    from .core.devices.simulated import SimulatedBackend
    from .core.policy import SchedulerPolicy
    from .core.scheduler import Scheduler
    from .core.store import Store, sqlite_url

    with tempfile.TemporaryDirectory() as tmp, open(args.requests) as stream:
        store = Store(args.db or sqlite_url(Path(tmp) / "simulate.sqlite"))
        policy = SchedulerPolicy(placement=args.placement, heartbeat_ttl=0, wait_for_holders=False)
        printer = _OutcomePrinter(out)  # hears recovery's outcomes too, when --db holds a state
        scheduler = Scheduler(SimulatedBackend(args.fleet), store, policy, listeners=[printer])
        try:
            for line_no, line in enumerate(stream, 1):
                if line.strip():
                    printer.run(scheduler, line, line_no)
        finally:
            store.close()
    return 0


class _OutcomePrinter:
    """Turns the scheduler's lease events into one JSON line per outcome."""

    STATES = {"lease.granted": "granted", "lease.queued": "queued", "lease.rejected": "rejected",
              "lease.released": "released", "lease.cancelled": "released", "lease.expired": "expired",
              "lease.preempted": "preempted"}

    def __init__(self, out: TextIO):
        self.out = out
        self.now = 0.0

    def __call__(self, event) -> None:
        state = self.STATES.get(event.type)
        if state is None:
            return
        line: dict = {"id": event.lease_id, "state": state}
        if state == "granted":
            sl = event.data["slice"]
            line["gpu"] = sl["gpu_uuids"][0] if len(sl["gpu_uuids"]) == 1 else sl["gpu_uuids"]
            line["slice"] = {k: sl[k] for k in ("kind", "profile", "start", "memory_mib") if k in sl}
            if sl.get("mig_uuid"):
                line["slice"]["mig_uuid"] = sl["mig_uuid"]
        elif state == "queued":
            line["position"] = event.data["position"]
        elif event.data.get("reason"):
            line["reason"] = event.data["reason"]
        self.emit(line)

    def emit(self, line: dict) -> None:
        print(json.dumps(line), file=self.out)

    def run(self, scheduler, raw: str, line_no: int) -> None:
        from .core.model import PriorityClass, SliceSpec, SpecError
        from .core.errors import SchedulerError

        try:
            op = json.loads(raw)
            if not isinstance(op, dict):
                raise ValueError("not an object")
        except ValueError as err:
            self.emit({"line": line_no, "state": "error", "reason": f"not a JSON object: {err}"})
            return
        self.now = float(op.get("now", self.now))
        kind = op.get("op")
        try:
            if kind == "submit":
                priority = PriorityClass(op.get("priority", "interactive"))
                scheduler.submit(op.get("user", "user"), op.get("holder", job_holder(str(op["id"]))),
                                 SliceSpec.from_json(op.get("spec", {})), priority, now=self.now,
                                 lease_id=str(op["id"]), wait=op.get("wait", 1) != 0,
                                 groups=op.get("groups", ()))
            elif kind == "release":
                scheduler.release(str(op["id"]), now=self.now)
            elif kind == "tick":
                scheduler.tick(self.now)
            else:
                self.emit({"line": line_no, "state": "error", "reason": "op must be submit, release or tick"})
        except (SpecError, SchedulerError, KeyError, ValueError) as err:
            reason = str(err) if not isinstance(err, KeyError) else f"missing field {err}"
            self.emit({"id": op.get("id"), "state": "rejected", "reason": reason})


# ----------------------------------------------------------------------- inventory


def inventory(args: argparse.Namespace, out: TextIO) -> int:
    from .core.devices import make_backend

    backend = make_backend("simulated", fleet=args.fleet) if args.backend == "simulated" else make_backend(args.backend)
    for line in render_inventory(backend):
        print(line, file=out)
    return 0


def render_inventory(backend) -> Iterable[str]:
    """Lines drawing each node, GPU and MIG layout (one cell per memory slice), then the nodes the
    backend could not use, with the reason."""
    from .core import mig

    for node in backend.discover():
        yield f"{node.name}  cpu {node.cpu_milli / 1000:g} cores, memory {node.memory_mib / 1024:g} GiB"
        for gpu in node.gpus:
            head = f"  GPU{gpu.index} {gpu.model:<16} {gpu.memory_mib / 1024:6.1f} GiB  mig={gpu.mig_mode.value:<7}"
            if gpu.mig_mode.value == "off":
                yield head + "  [whole / shared]"
                continue
            profiles = backend.mig_profiles(gpu.uuid)
            cells = ["."] * mig.MigGeometry.of(profiles).memory_slices
            names = []
            for n, inst in enumerate(sorted(gpu.instances, key=lambda i: i.start)):
                mark = chr(ord("a") + n)
                for s in inst.slices():
                    cells[s] = mark
                names.append(f"{mark}={profiles[inst.profile_id].name}@{inst.start}")
            yield head + "  |" + "|".join(cells) + "|  " + (" ".join(names) or "no instances")
    for unusable in backend.unusable_nodes():
        yield f"{unusable.name}  unusable: {unusable.reason}"


# --------------------------------------------------------------------------- usage


def usage(args: argparse.Namespace, out: TextIO) -> int:
    """GPU-hours from the service's GET /usage, as a table (or CSV)."""
    from .client import GpuAllocError, SyncGpuAllocClient
    from .kernel.usage import efficiency_lines, usage_lines

    try:
        with SyncGpuAllocClient(args.url, args.token) as client:
            if args.efficiency:
                report = client.usage_efficiency(since=args.since, until=args.until, user=args.user)
            else:
                report = client.usage(since=args.since, until=args.until, by=args.by, user=args.user)
    except GpuAllocError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.efficiency:
        for line in efficiency_lines(report):
            print(line, file=out)
        return 0
    if args.csv:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([args.by, "gpu_hours", "gib_hours", "leases"])
        writer.writerows([row[args.by], row["gpu_hours"], row["gib_hours"], row["leases"]] for row in report["rows"])
    else:
        for line in usage_lines(report):
            print(line, file=out)
    return 0


# ------------------------------------------------------------------------------ jobs


def parse_param(text: str) -> tuple[str, object]:
    """'k=v' -> (k, v): v as JSON when it reads as JSON (numbers, true, lists), else the text itself."""
    name, sep, raw = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"parameter '{text}' must look like name=value")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return name.strip(), value


def job_submit(args: argparse.Namespace, out: TextIO) -> int:
    """Queue a notebook as a background job: parameters go after its cell tagged `parameters`."""
    from .client import GpuAllocError, SyncGpuAllocClient
    from .job_folder import JobFolder
    from .kernel.arguments import spec_from_args
    from .kernel.sizes import InputError, parse_duration
    from .kernel.status import job_submitted_text

    notebook = Path(args.notebook).resolve()
    try:
        if notebook.suffix != ".ipynb" or not notebook.is_file():
            raise InputError(f"{args.notebook} is not a notebook file (.ipynb)")
        metadata = json.loads(notebook.read_text()).get("metadata", {})
        spec = spec_from_args(args.mem or "", args.mig, args.shared, args.whole, args.model)
        request = {
            "spec": spec, "workdir": str(notebook.parent), "name": args.name or notebook.name,
            "source": {"kind": "notebook", "path": notebook.name, "parameters": dict(args.param)},
            "kernel_name": metadata.get("kernelspec", {}).get("name", "python3"),
            "priority": args.priority, "retries": args.retries,
        }
        if args.preemptible is not None:
            request["preemptible"] = args.preemptible
        if args.timeout:
            request["timeout"] = parse_duration(args.timeout)
        with SyncGpuAllocClient(args.url, args.token) as client:
            job = client.submit_job(request)
    except (InputError, GpuAllocError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(job), file=out)
        return 0
    folder = JobFolder(notebook.parent, job["id"])
    print(f"job {job['id']} {job_submitted_text(job)}: {folder.log}, then {folder.executed.name}", file=out)
    return 0


def job_list(args: argparse.Namespace, out: TextIO) -> int:
    """Your jobs as a table."""
    from .client import GpuAllocError, SyncGpuAllocClient
    from .kernel.job_magics import job_table

    try:
        with SyncGpuAllocClient(args.url, args.token) as client:
            jobs = client.jobs()
    except GpuAllocError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in job_table(jobs) if jobs else ["no jobs"]:
        print(line, file=out)
    return 0


def job_run(args: argparse.Namespace, out: TextIO) -> int:
    """Run one attempt of a job here: the command of a job's Kubernetes Job pod."""
    import asyncio
    import logging

    from .client import GpuAllocClient, GpuAllocError
    from .jobs.runner import run_in_pod

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    async def run() -> int:
        client = GpuAllocClient(args.url, args.token)
        try:
            return await run_in_pod(client, args.job_id)
        finally:
            await client.close()

    try:
        return asyncio.run(run())
    except GpuAllocError as err:
        print(f"error: job {args.job_id}: {err}", file=sys.stderr)
        return 1


# ---------------------------------------------------------------------------- reservations


def reservation_request(args: argparse.Namespace) -> dict:
    """The REST body of `reservation create`; InputError (kernel/sizes.py) for a bad option."""
    from .core.model import SpecError
    from .core.reservations import parse_time
    from .kernel.arguments import spec_from_args
    from .kernel.sizes import InputError, parse_duration

    if (args.end is None) == (args.duration is None):
        raise InputError("give the window's --end or its --duration")
    try:
        start = parse_time(args.start, "--start")
        end = parse_time(args.end, "--end") if args.end else start + parse_duration(args.duration)
    except SpecError as err:
        raise InputError(f"{err.field} {err.message}") from None
    spec = spec_from_args(args.mem or "", args.mig, args.shared, args.whole, args.model)
    if args.node:
        spec["node"] = args.node
    return {"name": args.name, "users": args.user, "groups": args.group, "spec": spec, "count": args.count,
            "start": start, "end": end, "weekly": args.weekly, "lead_seconds": parse_duration(args.lead),
            "preempt_interactive": args.preempt_interactive}


def reservation_lines(reservations: list[dict]) -> list[str]:
    """One line per reservation: name, state, what it holds for whom, its next window, its use."""
    from .core.model import SliceSpec
    from .core.usage import format_time

    lines = []
    for r in reservations:
        who = ", ".join([*r["users"], *(f"group {g}" for g in r["groups"])])
        window = f"{format_time(r['next_start'])} - {format_time(r['next_end'])}" if r["next_start"] else "-"
        weekly = " weekly" if r["weekly"] else ""
        lines.append(f"{r['name']}  {r['state']}  {r['count']} x {SliceSpec.from_json(r['spec']).describe()} "
                     f"for {who}  {window}{weekly}  in use {r['in_use']}/{r['count']}  "
                     f"{r['gpu_hours']:.2f} GPU-h")
    return lines


def reservation(args: argparse.Namespace, out: TextIO) -> int:
    """create, list or delete reservations through the service (create and delete: admins)."""
    from .client import GpuAllocError, SyncGpuAllocClient
    from .kernel.sizes import InputError

    try:
        with SyncGpuAllocClient(args.url, args.token) as client:
            if args.reservation_command == "create":
                made = client.create_reservation(reservation_request(args))
                print(made["summary"], file=out)
                for warning in made.get("warnings", []):
                    print(f"warning: {warning}", file=out)
            elif args.reservation_command == "delete":
                print(f"deleted {client.delete_reservation(args.name)['name']}", file=out)
            else:
                found = client.reservations()
                for line in reservation_lines(found) if found else ["no reservations"]:
                    print(line, file=out)
    except (InputError, GpuAllocError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def add_reservation_parser(sub) -> None:
    res = sub.add_parser("reservation", help="capacity held for a class or workshop in a time window")
    res_sub = res.add_subparsers(dest="reservation_command", required=True)
    create = res_sub.add_parser("create", help="hold COUNT slices for users and groups in a window (admins)")
    create.add_argument("name", help="the reservation's name, e.g. ml101")
    create.add_argument("--user", action="append", default=[], help="a member (repeatable)")
    create.add_argument("--group", action="append", default=[], help="a member group (repeatable)")
    kind = create.add_mutually_exclusive_group(required=True)
    kind.add_argument("--mem", metavar="SIZE", help="slices of this GPU memory, e.g. 10GB")
    kind.add_argument("--mig", metavar="PROFILE", help="MIG slices of this profile, e.g. 1g.10gb")
    kind.add_argument("--shared", metavar="SIZE", help="memory-capped shares, e.g. 10GB")
    kind.add_argument("--whole", nargs="?", const=1, type=int, metavar="N", help="N whole GPUs per slice (default 1)")
    create.add_argument("--model", help="only this GPU model, e.g. H100")
    create.add_argument("--node", help="only on this node")
    create.add_argument("--count", type=int, default=1, help="how many slices (default 1)")
    create.add_argument("--start", required=True, help="e.g. 2026-12-08T10:00 (UTC unless it names its offset)")
    create.add_argument("--end", help="the window's end, same forms")
    create.add_argument("--duration", help="or its length, e.g. 2h")
    create.add_argument("--weekly", action="store_true", help="the window repeats every week")
    create.add_argument("--lead", default="10m", help="preemptible work leaves this long before the start (10m)")
    create.add_argument("--preempt-interactive", action="store_true",
                        help="end interactive work on its capacity at the start (warned at the lead)")
    delete = res_sub.add_parser("delete", help="delete a reservation (admins)")
    delete.add_argument("name")
    listing = res_sub.add_parser("list", help="reservations: all for admins, yours for members")
    for command in (create, delete, listing):
        command.add_argument("--url", help="the gpualloc API's root URL (default: $GPUALLOC_URL or JupyterHub's)")
        command.add_argument("--token", help="API token (default: $GPUALLOC_TOKEN or $JUPYTERHUB_API_TOKEN)")
        command.set_defaults(func=reservation)


# ---------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jupyter-gpualloc", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    # main() hands these two their arguments before this parser reads any: they are here for --help
    sub.add_parser("serve", add_help=False,
                   help="run the allocator's REST service (`serve --help-all` lists every option)")
    sub.add_parser("demo", add_help=False,
                   help="start the local JupyterHub demo on http://127.0.0.1:8000 (`demo --help`)")

    sim = sub.add_parser("simulate", help="replay a trace through the scheduler core")
    sim_sub = sim.add_subparsers(dest="trace", required=True)
    ob = sim_sub.add_parser("openb", help="the Alibaba openb trace with the FGD paper's protocol")
    ob.add_argument("--nodes", type=Path, help="node list CSV (default: the trace's GPU node list)")
    ob.add_argument("--pods", type=Path, help="pod list CSV (default: openb_pod_list_default.csv)")
    ob.add_argument("--policy", default="default", help="placement policy, or a comma list of them")
    ob.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"), help="e.g. 42-51 or 42,43")
    ob.add_argument("--json", action="store_true", help="one JSON object per policy")
    ob.set_defaults(func=simulate_openb)

    rq = sim_sub.add_parser("requests", help="a JSON-lines stream of submit/release/tick operations")
    rq.add_argument("--fleet", required=True, help="fleet file (YAML or JSON), or example:demo")
    rq.add_argument("--requests", required=True, help="JSON-lines operations")
    rq.add_argument("--placement", default="default", help="placement policy for shares and whole GPUs")
    rq.add_argument("--db", help="SQLAlchemy URL to keep the state in (default: a temporary SQLite file)")
    rq.add_argument("--json", action="store_true", help="print JSON lines (the only format)")
    rq.set_defaults(func=simulate_requests)

    inv = sub.add_parser("inventory", help="draw the fleet and its MIG layouts")
    inv.add_argument("--fleet", help="fleet file for the simulated backend, or example:demo")
    inv.add_argument("--backend", default=None, choices=["simulated", "nvml"],
                     help="where GPUs come from (default: simulated with --fleet, else nvml)")
    inv.set_defaults(func=inventory)

    use = sub.add_parser("usage", help="GPU-hours from the gpualloc service (yours; everyone's for admins)")
    use.add_argument("--since", help="start: a date (2026-11-01), an ISO-8601 time or epoch seconds, UTC "
                                     "(default: the start of this month)")
    use.add_argument("--until", help="end, same forms (default: now)")
    use.add_argument("--by", default="user", choices=["user", "group", "model", "kind", "offer", "holder_kind", "day",
                                                          "reservation"],
                     help="one row per user (default), group, GPU model, slice kind, offer, holder kind, UTC day "
                          "or reservation (the leases granted from one)")
    use.add_argument("--user", help="admins: only this user's usage")
    use.add_argument("--csv", action="store_true", help="CSV instead of a table")
    use.add_argument("--efficiency", action="store_true",
                     help="leases with GPU utilisation samples instead: GPU-hours held vs. busy, least efficient first")
    use.add_argument("--url", help="the service's URL (default: $GPUALLOC_URL or JupyterHub's environment)")
    use.add_argument("--token", help="API token (default: $GPUALLOC_TOKEN or $JUPYTERHUB_API_TOKEN)")
    use.set_defaults(func=usage)

    job = sub.add_parser("job", help="background jobs: queue a notebook on a GPU slice, list your jobs")
    job_sub = job.add_subparsers(dest="job_command", required=True)
    sj = job_sub.add_parser("submit", help="queue a notebook; it runs in your Jupyter server, next to the notebook")
    sj.add_argument("notebook", help="the .ipynb file; its outputs land in .gpualloc/jobs/<id>/ beside it")
    kind = sj.add_mutually_exclusive_group()
    kind.add_argument("--mem", metavar="SIZE", help="GPU memory needed, e.g. 40GB")
    kind.add_argument("--mig", metavar="PROFILE", help="a MIG slice of this profile, e.g. 3g.40gb")
    kind.add_argument("--shared", metavar="SIZE", help="a memory-capped share of a GPU, e.g. 8GB")
    kind.add_argument("--whole", nargs="?", const=1, type=int, metavar="N", help="N whole GPUs (default 1)")
    sj.add_argument("--model", help="only this GPU model, e.g. H100")
    sj.add_argument("--param", "-p", action="append", type=parse_param, default=[], metavar="NAME=VALUE",
                    help="a parameter, injected after the cell tagged `parameters` (repeatable; JSON values "
                         "such as 3, 0.1 or true are typed, anything else is a string)")
    sj.add_argument("--name", help="a name for the job (default: the notebook's file name)")
    sj.add_argument("--priority", choices=["batch", "interactive"], default="batch", help="priority class")
    sj.add_argument("--preemptible", dest="preemptible", action="store_true", default=None,
                    help="an interactive request may stop it and requeue it")
    sj.add_argument("--no-preemptible", dest="preemptible", action="store_false", help="never preempted")
    sj.add_argument("--timeout", metavar="DURATION", help="stop an attempt after this long, e.g. 2h")
    sj.add_argument("--retries", type=int, default=0, metavar="N", help="run again up to N times after a failure")
    sj.add_argument("--json", action="store_true", help="print the job as JSON")
    sj.set_defaults(func=job_submit)
    lj = job_sub.add_parser("list", help="your jobs: id, name, state, queue position, slice, runtime, reason")
    lj.set_defaults(func=job_list)
    rj = job_sub.add_parser("run", help="run one attempt of a job here (the command of its Kubernetes Job's pod)")
    rj.add_argument("job_id", help="the job's id")
    rj.set_defaults(func=job_run)
    for command in (sj, lj, rj):
        command.add_argument("--url", help="the gpualloc API's root URL (default: $GPUALLOC_URL or JupyterHub's)")
        command.add_argument("--token", help="API token (default: $GPUALLOC_TOKEN or $JUPYTERHUB_API_TOKEN)")
    add_reservation_parser(sub)
    return parser


USE_SIMULATED = "No GPU here? Use a simulated fleet: --backend simulated --fleet FLEET.yaml"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        from .service.app import main as serve_main

        return serve_main(argv[1:])
    if argv[:1] == ["demo"]:
        from .hub.demo import main as demo_main

        return demo_main(argv[1:])
    args = build_parser().parse_args(argv)
    if getattr(args, "backend", "") is None:
        args.backend = "simulated" if args.fleet else "nvml"
    try:
        return args.func(args, sys.stdout)
    except DeviceError as err:
        hint = f". {USE_SIMULATED}" if isinstance(err, DeviceUnavailable) else ""
        print(f"error: {err}{hint}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
