"""The HTTP API of ``gpuloom serve`` (FastAPI).

Endpoints (JSON; every one but ``/health`` needs ``Authorization: Bearer TOKEN``):

=========================  ==================================================
``GET  /health``           liveness, job counts, rounds run
``POST /jobs``             submit a job spec; 201 with the stored job
``GET  /jobs``             all jobs (``?state=standby&state=running``, ``?user=``)
``GET  /jobs/{id}``        one job, with its allocation and processes
``DELETE /jobs/{id}``      cancel: the owner or an admin
``GET  /jobs/{id}/logs``   the job's stdout+stderr (``?tail=BYTES``): owner or admin
``GET  /jobs/{id}/events`` its history
``GET  /nodes``            nodes with used/total GPUs, cores, memory
``POST /tokens``           admin only: a new token for a user
=========================  ==================================================

The operator's endpoints (``/metrics``, ``/history``, ``/cluster``, the
dashboard at ``/``, the OpenAPI page ``/docs`` with local assets) are in
:mod:`.ops_api`.  Times in job JSON are ISO 8601 (UTC).

Design decisions:

* **Validation is Pydantic's**: unknown or malformed fields get a 422 whose
  ``detail`` names the field (``loc``).  A job that can never fit the cluster
  gets a 422 in the same shape (``type: never_fits``) with the reason.
* **Acknowledged = committed**: ``POST /jobs`` answers only after the store
  committed the job (see :mod:`.store`).
* **Tokens** are random 32-byte url-safe strings; the store keeps only their
  sha256.  The admin token is created on first start and written to
  ``STATE_DIR/admin.token`` with mode 0600.  A user token submits as its user;
  an admin may submit on behalf of another user (``user`` field).
* Endpoints are plain ``def`` functions: FastAPI runs them in its thread pool,
  and the store serialises writers.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.lifecycle import JobState
from .admission import NotFound, PermissionDenied, SubmitError
from .deps import parse_array, parse_dependency
from .history import array_label, iso, short_state
from .service import ACTIVE_STATES, FINAL_STATES, HOLDING, Service
from .specs import parse_duration, parse_mem
from .store import JobRow, Store

TOKEN_FILE = "admin.token"
MAX_LOG_BYTES = 8 << 20  # /logs returns at most the last 8 MiB
USER_RE = r"^[A-Za-z0-9_.@-]{1,64}$"


class JobSubmit(BaseModel):
    """A job spec as submitted (YAML/JSON ``gpuloom submit`` files have the same keys)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("job", min_length=1, max_length=200)
    command: str = Field(min_length=1, max_length=100_000)
    gpus: int = Field(ge=1, le=100_000)
    cpus: int | None = Field(None, ge=0, le=1_000_000)
    mem: int | float | str | None = None  # "8G", "512M", or MB
    model: str | None = Field(None, max_length=200)
    profile: bool | dict[str, Any] | None = None  # true/false: ask for / opt out of profiling
    checkpoint_dir: str | None = Field(None, max_length=4096)
    time_limit: float | str | None = None  # seconds or Slurm time (1:30:00)
    user: str | None = Field(None, pattern=USER_RE)
    env: dict[str, str] | None = None
    workdir: str | None = Field(None, max_length=4096)
    priority: int | None = None
    batch_size: int | None = Field(None, ge=1)
    throughput: dict[str, float] | list[float] | None = None  # scaling curve f(gpus) in it/s (elastic sizing)
    min_gpus: int | None = Field(None, ge=1)
    resource_times: list[float] | None = Field(None, min_length=1, max_length=8)  # s/iteration per stage (Muri)
    iteration_time: float | None = Field(None, gt=0)  # seconds per iteration (Muri)
    iterations: int | None = Field(None, ge=1)  # with iteration_time: the work estimate (SJF/SRTF orders)
    array: str | None = Field(None, max_length=200)  # job array: "0-9", "1,3,5-7", "0-15:4", "0-9%2"
    dependency: str | None = Field(None, max_length=2000)  # "afterok:5", "afterany:5:6,afterok:7_2"

    @field_validator("array")
    @classmethod
    def _array(cls, v: str | None) -> str | None:
        if v is not None:
            parse_array(v)
        return v

    @field_validator("dependency")
    @classmethod
    def _dependency(cls, v: str | None) -> str | None:
        if v is not None:
            parse_dependency(v)
        return v

    @field_validator("resource_times")
    @classmethod
    def _stages(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and any(not (x >= 0) for x in v):
            raise ValueError("resource_times must be >= 0 seconds per iteration")
        return v

    @field_validator("throughput")
    @classmethod
    def _curve(cls, v: Any) -> Any:
        vals = v.values() if isinstance(v, dict) else (v or [])
        if any(not (x >= 0) for x in vals):
            raise ValueError("throughput values must be >= 0 iterations/s")
        return v

    @field_validator("profile")
    @classmethod
    def _profile(cls, v: Any) -> Any:
        if isinstance(v, dict):
            from ..perf.profile_record import profile_from_record

            try:
                if profile_from_record("profile", v) is None:
                    raise ValueError("an inline profile needs status ok (or none)")
            except ValueError as e:  # SensitivityError
                raise ValueError(str(e)) from None
        return v

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: Any) -> Any:
        return None if v is None else parse_mem(v, "mem")

    @field_validator("time_limit")
    @classmethod
    def _tl(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v, "time_limit")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        for k in v:
            if not k or "=" in k or k.startswith("GPULOOM_") or k == "CUDA_VISIBLE_DEVICES":
                raise ValueError(f"environment variable name {k!r} is not allowed")
        return v

    @field_validator("checkpoint_dir", "workdir")
    @classmethod
    def _abs(cls, v: str | None) -> str | None:
        if v is not None and not os.path.isabs(v):
            raise ValueError(f"must be an absolute path, got {v!r}")
        return v

    def to_spec(self) -> dict[str, Any]:
        d = self.model_dump(exclude_none=True)
        if "mem" in d:
            d["mem_mb"] = d.pop("mem")
        return d


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str = Field(pattern=USER_RE)
    admin: bool = False


