"""What `%gpu` and `%%gpu job` accept: their argument parsers, their help text, and the REST spec
their slice options ask for.

Plain argparse, so `%gpu?` shows the usage as people type it (`--whole [N]`), and a mistake is one
line naming what `%gpu` does accept, never argparse's internal names.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any, NoReturn

from IPython.core.error import UsageError

from .sizes import MIB_PER_GIB, InputError, parse_size

ACTIONS = ("request", "release", "status", "offers", "list", "usage", "extend")
JOB_WORDS = ("job", "jobs")  # `%gpu job ...` and `%gpu jobs` are read by the job magics' parser


class MagicParser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError with one line instead of exiting the kernel."""

    def __init__(self, prog: str, description: str, epilog: str = "", usage: str | None = None):
        super().__init__(prog=prog, description=description, epilog=epilog, usage=usage, add_help=False,
                         formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def gpu_parser() -> MagicParser:
    """`%gpu [ACTION] [SIZE] [options]`."""
    parser = MagicParser(
        "%gpu", "Ask the GPU allocator for a slice for this kernel, see it, and give it back.",
        "Without --wait or --no-wait, a request that cannot be granted now fails at once.\n"
        "Examples: %gpu request 10GB; %gpu request --mig 1g.10gb --wait 10m; %gpu release\n"
        "Background jobs: %%gpu job ... on a cell; %gpu jobs; %gpu job logs|cancel|result|rerun ID",
        usage="%(prog)s [ACTION] [SIZE] [--mig PROFILE | --shared SIZE | --whole [N]] [--model MODEL]\n"
              "            [--wait [DURATION] | --no-wait | --restart]")
    parser.add_argument("action", nargs="?", default="status", metavar="ACTION",
                        help="request a slice, release it, show its status (the default), list the offers "
                             "(offers) or all your leases (list), show your GPU-hours this month and your usage "
                             "quotas (usage), or extend a time-boxed slice (extend)")
    parser.add_argument("size", nargs="*", metavar="SIZE",
                        help="for request: the GPU memory needed, e.g. 10GB, 10G, 10GiB or 10240MB (GB, G and "
                             "GiB all mean 1024 MiB). You get the smallest MIG profile whose name says that much "
                             "where one fits, else a shared slice capped at exactly that much. NVIDIA's profile "
                             "names round up: 10GB gets a 1g.10gb, which has 9.5 GiB on an A100 80GB (the grant "
                             "says how much)")
    _slice_options(parser, size_option=None)
    parser.add_argument("--wait", nargs="?", const="", metavar="DURATION",
                        help="queue if nothing fits now, and wait up to DURATION (e.g. 10m; no value: until "
                             "granted), showing the queue position; interrupt the cell to withdraw")
    parser.add_argument("--no-wait", action="store_true",
                        help="queue if nothing fits now, without waiting: %%gpu status shows the position and "
                             "applies the slice once granted")
    parser.add_argument("--restart", action="store_true",
                        help="on Kubernetes, where a running kernel cannot gain a GPU: restart this kernel as a "
                             "GPU kernel in a pod of its own with the slice (its variables are lost)")
    return parser


def job_submit_parser() -> MagicParser:
    """`%%gpu job [options]` on a cell."""
    parser = MagicParser(
        "%%gpu job", "Run this cell as a background job on a GPU slice, and return at once.",
        "Then: %gpu jobs, %gpu job logs ID [--follow], %gpu job cancel ID, %gpu job result ID, %gpu job rerun ID",
        usage="%(prog)s [--mem SIZE | --mig PROFILE | --shared SIZE | --whole [N]] [--model MODEL] [--name NAME]\n"
              "                 [--inputs A,B] [--outputs X,Y] [--priority batch|interactive]\n"
              "                 [--preemptible | --no-preemptible] [--timeout DURATION] [--retries N]")
    _slice_options(parser, size_option="--mem")
    parser.add_argument("--name", help="a name to recognise the job by (default: the cell's first line)")
    parser.add_argument("--inputs", default="", metavar="A,B", help="variables of this kernel the cell needs")
    parser.add_argument("--outputs", default="", metavar="X,Y",
                        help="variables the cell makes, for %%gpu job result")
    parser.add_argument("--priority", choices=("batch", "interactive"), default="batch",
                        help="batch (default) waits behind interactive requests; interactive needs the "
                             "admin's leave")
    parser.add_argument("--preemptible", dest="preemptible", action="store_true", default=None,
                        help="an interactive request may stop it (it gets SIGINT, then SIGTERM) and requeue it")
    parser.add_argument("--no-preemptible", dest="preemptible", action="store_false",
                        help="never preempted (it may wait longer)")
    parser.add_argument("--timeout", metavar="DURATION", help="stop an attempt after this long, e.g. 2h")
    parser.add_argument("--retries", type=int, default=0, metavar="N",
                        help="run again up to N times after a failure")
    return parser


def job_action_parser() -> MagicParser:
    """`%gpu job logs|cancel|result|rerun ID`."""
    parser = MagicParser("%gpu job", "Your background jobs.")
    parser.add_argument("action", choices=("logs", "cancel", "result", "rerun"), metavar="logs|cancel|result|rerun")
    parser.add_argument("job_id", metavar="ID")
    parser.add_argument("--follow", action="store_true", help="logs: keep printing until the job ends")
    return parser


def _slice_options(parser: MagicParser, size_option: str | None) -> None:
    if size_option:
        parser.add_argument(size_option, metavar="SIZE",
                            help="GPU memory needed, e.g. 40GB: the smallest MIG profile whose name says that much "
                                 "(3g.40gb, 39.25 GiB on an A100 80GB), else a shared slice of exactly that much")
    parser.add_argument("--mig", metavar="PROFILE", help="a MIG slice of this profile, e.g. 3g.40gb")
    parser.add_argument("--shared", metavar="SIZE", help="a memory-capped share of a GPU, e.g. 8GB")
    parser.add_argument("--whole", nargs="?", const=1, type=int, metavar="N", help="N whole GPUs (default 1)")
    parser.add_argument("--model", help="only GPUs of this model, named as you know it: e.g. H100, h100-80gb, "
                                        "L4 or 'NVIDIA H100 80GB HBM3' (any case)")


def parse_gpu_line(line: str) -> argparse.Namespace:
    """`%gpu`'s words; InputError (one line) for an action `%gpu` does not have."""
    args = gpu_parser().parse_args(shlex.split(line))
    if args.action not in ACTIONS:
        raise InputError(f"'{args.action}' is not a %gpu action: use one of {', '.join(ACTIONS + JOB_WORDS)}")
    return args


def spec_from_args(size: str, mig: str | None, shared: str | None, whole: int | None,
                   model: str | None) -> dict[str, Any]:
    """The REST spec for the slice options; InputError unless exactly one kind is given."""
    given = [name for name, value in (("a size", size), ("--mig", mig), ("--shared", shared),
                                      ("--whole", whole)) if value]
    if not given:
        raise InputError("say what to request: e.g. %gpu request 10GB, --mig 1g.10gb, --shared 8GB or --whole")
    if len(given) > 1:
        raise InputError(f"give one of a size, --mig, --shared or --whole (got {' and '.join(given)})")
    if mig:
        spec: dict[str, Any] = {"kind": "mig", "profile": mig}
    elif shared:
        spec = {"kind": "shared", "memory_gib": parse_size(shared) / MIB_PER_GIB}
    elif whole:
        spec = {"kind": "whole", "count": whole}
    else:
        spec = {"kind": "any", "memory_gib": parse_size(size) / MIB_PER_GIB}
    if model:
        spec["model"] = model
    return spec


def request_arguments(spec: dict) -> str:
    """The `%gpu request` arguments that ask for an offer's spec."""
    model = f" --model {shlex.quote(spec['model'])}" if spec.get("model") else ""
    if spec.get("kind") == "mig" or spec.get("profile"):
        return f"--mig {spec['profile']}{model}"
    if spec.get("kind") == "whole":
        count = spec.get("count", 1)
        return f"--whole{f' {count}' if count > 1 else ''}{model}"
    size = f"{spec['memory_gib']:g}GB" if spec.get("memory_gib") else ""
    return (f"--shared {size}" if spec.get("kind") == "shared" else size) + model
