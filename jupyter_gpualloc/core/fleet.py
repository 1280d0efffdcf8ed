"""Fleet files: a YAML or JSON description of nodes and their GPUs, parsed strictly.

```yaml
nodes:
  - name: local
    cpu_milli: 32000
    memory_mib: 131072
    gpus:
      - {model: A100-SXM4-80GB, count: 2, mig: dynamic}
      - {model: A100-SXM4-40GB, mig: static, layout: [3g.20gb, 2g.10gb, 1g.5gb]}
      - {model: L4}
      - {model: My-Accelerator, memory_mib: 24576}
```

`utilization` (optional) is the SM utilisation the simulated driver reports for the processes on
each GPU of the entry (and on its MIG instances) that state none of their own: a percentage, or
`[[seconds, percent], ...]` steps that repeat from t = 0, e.g. `[[600, 90], [1800, 0]]` for ten
busy minutes in every forty. `load_fleet(..., utilization=found)` fills `found` by GPU UUID.

`mig` is `off` (the default), `static` (the instances in `layout` are fixed) or `dynamic`
(instances may be created and destroyed). `layout` lists the MIG instances that exist on each
GPU of the entry, by profile name (each at the lowest legal start that lets the rest fit) or as
`{profile: 3g.40gb, start: 4}`. Every error names its place in the file, e.g.
`nodes[1].gpus[0].model: unknown GPU model 'X': give memory_mib`.

GPU and MIG UUIDs are derived deterministically (uuid5) from the node name, the GPU index and,
for MIG instances, the placement and a per-GPU creation counter, so the same file always yields
the same UUIDs and a re-created instance gets a new one, as with the real driver.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from . import mig
from .model import Gpu, MigInstance, MigMode, MigProfile, Node

_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://jupyter-gpualloc.invalid/simulated-gpu")


class FleetError(ValueError):
    """A fleet file that cannot be used; the message starts with the offending path."""


def gpu_uuid(node: str, index: int) -> str:
    """The deterministic UUID of GPU `index` on `node`: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`."""
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'{node}/gpu/{index}')}"


def mig_uuid(gpu: str, start: int, profile_id: int, counter: int) -> str:
    """The deterministic UUID of the `counter`-th MIG instance created on a GPU: `MIG-<uuid>`."""
    return f"MIG-{uuid.uuid5(_NAMESPACE, f'{gpu}/mig/{start}/{profile_id}/{counter}')}"


def smallest_free_id(used: set[int], first: int = 1) -> int:
    """The smallest id not in `used`, counting from `first` (how the driver numbers GPU instances)."""
    candidate = first
    while candidate in used:
        candidate += 1
    return candidate


@dataclass(frozen=True)
class UtilizationPattern:
    """SM utilisation over time: (seconds, percent) steps repeating from t = 0."""

    steps: tuple[tuple[float, float], ...]

    def at(self, t: float) -> float:
        offset = t % sum(seconds for seconds, _ in self.steps)
        for seconds, percent in self.steps:
            if offset < seconds:
                return percent
            offset -= seconds
        return self.steps[-1][1]


EXAMPLE_PREFIX = "example:"
# Where the shipped example fleets lie: inside an installed wheel, else in a checkout.
EXAMPLE_FOLDERS = (Path(__file__).parents[1] / "example_fleets", Path(__file__).parents[2] / "examples" / "fleets")


def example_fleets() -> dict[str, Path]:
    """The shipped example fleets by name ("demo": two MIG A100-80GB, a shared H100, an L4)."""
    for folder in EXAMPLE_FOLDERS:
        if folder.is_dir():
            return {path.stem: path for path in sorted(folder.glob("*.yaml"))}
    return {}


def fleet_path(source: str | os.PathLike[str]) -> Path:
    """A fleet file's path: `example:<name>` names a shipped example, anything else is a path."""
    text = os.fspath(source)
    if not text.startswith(EXAMPLE_PREFIX):
        return Path(text)
    name, examples = text[len(EXAMPLE_PREFIX):], example_fleets()
    if name not in examples:
        raise FleetError(f"{text}: no such example fleet (there are: "
                         f"{', '.join(EXAMPLE_PREFIX + n for n in examples) or 'none in this installation'})")
    return examples[name]


def load_fleet(source: str | os.PathLike[str] | Mapping[str, Any],
               utilization: dict[str, UtilizationPattern] | None = None) -> list[Node]:
    """Parse a fleet file (YAML or JSON; `example:demo` for a shipped example) or an already-loaded
    mapping into nodes; the GPUs' utilisation patterns go into `utilization` when it is given."""
    if isinstance(source, Mapping):
        return parse_fleet(source, utilization)
    path = fleet_path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetError(f"{path}: cannot read fleet file: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise FleetError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'}: {exc}") from None
    try:
        return parse_fleet(data, utilization)
    except FleetError as exc:
        raise FleetError(f"{path}: {exc}") from None


def parse_fleet(data: Any, utilization: dict[str, UtilizationPattern] | None = None) -> list[Node]:
    """Validate a fleet mapping (`{"nodes": [...]}`) and build its nodes (utilisation patterns into
    `utilization` when given)."""
    found: dict[str, UtilizationPattern] = {} if utilization is None else utilization
    if not isinstance(data, Mapping):
        raise FleetError("fleet: must be a mapping with a 'nodes' list")
    _check_keys(data, {"nodes"}, "fleet")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise FleetError("nodes: must be a non-empty list")
    nodes: list[Node] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_nodes):
        node = _parse_node(raw, f"nodes[{i}]", found)
        if node.name in seen:
            raise FleetError(f"nodes[{i}].name: duplicate node name {node.name!r}")
        seen.add(node.name)
        nodes.append(node)
    return nodes


def _parse_node(raw: Any, path: str, utilization: dict[str, UtilizationPattern]) -> Node:
    if not isinstance(raw, Mapping):
        raise FleetError(f"{path}: must be a mapping")
    _check_keys(raw, {"name", "cpu_milli", "memory_mib", "gpus"}, path)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise FleetError(f"{path}.name: must be a non-empty string")
    node = Node(name=name.strip(), cpu_milli=_positive_int(raw.get("cpu_milli"), f"{path}.cpu_milli"),
                memory_mib=_positive_int(raw.get("memory_mib"), f"{path}.memory_mib"))
    entries = raw.get("gpus", [])
    if not isinstance(entries, list):
        raise FleetError(f"{path}.gpus: must be a list")
    for j, entry in enumerate(entries):
        gpus = _parse_gpu_entry(entry, node.name, len(node.gpus), f"{path}.gpus[{j}]")
        if isinstance(entry, Mapping) and "utilization" in entry:
            pattern = _parse_utilization(entry["utilization"], f"{path}.gpus[{j}].utilization")
            utilization.update((gpu.uuid, pattern) for gpu in gpus)
        node.gpus.extend(gpus)
    return node


def _parse_gpu_entry(raw: Any, node: str, first_index: int, path: str) -> list[Gpu]:
    if not isinstance(raw, Mapping):
        raise FleetError(f"{path}: must be a mapping")
    _check_keys(raw, {"model", "count", "mig", "memory_mib", "layout", "utilization"}, path)
    model_name = raw.get("model")
    if not isinstance(model_name, str) or not model_name.strip():
        raise FleetError(f"{path}.model: must be a non-empty string")
    memory = raw.get("memory_mib")
    if memory is not None:
        memory = _positive_int(memory, f"{path}.memory_mib")
    try:
        model = mig.resolve_model(model_name, memory)
    except ValueError:
        raise FleetError(f"{path}.model: unknown GPU model {model_name!r}: give memory_mib") from None
    count = _positive_int(raw.get("count", 1), f"{path}.count")
    mode = _parse_mig_mode(raw.get("mig", "off"), f"{path}.mig")
    if mode is not MigMode.OFF and not model.mig_capable:
        raise FleetError(f"{path}.mig: {model.name} is not MIG-capable: use mig: off")
    layout = raw.get("layout")
    if layout is not None and mode is MigMode.OFF:
        raise FleetError(f"{path}.layout: a layout needs mig: static or dynamic")
    gpus = []
    for k in range(count):
        index = first_index + k
        uuid_ = gpu_uuid(node, index)
        instances = _parse_layout(layout, model.profiles, uuid_, f"{path}.layout") if layout else []
        gpus.append(Gpu(uuid=uuid_, index=index, model=model.name, memory_mib=memory or model.memory_mib,
                        node=node, mig_capable=model.mig_capable, mig_mode=mode, instances=instances))
    return gpus


def _parse_utilization(raw: Any, path: str) -> UtilizationPattern:
    def percent(value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
            raise FleetError(f"{where}: must be a percentage from 0 to 100")
        return float(value)

    if not isinstance(raw, list):
        return UtilizationPattern(((1.0, percent(raw, path)),))
    if not raw:
        raise FleetError(f"{path}: must be a percentage or a non-empty list of [seconds, percent] steps")
    steps = []
    for n, step in enumerate(raw):
        where = f"{path}[{n}]"
        if not isinstance(step, list) or len(step) != 2:
            raise FleetError(f"{where}: must be [seconds, percent]")
        seconds = step[0]
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise FleetError(f"{where}[0]: seconds must be a positive number")
        steps.append((float(seconds), percent(step[1], f"{where}[1]")))
    return UtilizationPattern(tuple(steps))


def _parse_mig_mode(value: Any, path: str) -> MigMode:
    # YAML 1.1 reads a bare `off` as False.
    if value is False:
        return MigMode.OFF
    try:
        return MigMode(value)
    except ValueError:
        raise FleetError(f"{path}: must be one of off, static, dynamic") from None


def _parse_layout(raw: Any, profiles: dict[int, MigProfile], gpu: str, path: str) -> list[MigInstance]:
    if not isinstance(raw, list):
        raise FleetError(f"{path}: must be a list of profile names or {{profile, start}} mappings")
    by_name = {p.name: p for p in profiles.values()}
    wanted: list[tuple[MigProfile, int | None]] = []
    for n, item in enumerate(raw):
        item_path = f"{path}[{n}]"
        if isinstance(item, str):
            name, start = item, None
        elif isinstance(item, Mapping):
            _check_keys(item, {"profile", "start"}, item_path)
            name, start = item.get("profile"), item.get("start")
            if start is not None and (isinstance(start, bool) or not isinstance(start, int)):
                raise FleetError(f"{item_path}.start: must be an integer")
        else:
            raise FleetError(f"{item_path}: must be a profile name or a {{profile, start}} mapping")
        profile = by_name.get(name) if isinstance(name, str) else None
        if profile is None:
            raise FleetError(f"{item_path}: unknown MIG profile {name!r}; this model has "
                             f"{', '.join(sorted(by_name))}")
        wanted.append((profile, start))
    starts = _place_layout(wanted, mig.MigGeometry.of(profiles), path)
    return [MigInstance(uuid=mig_uuid(gpu, start, profile.profile_id, n), profile_id=profile.profile_id,
                        start=start, size=profile.memory_slices, gi_id=n + 1, ci_id=0)
            for n, ((profile, _), start) in enumerate(zip(wanted, starts))]


def _place_layout(wanted: list[tuple[MigProfile, int | None]], geometry: mig.MigGeometry, path: str) -> list[int]:
    """Starts for the instances in order: each the lowest legal one, backtracking only when a later
    instance would not fit (so `[3g, 2g, 1g, 1g]` becomes 3g@4, 2g@0, 1g@2, 1g@3)."""
    chosen: list[int] = []
    deepest: list[Any] = [-1, ""]
    dead_ends: set[tuple[int, mig.Layout]] = set()

    def place(k: int, layout: mig.Layout) -> bool:
        if k == len(wanted):
            return True
        if (k, layout) in dead_ends:
            return False
        profile, start = wanted[k]
        legal = mig.legal_starts(layout, profile)
        options = legal if start is None else [s for s in legal if s == start]
        if not options and k >= deepest[0]:
            deepest[:] = [k, f"{profile.name} cannot start at {start} here; legal starts: {legal or 'none'}"
                          if start is not None else f"{profile.name} does not fit next to the instances before it"]
        for option in options:
            chosen.append(option)
            if place(k + 1, layout.with_instance(profile, option)):
                return True
            chosen.pop()
        dead_ends.add((k, layout))
        return False

    if not place(0, mig.Layout(geometry)):
        raise FleetError(f"{path}[{deepest[0]}]: {deepest[1]}")
    return chosen


def _check_keys(raw: Mapping[str, Any], known: set[str], path: str) -> None:
    for key in raw:
        if key not in known:
            raise FleetError(f"{path}.{key}: unknown field (known: {', '.join(sorted(known))})")


def _positive_int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise FleetError(f"{path}: must be a positive integer")
    return value
