"""GPU topology inside a node (Hadoop YARN-8821): ``nvidia-smi topo -m`` parser, cost table, PACK/SPREAD.

**Parser** (:func:`parse_topology`).  The matrix section runs from the header
line (the first line whose first cell is ``GPU0``) to a blank line or the
``Legend:`` line.  Cells are separated by tabs (newer drivers) or spaces
(older ones); device names hold no blanks, so the header's device columns
are its whitespace-separated names before ``CPU Affinity``/``NUMA
Affinity``/``GPU NUMA ID``.  Rows named ``GPU<n>`` form the
GPU matrix; every other row (``NIC<n>``, ``mlx5_<n>``, ``mlx4_0`` ...) is a
NIC, kept in a separate GPU x NIC link table, never mixed with GPUs.  Trailing
affinity cells may be empty (a quirk of some H100 outputs) and are ignored.
``NIC Legend`` lines (``NIC0: mlx5_0``) give the NICs their device names.
Terminal escapes are removed first: drivers underline the header
(``ESC[4m``...``ESC[0m``) even when the output is piped, as a 580 driver on
a one-GPU H200 machine did.
Known link tokens: ``X`` (self), ``NV1``..``NV18`` (any ``NV<n>``), ``PIX``,
``PXB``, ``PHB``, ``NODE``, ``SYS`` and its old name ``SOC``.  Anything else
raises :class:`TopologyError` naming the token, the file line and column.
(YARN's own parser crashes on two-digit ``NV12``/``NV18`` and on NIC rows.)

**Link costs** (:data:`LINK_COST`, lower is faster): ``NV<n>`` costs
``100 / n`` (NV1 100, NV2 50, NV12 8.3, NV18 5.6: cost falls as bonded links,
i.e. bandwidth, grow), then the PCIe paths by distance: PIX 200, PXB 300,
PHB 400, NODE 500, SYS/SOC 600.  YARN's weights make PIX and PXB (600,
1200) costlier than PHB/NODE (200) and SYS/SOC (300), the reverse of
NVIDIA's legend (PIX is the shortest PCIe path, SYS the longest); we keep
the legend's order.

**Cost table** (:meth:`Topology.cost_table`).  The cost of a GPU set is the sum
of its pair costs.  For every set size the table lists every combination
(as a bitmask) with its cost, sorted by cost (ties by the lower GPU ids);
it is computed once per topology (node type) and cached - 8 GPUs make 255
sets in all.

**Choice** (:meth:`Topology.choose`).  PACK takes the cheapest combination whose
GPUs are all free, SPREAD the most expensive (YARN: PACK favours GPU-GPU
bandwidth, SPREAD spreads over PCIe roots for CPU-GPU I/O).  YARN's
fallbacks apply first: one GPU requested, all free GPUs requested, or fewer
than three free - take the first free ones.

**Throughput** (:class:`TopologyFactor`, name ``"topology"``).  For a
topology-sensitive model, each node part of ``k >= 2`` GPUs is scored by
where its cost sits between the best and the worst ``k``-set of the node:
``x = (cost - best) / (worst - best)`` in [0, 1]; the part runs at
``1 / (1 + s * x)`` where ``s`` is the model's sensitivity (the slowdown on
the worst set); a job runs at its worst part's pace.  Defaults
(:data:`TOPOLOGY_SENSITIVITY`), from how much each model's iteration is
all-reduce of large dense gradients: VGG16/19 0.30, BERT/GPT2/Transformer/LM
0.25, DeepSpeech2 0.20, ResNet-50/ImageNet/DCGAN 0.10, ResNet-18/CIFAR-10/
YOLOv3 0.05; others (PointNet, recommendation, RL) 0, i.e. insensitive.
These are modelling assumptions, overridable per model.  Nodes whose GPU count
differs from the topology's are not scored (factor 1).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.job import Job
from ..core.parse import normalise_model
from ..core.plan import Allocation
from .model import ThroughputModel


class TopologyError(ValueError):
    """Unusable ``nvidia-smi topo -m`` output; the message names the token and line."""


PCIE_COST = {"PIX": 200.0, "PXB": 300.0, "PHB": 400.0, "NODE": 500.0, "SYS": 600.0, "SOC": 600.0}
_NV = re.compile(r"^NV(\d+)$")
_GPU = re.compile(r"^GPU(\d+)$")
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # terminal control sequences (SGR underline, reset)


def link_cost(token: str) -> float:
    """Cost of one link token (``NV12``, ``PIX``, ...); KeyError if unknown."""
    m = _NV.match(token)
    if m:
        n = int(m.group(1))
        if n < 1:
            raise KeyError(token)
        return 100.0 / n
    return PCIE_COST[token]


LINK_COST: dict[str, float] = {**{f"NV{n}": 100.0 / n for n in range(1, 19)}, **PCIE_COST}

PACK = "pack"
SPREAD = "spread"


def _header_devices(toks: list[str]) -> list[str]:
    """Device column names: the header's tokens before CPU Affinity / NUMA Affinity / GPU NUMA ID."""
    for i, t in enumerate(toks):
        nxt = toks[i + 1:i + 3]
        if (t in ("CPU", "NUMA") and nxt[:1] == ["Affinity"]) or (t == "GPU" and nxt == ["NUMA", "ID"]):
            return toks[:i]
    return toks


