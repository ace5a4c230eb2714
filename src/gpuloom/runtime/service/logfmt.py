"""Log output of ``gpuloom serve``: ``--log-format text|json`` and ``--log-level``.

Job transitions are logged by :mod:`.telemetry` (logger ``gpuloom.jobs``) with
structured fields passed as ``extra`` (:data:`FIELDS`: ``event``, ``job``,
``user``, ``actor``, ``name``, ``queue``, ``nodes``, ``gpus``, ...); audit
records (:mod:`..state.audit`) on logger ``gpuloom.audit``.  The JSON format
writes one object per line with those fields as keys (for Loki,
Elasticsearch, ``jq``), the logger's name under ``logger``; the text format
appends them as ``key=value`` after the message.

A record's ``name`` attribute is its logger's (``logging`` refuses ``extra``
that sets it): a job's name is passed as ``job_name`` and written as ``name``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

#: structured fields a record may carry (``log.info(msg, extra={...})``), as written
FIELDS = ("event", "job", "user", "actor", "subject", "target", "name", "queue", "array", "nodes", "gpus",
          "exit_code", "reason", "state", "latency_s")
#: the record attribute a field is read from, where it is not the field's name
_ATTR = {"name": "job_name"}
FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k in FIELDS if (v := getattr(record, _ATTR.get(k, k), None)) is not None}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        kv = _fields(record)
        if not kv:
            return line
        extra = " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list | tuple) else v}" for k, v in kv.items())
        head, nl, rest = line.partition("\n")  # a traceback stays below the first line
        return f"{head} [{extra}]{nl}{rest}"


def configure(level: str = "info", fmt: str = "text", stream: IO[str] | None = None) -> None:
    """Send every log record to ``stream`` (stderr) in ``fmt`` at ``level``; raises ``ValueError`` for bad names."""
    if fmt not in FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if level.lower() not in LEVELS:
        raise ValueError(f"--log-level must be one of {', '.join(LEVELS)}, got {level!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
