"""``gpuloom queue``'s array collapsing and ``--format`` (squeue's ``-o``).

**Arrays.**  As squeue does, the pending tasks of one array that wait for the same reason are one
line: its ``ARRAY`` is ``16_[3-291]`` (the tasks' indices, ``16_[1,3,5-7]`` when not consecutive),
its ``JOBID`` the first of them, and its reason ends with the count (``(JobArrayTaskLimit) 289
tasks``).  Running and ended tasks stay one line each; ``--array`` lists every task.

**Formats.**  ``--format`` takes squeue's ``%`` codes, each ``%[[.]SIZE]CODE`` (``SIZE``: the
least width, left-justified, right-justified after ``.``), with the text between them printed as
it is; or a comma-separated list of field names, printed as a table.  :data:`CODES` maps each code
to its name:

====  ==============  ================================================================
code  name            what
====  ==============  ================================================================
%i    ``jobid``       job id: an array task's ``ARRAYID_TASK``, collapsed ``16_[3-291]``
%A    ``id``          gpuloom's job id (a number)
%K    ``task``        the array task index (collapsed: ``[3-291]``)
%j    ``name``        job name
%u    ``user``        owner
%P    ``queue``       queue (also %q)
%t    ``st``          short state (PD R CG CD F CA)
%T    ``state``       lifecycle state
%M    ``time``        time held GPUs so far
%l    ``time_limit``  time limit (``UNLIMITED`` without one)
%D    ``nodes``       number of nodes held (``-`` while pending)
%b    ``gres``        GPUs as Slurm's gres: ``gpu:2``, ``gpu:v100:2``
%N    ``nodelist``    nodes held
%r    ``reason``      why it waits or ended
%R    ``nodelist(reason)``  nodes held, else ``(reason)``, as the table's last column
%n    ``tasks``       tasks a line stands for (1, or a collapsed array's count)
====  ==============  ================================================================
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from ..runtime.state.history import format_duration

CODES = {"i": "jobid", "A": "id", "K": "task", "j": "name", "u": "user", "P": "queue", "q": "queue", "t": "st",
         "T": "state", "M": "time", "l": "time_limit", "D": "nodes", "b": "gres", "N": "nodelist", "r": "reason",
         "R": "nodelist(reason)", "n": "tasks"}
NAMES = tuple(dict.fromkeys(CODES.values()))
_CODE = re.compile(r"%(\.?)(\d*)([A-Za-z%])")


class FormatError(ValueError):
    pass


def task_ranges(tasks: Sequence[int]) -> str:
    """``3-5,7`` for tasks 3, 4, 5, 7 (sorted, distinct)."""
    out: list[str] = []
    start = prev = tasks[0]
    for t in tasks[1:]:
        if t != prev + 1:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = t
        prev = t
    out.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(out)


def collapse(rows: Iterable[list[Any]], fields: Sequence[str]) -> tuple[list[list[Any]], dict[int, int]]:
    """The jobs' values with the pending tasks of each array and reason made one (the first task's values,
    its ``array`` the label ``16_[3-291]``), in the order of their first task; and, by position, how
    many tasks each collapsed line stands for."""
    i_arr, i_st, i_pr = fields.index("array"), fields.index("st"), fields.index("pending_reason")
    out: list[list[Any]] = []
    groups: dict[tuple[str, Any], tuple[int, list[int]]] = {}  # (array id, reason) -> (position, its tasks)
    for v in rows:
        label = v[i_arr]
        if label is None or v[i_st] != "PD":
            out.append(v)
            continue
        aid, _, task = label.partition("_")
        key = (aid, v[i_pr])
        g = groups.get(key)
        if g is None:
            groups[key] = (len(out), [int(task)])
            out.append(v)
        else:
            g[1].append(int(task))
    counts: dict[int, int] = {}
    for (aid, _), (at, tasks) in groups.items():
        if len(tasks) > 1:
            tasks.sort()
            row = list(out[at])
            row[i_arr] = f"{aid}_[{task_ranges(tasks)}]"
            out[at] = row
            counts[at] = len(tasks)
    return out, counts


def parse_format(text: str) -> tuple[list[str], list[tuple[str, str, bool, int]]] | list[str]:
    """A ``--format``: names (``id,user``) as a list; or codes as (literal pieces, then per code: the text
    before it, its name, right-justified, width).  A :class:`FormatError` names what is wrong."""
    if "%" not in text:
        names = [n.strip().lower() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in NAMES]
        if bad or not names:
            raise FormatError(f"--format: unknown field {bad[0]!r}; fields: {', '.join(NAMES)} (or squeue's "
                              "%-codes: %i %u %j %t ...)" if bad else "--format: no field given")
        return names
    parts: list[tuple[str, str, bool, int]] = []
    pos = 0
    for m in _CODE.finditer(text):
        lit = text[pos:m.start()]
        if "%" in lit:
            raise FormatError(f"--format: no code at character {pos + lit.index('%') + 1}: "
                              "%[[.]SIZE]CODE, e.g. %i, %10j, %.8i")
        pos = m.end()
        dot, size, code = m.groups()
        if code == "%":
            parts.append((lit + "%", "", False, 0))
            continue
        if code not in CODES:
            raise FormatError(f"--format: unknown code %{code} at character {m.start() + 1}; codes: "
                              + " ".join(f"%{c}" for c in CODES))
        if dot and not size:
            raise FormatError(f"--format: %.{code} needs a width (%.10{code})")
        parts.append((lit, CODES[code], bool(dot), int(size or 0)))
    if "%" in text[pos:]:
        raise FormatError(f"--format: no code at character {text.index('%', pos) + 1}: "
                          "%[[.]SIZE]CODE, e.g. %i, %10j, %.8i")
    return [text[pos:]], parts


def cells(v: list[Any], fields: Sequence[str], names: Sequence[str], tasks: int) -> list[str]:
    """The named cells of one line (``tasks``: how many tasks it stands for)."""
    at = {f: i for i, f in enumerate(fields)}
    out = []
    for n in names:
        if n in ("jobid", "task"):
            label = v[at["array"]]
            if label is None:
                out.append(str(v[at["id"]]) if n == "jobid" else "-")
            else:
                out.append(label if n == "jobid" else label.partition("_")[2])
        elif n == "id":
            out.append(str(v[at["id"]]))
        elif n in ("name", "user", "st"):
            out.append(str(v[at[n]]))
        elif n == "queue":
            out.append(v[at["queue"]] or "-")
        elif n == "state":
            out.append(str(v[at["state"]]).upper())
        elif n == "time":
            out.append(format_duration(v[at["held_s"]]))
        elif n == "time_limit":
            tl = v[at["time_limit"]]
            out.append("UNLIMITED" if tl is None else format_duration(tl))
        elif n == "nodes":
            nodes = v[at["nodes"]] or []
            out.append(str(len(nodes)) if nodes else "-")
        elif n == "gres":
            t = v[at["gpu_type"]]
            out.append(f"gpu:{t}:{v[at['gpus']]}" if t else f"gpu:{v[at['gpus']]}")
        elif n == "nodelist":
            out.append(",".join(v[at["nodes"]] or []) or "-")
        elif n == "reason":
            out.append(str(_why(v, at) or "-"))
        elif n == "nodelist(reason)":
            nodes = ",".join(v[at["nodes"]] or [])
            out.append(nodes if nodes and v[at["st"]] in ("R", "CG") else f"({_why(v, at) or 'None'})")
        elif n == "tasks":
            out.append(str(tasks))
    return out


def _why(v: list[Any], at: dict[str, int]) -> str | None:
    return (v[at["pending_reason"]] or v[at["reason"]]) if v[at["st"]] == "PD" else v[at["reason"]]


def code_lines(rows: Sequence[list[Any]], fields: Sequence[str], counts: dict[int, int],
               fmt: tuple[list[str], list[tuple[str, str, bool, int]]]) -> list[str]:
    """Lines of a %-code format, the first the header (each code's name, upper case)."""
    tail, parts = fmt[0][0], fmt[1]
    names = [p[1] for p in parts if p[1]]

    def line(values: list[str]) -> str:
        it = iter(values)
        out = []
        for lit, name, right, width in parts:
            out.append(lit)
            if name:
                c = next(it)
                out.append(c.rjust(width) if right else c.ljust(width))
        out.append(tail)
        return "".join(out)

    head = line([n.upper() for n in names])
    return [head, *(line(cells(v, fields, names, counts.get(k, 1))) for k, v in enumerate(rows))]