def job_json(row: JobRow, live_progress: int | None = None, now: float | None = None) -> dict[str, Any]:
    """A job as the API returns it; ``now`` (wall seconds) adds the live ``held_s`` of a running job."""
    s = row.spec
    nodes = [p["node"] for p in (row.alloc or {}).get("parts", [])]
    held = row.held_time
    if now is not None and row.alloc and row.last_start is not None and row.end_time is None:
        held += max(0.0, now - row.last_start)
    return {
        "id": row.id,
        "name": row.name,
        "user": row.user,
        "state": row.state,
        "st": short_state(row.state),
        "pending_reason": row.pending_reason,
        "queue": str(s.get("queue") or ""),
        "array": array_label(row),
        "array_id": row.array_id,
        "array_task": row.array_task,
        "dependency": s.get("dependency"),
        "gpus": s.get("gpus"),
        "cpus": s.get("cpus"),
        "mem_mb": s.get("mem_mb"),
        "command": s.get("command"),
        "model": s.get("model"),
        "time_limit": s.get("time_limit"),
        "submit_time": iso(row.submit_time),
        "first_start": iso(row.first_start),
        "last_start": iso(row.last_start),
        "end_time": iso(row.end_time),
        "nodes": nodes,
        "alloc": row.alloc,
        "procs": row.procs,
        "attempts": row.attempts,
        "resume_count": row.resume_count,
        "preemptions": row.preemptions,
        "held_time": row.held_time,
        "held_s": held,
        "checkpoint_dir": row.checkpoint_dir,
        "progress": live_progress if live_progress is not None else row.progress,
        "exit_code": row.exit_code,
        "reason": row.reason,
        "cancel_requested": row.cancel_requested,
    }


def ensure_admin_token(store: Store, state_dir: str | Path) -> str:
    """The admin token from ``STATE_DIR/admin.token`` (mode 0600), created on first start."""
    path = Path(state_dir) / TOKEN_FILE
    if path.exists():
        token = path.read_text().strip()
        if token and store.lookup_token(token) is None:
            store.add_token(token, "admin", admin=True)
        if token:
            os.chmod(path, 0o600)
            return token
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    store.add_token(token, "admin", admin=True)
    return token


def create_token(store: Store, user: str, admin: bool = False) -> str:
    token = secrets.token_urlsafe(32)
    store.add_token(token, user, admin)
    return token


#: declared in the OpenAPI document, so ``/docs`` has an Authorize button
bearer = HTTPBearer(auto_error=False, description="A token from `gpuloom token create USER` (or STATE_DIR/admin.token).")


def _auth(request: Request,
          creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None) -> tuple[str, bool]:
    """(user, is_admin) for the request's bearer token, or 401."""
    if creds is None or creds.scheme.lower() != "bearer":
        raise HTTPException(401, "missing token: send 'Authorization: Bearer TOKEN'", headers={"WWW-Authenticate": "Bearer"})
    who = request.app.state.service.store.lookup_token(creds.credentials.strip())
    if who is None:
        raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
    return who


Auth = Annotated[tuple[str, bool], Depends(_auth)]


