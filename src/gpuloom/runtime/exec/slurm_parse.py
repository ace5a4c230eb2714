"""What Slurm's commands print, read: ``scontrol``'s one-line records, a node's or job's gres and TRES,
exit codes and the states of jobs and nodes (which have ended, which run, which nodes may get jobs)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from ...core.cluster import Node

#: states of a job that has ended (its ExitCode is final)
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
#: states of a job whose processes run (or are being set up or torn down)
LIVE = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT",
                  "RESIZING"})
UP = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
NOT_UP_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "MAINT", "REBOOT_REQUESTED",
                          "REBOOT_ISSUED", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "POWER_DOWN",
                          "NOT_RESPONDING", "FUTURE", "INVALID_REG", "DOWN", "UNKNOWN"})
REASONS = {"OUT_OF_MEMORY": "killed by the OOM killer (Slurm: OUT_OF_MEMORY)",
           "TIMEOUT": "reached its Slurm time limit (TIMEOUT)",
           "NODE_FAIL": "its node failed (Slurm: NODE_FAIL)",
           "BOOT_FAIL": "its node failed to boot (Slurm: BOOT_FAIL)",
           "DEADLINE": "passed its Slurm deadline (DEADLINE)",
           "PREEMPTED": "preempted by Slurm (PREEMPTED)",
           "CANCELLED": "cancelled in Slurm (scancel), not by gpuloom"}
_GRES_IDX = re.compile(r"gpu(?::[^:(,]+)?:(\d+)\(IDX:([^)]*)\)")


def parse_records(text: str) -> list[dict[str, str]]:
    """Records of ``scontrol --oneliner show job|node`` (one a line, ``Key=Value`` words), first of each key.

    A word without ``=`` belongs to the value before it (a node's ``Reason=Not responding [..]``)."""
    out = []
    for line in text.splitlines():
        if "=" not in line:
            continue
        rec: dict[str, str] = {}
        last = None
        for word in line.split():
            k, eq, v = word.partition("=")
            if eq and k and (k.replace("/", "").replace(":", "").replace("_", "").isalnum()):
                if k in rec:  # -d repeats some keys (the allocated GRES): keep both, the second as k+"#2"
                    k = k + "#2"
                    if k in rec:
                        last = None
                        continue
                rec[k] = v
                last = k
            elif last is not None:
                rec[last] += " " + word
        out.append(rec)
    return out


def gres_gpus(gres: str) -> list[tuple[str, int]]:
    """A node's ``Gres=`` as (type, count) per GPU entry, in order (type ``""`` when untyped)."""
    out = []
    for item in gres.split(","):
        item = item.split("(", 1)[0]
        parts = item.split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        try:
            count = int(parts[-1])
            typ = parts[1] if len(parts) == 3 else ""
        except ValueError:  # gpu:a100 (count 1)
            count, typ = 1, parts[1]
        out.append((typ, count))
    return out


def gres_indices(gres: str) -> list[int]:
    """GPU indices in a job's or node's allocated ``GRES=gpu:g1:1(IDX:1),gpu:2(IDX:0,2-3)``."""
    out: list[int] = []
    for m in _GRES_IDX.finditer(gres):
        if int(m.group(1)) == 0:
            continue
        for r in m.group(2).split(","):
            if r in ("", "N/A"):
                continue
            a, _, b = r.partition("-")
            out.extend(range(int(a), int(b or a) + 1))
    return sorted(out)


def tres(s: str) -> tuple[int, int]:
    """(cores, memory in MB) of a job's ``TRES=cpu=2,mem=300M,node=1,billing=2``."""
    cpus = mem = 0
    for item in s.split(","):
        k, _, v = item.partition("=")
        try:
            if k == "cpu":
                cpus = int(v)
            elif k == "mem" and v:
                scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}.get(v[-1].upper())
                mem = int(float(v[:-1]) * scale) if scale is not None else int(v)
        except ValueError:
            continue
    return cpus, mem