@dataclass(frozen=True, eq=False)
class Topology:
    """One node type's GPU links: ``links[i][j]`` token, ``cost[i, j]`` its cost."""

    gpus: tuple[str, ...]
    links: tuple[tuple[str, ...], ...]
    nics: tuple[str, ...] = ()
    nic_links: tuple[tuple[str, ...], ...] = ()  # [gpu][nic]
    source: str = ""
    cost: np.ndarray = field(init=False, repr=False)
    _tables: dict[int, tuple[np.ndarray, np.ndarray]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.gpus)
        c = np.zeros((n, n))
        for i in range(n):
            for j in range(n):
                if i != j:
                    c[i, j] = link_cost(self.links[i][j])
        object.__setattr__(self, "cost", c)
        object.__setattr__(self, "_tables", {})

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    def set_cost(self, gpus: Sequence[int]) -> float:
        idx = list(gpus)
        sub = self.cost[np.ix_(idx, idx)]
        return float(sub.sum() / 2)

    def cost_table(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """All ``k``-GPU sets of this node as (bitmasks, costs), cheapest first; cached."""
        t = self._tables.get(k)
        if t is None:
            n = self.num_gpus
            if not 1 <= k <= n:
                raise ValueError(f"set size {k} outside 1..{n}")
            combos = list(itertools.combinations(range(n), k))
            masks = np.array([sum(1 << g for g in c) for c in combos], dtype=np.int64)
            costs = np.array([self.set_cost(c) for c in combos])
            order = np.argsort(costs, kind="stable")  # combinations come in lexicographic order
            t = (masks[order], costs[order])
            self._tables[k] = t
        return t

    def best_set(self, k: int, policy: str = PACK) -> tuple[tuple[int, ...], float]:
        masks, costs = self.cost_table(k)
        i = 0 if policy == PACK else _last_of_max(costs)
        return _bits(int(masks[i])), float(costs[i])

    def cost_range(self, k: int) -> tuple[float, float]:
        _, costs = self.cost_table(k)
        return float(costs[0]), float(costs[-1])

    def choose(self, free: Sequence[int], k: int, policy: str = PACK) -> tuple[int, ...] | None:
        """Local GPU indices for a ``k``-GPU request given the free local GPUs (YARN's rules)."""
        if policy not in (PACK, SPREAD):
            raise TopologyError(f"topology policy must be 'pack' or 'spread', got {policy!r}")
        fr = sorted(set(int(g) for g in free))
        if k > len(fr) or k < 1:
            return None
        if k == 1 or k == len(fr) or len(fr) < 3:
            return tuple(fr[:k])
        fmask = 0
        for g in fr:
            fmask |= 1 << g
        masks, costs = self.cost_table(k)
        ok = np.flatnonzero((masks & ~fmask) == 0)
        if ok.size == 0:  # cannot happen when k <= free, kept for safety
            return tuple(fr[:k])
        i = int(ok[0]) if policy == PACK else int(ok[_last_of_max(costs[ok])])
        return _bits(int(masks[i]))

    def render(self) -> str:
        w = max(5, *(len(x) for x in self.gpus + self.nics)) + 1
        head = " " * w + "".join(f"{g:>{w}}" for g in self.gpus + self.nics)
        rows = [head]
        for i, g in enumerate(self.gpus):
            cells = [("X" if i == j else self.links[i][j]) for j in range(self.num_gpus)]
            cells += list(self.nic_links[i]) if self.nic_links else []
            rows.append(f"{g:<{w}}" + "".join(f"{c:>{w}}" for c in cells))
        return "\n".join(rows)


def _last_of_max(costs: np.ndarray) -> int:
    """Index of the first entry with the maximal cost (ties: lower GPU ids)."""
    return int(np.flatnonzero(costs == costs.max())[0])


def _bits(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


def parse_topology(text: str, source: str = "topology") -> Topology:
    """Parse ``nvidia-smi topo -m`` output (see the module docstring)."""
    text = _ESCAPE.sub("", text)
    lines = text.splitlines()
    start = None
    for i, line in enumerate(lines):
        toks = line.split()
        if toks and toks[0] == "GPU0":
            start = i
            break
    if start is None:
        raise TopologyError(f"{source}: no matrix header (a line starting with GPU0)")
    cols = _header_devices(lines[start].split())
    ncols = len(cols)
    gpu_cols = [j for j, c in enumerate(cols) if _GPU.match(c)]
    if [int(m.group(1)) for j in gpu_cols if (m := _GPU.match(cols[j]))] != list(range(len(gpu_cols))):
        raise TopologyError(f"{source}:{start + 1}: GPU columns must be GPU0..GPU{len(gpu_cols) - 1} in order")
    nic_cols = [j for j in range(ncols) if j not in gpu_cols]
    rows: dict[str, tuple[int, list[str]]] = {}
    for i in range(start + 1, len(lines)):
        raw = lines[i]
        if not raw.strip():
            break
        if raw.strip().startswith("Legend"):
            break
        toks = raw.split()
        name = toks[0]
        cells = toks[1:1 + ncols]
        if len(cells) < ncols:
            raise TopologyError(f"{source}:{i + 1}: row {name} has {len(cells)} link cells, the header {ncols}")
        for j, tok in enumerate(cells):
            if tok == "X":
                if cols[j] != name:
                    raise TopologyError(f"{source}:{i + 1}: 'X' (self) in row {name}, column {cols[j]}")
                continue
            try:
                link_cost(tok)
            except KeyError:
                raise TopologyError(
                    f"{source}:{i + 1}: unknown link type {tok!r} in row {name}, column {cols[j]}"
                ) from None
        if name in rows:
            raise TopologyError(f"{source}:{i + 1}: row {name} appears twice")
        rows[name] = (i + 1, cells)
    gpus = tuple(cols[j] for j in gpu_cols)
    if not gpus:
        raise TopologyError(f"{source}: no GPU columns")
    for g in gpus:
        if g not in rows:
            raise TopologyError(f"{source}: no row for {g}")
    links = tuple(tuple(rows[g][1][j] for j in gpu_cols) for g in gpus)
    for a, b in itertools.combinations(range(len(gpus)), 2):
        if links[a][b] != links[b][a]:
            ln = rows[gpus[a]][0]
            raise TopologyError(
                f"{source}:{ln}: asymmetric link {gpus[a]}-{gpus[b]} {links[a][b]!r} vs {links[b][a]!r}"
            )
    names = dict(re.findall(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", text, flags=re.M))
    nics = tuple(names.get(cols[j], cols[j]) for j in nic_cols)
    nic_links = tuple(tuple(rows[g][1][j] for j in nic_cols) for g in gpus) if nic_cols else ()
    return Topology(gpus, links, nics, nic_links, source)


def load_topology(path: str | Path) -> Topology:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TopologyError(f"{p}: {e}") from None
    return parse_topology(text, str(p))


# ---------------------------------------------------------------------------
#: Model -> sensitivity (keys normalised by :func:`~gpuloom.core.parse.normalise_model`, as lookups are).
TOPOLOGY_SENSITIVITY: dict[str, float] = {normalise_model(m): v for m, v in {
    **dict.fromkeys(["vgg16", "vgg19", "vgg"], 0.30),
    **dict.fromkeys(["bert", "bertbase", "bertlarge", "gpt2", "gpt2medium", "gpt", "transformer", "lm"], 0.25),
    **dict.fromkeys(["deepspeech2"], 0.20),
    **dict.fromkeys(["resnet50", "resnet", "imagenet", "dcgan", "resnet101", "inception", "inceptionv3"], 0.10),
    **dict.fromkeys(["resnet18", "cifar10", "yolov3"], 0.05),
}.items()}


class TopologyFactor:
    """Throughput factor: slowdown of a topology-sensitive job on a costly GPU set (see module doc)."""

    name = "topology"

    def __init__(self, cluster: Any, topology: Topology | Mapping[str, Topology],
                 sensitivity: Mapping[str, float] | None = None) -> None:
        self.cluster = cluster
        if isinstance(topology, Topology):
            per_node = [topology if n.gpus == topology.num_gpus else None for n in cluster.nodes]
        else:
            per_node = [topology.get(n.gpu_type) for n in cluster.nodes]
            per_node = [t if t is not None and t.num_gpus == n.gpus else None
                        for t, n in zip(per_node, cluster.nodes, strict=True)]
        self.per_node: list[Topology | None] = per_node
        self.sensitivity = dict(TOPOLOGY_SENSITIVITY)
        for m, s in (sensitivity or {}).items():
            if s < 0:
                raise ValueError(f"topology sensitivity of {m!r} must be >= 0")
            self.sensitivity[normalise_model(m)] = float(s)

    def sensitivity_of(self, job: Job) -> float:
        v = job.spec.attrs.get("topology_sensitivity") if job.spec.attrs else None
        return float(v) if v is not None else self.sensitivity.get(normalise_model(job.spec.model), 0.0)

    def __call__(self, job: Job, alloc: Allocation) -> float:
        s = self.sensitivity_of(job)
        if s <= 0:
            return 1.0
        worst = 0.0
        off = self.cluster.gpu_offset
        for p in alloc.parts:
            k = len(p.gpus)
            t = self.per_node[p.node]
            if k < 2 or t is None:
                continue
            lo, hi = t.cost_range(k)
            if hi <= lo:
                continue
            x = (t.set_cost([g - int(off[p.node]) for g in p.gpus]) - lo) / (hi - lo)
            worst = max(worst, x)
        return 1.0 / (1.0 + s * worst)


def add_topology(model: ThroughputModel, topology: Topology | Mapping[str, Topology],
                 sensitivity: Mapping[str, float] | None = None) -> ThroughputModel:
    """Add (or replace) the ``topology`` factor of a throughput model."""
    model.factors = [f for f in model.factors if f.name != "topology"]
    model.add(TopologyFactor(model.cluster, topology, sensitivity))
    return model