def create_app(service: Service) -> FastAPI:
    """The API over a (started or not) :class:`Service`."""
    from .. import __version__

    app = FastAPI(title="gpuloom", version=__version__, docs_url=None, redoc_url=None,
                  description="The scheduler service's API.  Authorize with a bearer token "
                              "(`gpuloom token create USER`, or the admin token in the state directory).")
    app.state.service = service
    store = service.store

    def as_json(row: JobRow) -> dict[str, Any]:
        # a job holding a process: its progress now, from its log; else what was stored when it stopped
        live = service.last_progress(row.id) if row.state in HOLDING else None
        return job_json(row, live, service.clock.time())

    def get_row(job_id: int) -> JobRow:
        row = store.get_job(job_id)
        if row is None:
            raise HTTPException(404, f"no job {job_id}")
        return row

    @app.exception_handler(SubmitError)
    def _refused(_req: Request, e: SubmitError) -> JSONResponse:
        return JSONResponse(
            status_code=422,
            content={"detail": [{"loc": ["body", e.field or "spec"], "msg": str(e), "type": e.kind}]},
        )

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "rounds": service.rounds,
            "active_jobs": store.count_jobs(ACTIVE_STATES),
            "gpus": service.cluster.num_gpus,
            "nodes": service.cluster.num_nodes,
            "scheduler": service.scheduler.names,
        }

    @app.post("/jobs", status_code=201)
    def submit(body: JobSubmit, who: Auth) -> dict[str, Any]:
        t0 = time.perf_counter()
        user, admin = who
        spec = body.to_spec()
        owner = spec.pop("user", None) or user
        if owner != user and not admin:
            raise HTTPException(403, f"token of {user!r} cannot submit as {owner!r}")
        jid = service.submit(spec, owner)
        service.telemetry.submit_seconds.observe(time.perf_counter() - t0)
        return job_json(get_row(jid))

    @app.get("/jobs")
    def list_jobs(
        who: Auth,
        state: Annotated[list[JobState] | None, Query()] = None,
        user: Annotated[str | None, Query(pattern=USER_RE)] = None,
    ) -> list[dict[str, Any]]:
        states = [s.value for s in state] if state else None
        return [as_json(r) for r in store.list_jobs(states, user=user)]

    @app.get("/jobs/{job_id}")
    def get_job(job_id: int, who: Auth) -> dict[str, Any]:
        return as_json(get_row(job_id))

    @app.delete("/jobs/{job_id}")
    def cancel(job_id: int, who: Auth) -> dict[str, Any]:
        user, admin = who
        try:
            row = service.cancel(job_id, user, admin)
        except NotFound:
            raise HTTPException(404, f"no job {job_id}") from None
        except PermissionDenied as e:
            raise HTTPException(403, str(e)) from None
        return job_json(row)

    @app.get("/jobs/{job_id}/logs", response_class=PlainTextResponse)
    def logs(job_id: int, who: Auth, tail: Annotated[int | None, Query(ge=1)] = None,
             offset: Annotated[int | None, Query(ge=0, description="Read from this byte (for -f).")] = None,
             ) -> PlainTextResponse:
        """The log's last ``tail`` bytes, or the bytes from ``offset``; header ``X-Log-Offset``: where
        the text returned ends (the next ``offset``)."""
        user, admin = who
        row = get_row(job_id)
        if not admin and row.user != user:
            raise HTTPException(403, f"job {job_id} belongs to {row.user}")
        path = service.log_path(job_id)
        if not path.exists():
            return PlainTextResponse("", headers={"X-Log-Offset": "0"})
        with open(path, "rb") as f:
            size = path.stat().st_size
            start = offset if offset is not None else max(0, size - min(tail or MAX_LOG_BYTES, MAX_LOG_BYTES))
            f.seek(min(start, size))
            data = f.read(MAX_LOG_BYTES)
        if offset is not None and data and row.state not in FINAL_STATES:  # following: whole lines only
            cut = data.rfind(b"\n") + 1
            data = data[:cut] if cut else (data if len(data) == MAX_LOG_BYTES else b"")
        return PlainTextResponse(data.decode(errors="replace"), headers={"X-Log-Offset": str(min(start, size) + len(data))})

    @app.get("/jobs/{job_id}/events")
    def job_events(job_id: int, who: Auth) -> list[dict[str, Any]]:
        get_row(job_id)
        return [{**e, "time": iso(e["time"])} for e in store.events(job_id)]

    @app.get("/nodes")
    def nodes(who: Auth) -> list[dict[str, Any]]:
        return service.nodes()

    @app.post("/tokens", status_code=201)
    def tokens(body: TokenCreate, who: Auth) -> dict[str, Any]:
        if not who[1]:
            raise HTTPException(403, "only an admin may create tokens")
        return {"user": body.user, "admin": body.admin, "token": create_token(store, body.user, body.admin)}

    from .ops_api import mount

    mount(app, service, _auth)
    return app