#: the Comment a launch gives its Slurm job: which launch of the gpuloom job it is (its attempt), and
#: ``:stopped`` once the service stops it, so a restart tells that launch's job from an earlier one's and
#: its own end from a stop's (:meth:`~.slurm.SlurmExecutor.launched`)
_ATTEMPT = re.compile(r"gpuloom:attempt=(\d+)(:stopped)?")


def attempt_comment(attempt: int, stopped: bool = False) -> str:
    return f"gpuloom:attempt={attempt}" + (":stopped" if stopped else "")


def attempt_mark(comment: str) -> tuple[int, bool] | None:
    """(attempt, stopped) of a job's ``Comment`` made by :func:`attempt_comment`; None for another one."""
    m = _ATTEMPT.fullmatch(comment.strip())
    return (int(m.group(1)), m.group(2) is not None) if m is not None else None


def stop_marked(comment: str) -> bool:
    """Whether a job's ``Comment`` is :func:`attempt_comment`'s of a job the service stopped."""
    mark = attempt_mark(comment)
    return mark is not None and mark[1]


def owner_uid(rec: Mapping[str, str]) -> int:
    """The uid that owns a Slurm record: sacct's ``UID``, or scontrol's ``UserId`` (``name(uid)`` for a job, the
    number alone for a step); -1 if it names none."""
    raw = rec.get("UID") or rec.get("UserId", "")
    uid = raw.rpartition("(")[2].rstrip(")")
    return int(uid) if uid.isdigit() else -1


def exit_of(code: str) -> int | None:
    """Shell-style exit of a Slurm ``ExitCode=code:signal`` (``128 + signal`` when a signal ended it)."""
    try:
        a, _, b = code.partition(":")
        rc, sig = int(a), int(b or 0)
    except ValueError:
        return None
    return 128 + sig if sig else rc


def node_state_ok(state: str) -> bool:
    """Whether a node of ``State=`` (``IDLE``, ``MIXED+DRAIN``, ``IDLE*``) may get jobs."""
    if "*" in state or "~" in state or "#" in state or "!" in state or "%" in state:
        return False
    words = state.upper().split("+")
    return words[0] in UP and not (set(words[1:]) & NOT_UP_FLAGS)


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    gpus: int
    cpus: int
    mem_mb: int
    gpu_type: str
    types: tuple[str, ...]  # one gres Type per device, in index order; () when not declared so
    up: bool
    partitions: tuple[str, ...]
    addr: str = ""  # NodeAddr: where other nodes reach it

    def as_node(self) -> Node:
        return Node(self.name, self.gpus, self.cpus, self.mem_mb, self.gpu_type)


def slurm_node(rec: Mapping[str, str]) -> SlurmNode | None:
    """A :class:`SlurmNode` of one ``scontrol show node`` record, or None if it declares no GPU."""
    gpus = gres_gpus(rec.get("Gres", "") if rec.get("Gres") not in (None, "(null)") else "")
    n = sum(c for _, c in gpus)
    if n < 1:
        return None
    types = tuple(t for t, _ in gpus) if all(c == 1 and t for t, c in gpus) and len({t for t, _ in gpus}) == n else ()
    kinds = {t for t, _ in gpus}
    gpu_type = next(iter(kinds)) if len(kinds) == 1 and "" not in kinds and not types else "generic"
    cpus = int(rec.get("CPUEfctv") or rec.get("CPUTot") or 0)
    return SlurmNode(rec["NodeName"], n, cpus, int(rec.get("RealMemory") or 0), gpu_type, types,
                     node_state_ok(rec.get("State", "")), tuple(p for p in rec.get("Partitions", "").split(",") if p),
                     rec.get("NodeAddr", rec["NodeName"]))


def _time(s: str | None) -> float:
    """Seconds since the epoch of a Slurm time (``2026-11-28T19:31:42``, local time); 0 if not a time."""
    try:
        return datetime.fromisoformat(str(s)).timestamp()
    except ValueError:
        return 0.0
