"""The HTTP API of ``gpuloom serve`` (FastAPI).

Endpoints (JSON; every one but ``/health`` and ``/ready`` needs ``Authorization: Bearer TOKEN``):

=========================  ==================================================
``GET  /health``           liveness (memory only): job counts, rounds run
``GET  /ready``            readiness: store, lock, rounds (503 naming what fails;
                           :mod:`..service.health`)
``POST /jobs``             submit a job spec; 201 with the stored job
``GET  /jobs``             jobs (``?state=standby&state=running``, ``?user=``, ``?since=``,
                           pages: ``?limit=&after=``, ``?fields=id,st``); others' without command
                           and paths
``GET  /jobs/stream``      all those jobs in one response of JSON lines (:mod:`.listing`)
``GET  /jobs/{id}``        one job, with its allocation and processes
``DELETE /jobs/{id}``      cancel: the owner or an admin
``GET  /jobs/{id}/logs``   the job's stdout+stderr (``?tail=BYTES``): owner or admin
``GET  /jobs/{id}/events`` its history
``GET  /nodes``            nodes with used/total GPUs, cores, memory, state and reason
                           (drain, maintenance and job control: :mod:`.control`)
``POST /tokens``           admin only: a new token for a user (``expires``: 30d)
``GET  /tokens``           tokens (ids, users, expiry): all for an admin, else one's own
``DELETE /tokens/{id}``    revoke a token: one's own, or any for an admin
``/queues``...             queues: usage vs quota, admin changes (:mod:`..api.queues`)
=========================  ==================================================

The operator's endpoints (``/metrics``, ``/history``, ``/cluster``, the
dashboard at ``/``, the OpenAPI page ``/docs`` with local assets) are in
:mod:`..api.ops`.  Times in job JSON are ISO 8601 (UTC).

Design decisions:

* **Validation is Pydantic's** (the bodies: :mod:`.bodies`; a job's JSON:
  :mod:`.jobjson`): unknown or malformed fields get a 422 whose
  ``detail`` names the field (``loc``).  A job that can never fit the cluster
  gets a 422 in the same shape (``type: never_fits``) with the reason.
* **Acknowledged = committed**: ``POST /jobs`` answers only after the store
  committed the job (see :mod:`..state.store`).
* **Tokens** are random 32-byte url-safe strings; the store keeps only their
  sha256.  The admin token is created on first start and written to
  ``STATE_DIR/admin.token`` with mode 0600.  A user token submits as its user;
  an admin may submit on behalf of another user (``user`` field).
* Endpoints are plain ``def`` functions: FastAPI runs them in its thread pool,
  and the store serialises writers.
* **Limits and privacy**: bodies over 1 MiB get 413, every field is bounded,
  a 422 never echoes its input (:mod:`.limits`); users see other users' jobs
  without command, paths and process ids (:mod:`.privacy`).  ``POST /jobs``
  with an ``Idempotency-Key`` header is done once: a retry with the same key
  gets the same job (200).
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import InterfaceError, OperationalError

from ...core.lifecycle import JobState
from ...core.queues import QueueError
from ..exec import joblogs
from ..service.admission import LimitExceeded
from ..service.errors import NotFound, PermissionDenied, SubmitError
from ..service.health import liveness, readiness
from ..service.queues import QueueDenied
from ..service.service import FINAL_STATES, HOLDING, Service
from ..state import audit
from ..state.history import iso
from ..state.store import JobRow, Store, StoreFull
from ..state.tokens import create_token as _create_token
from ..state.tokens import list_tokens, revoke_token
from .bodies import USER_RE, JobSubmit, TokenCreate
from .jobjson import JOB_FIELDS, job_fields, job_json
from .limits import MAX_ID, MAX_PAGE, BodyLimit, validation_error
from .privacy import redact_events, redact_job
from .queues import add_queue_routes

__all__ = ["JOB_FIELDS", "USER_RE", "JobSubmit", "TokenCreate", "create_app", "create_token", "ensure_admin_token",
           "job_fields", "job_json"]

log = logging.getLogger("gpuloom.service")
TOKEN_FILE = "admin.token"
MAX_LOG_BYTES = 8 << 20  # /logs returns at most the last 8 MiB


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


def create_token(store: Store, user: str, admin: bool = False, expires_in: float | None = None) -> str:
    return _create_token(store, user, admin, expires_in)


#: declared in the OpenAPI document, so ``/docs`` has an Authorize button
bearer = HTTPBearer(auto_error=False, description="A token from `gpuloom token create USER` (or STATE_DIR/admin.token).")


def _auth(request: Request,
          creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None) -> tuple[str, bool]:
    """(user, is_admin) for the request's bearer token, or 401."""
    if creds is None or creds.scheme.lower() != "bearer":
        raise HTTPException(401, "missing token: send 'Authorization: Bearer TOKEN'", headers={"WWW-Authenticate": "Bearer"})
    token = creds.credentials.strip()
    who = request.app.state.service.store.lookup_token(token) if len(token) <= 256 else None
    if who is None:
        raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
    request.state.user = who[0]  # (for the access log: the user, never the token)
    return who


Auth = Annotated[tuple[str, bool], Depends(_auth)]
JobId = Annotated[int, PathParam(ge=1, le=MAX_ID)]


def create_app(service: Service) -> FastAPI:
    """The API over a (started or not) :class:`Service`."""
    from ... import __version__

    app = FastAPI(title="gpuloom", version=__version__, docs_url=None, redoc_url=None,
                  description="The scheduler service's API.  Authorize with a bearer token "
                              "(`gpuloom token create USER`, or the admin token in the state directory).")
    app.state.service = service
    app.add_middleware(BodyLimit)
    app.add_exception_handler(RequestValidationError, validation_error)
    store = service.store

    def as_json(row: JobRow, who: tuple[str, bool] | None = None) -> dict[str, Any]:
        # a job holding a process: its progress now, from its log; else what was stored when it stopped
        live = service.last_progress(row.id) if row.state in HOLDING else None
        d = job_json(row, live, service.clock.time())
        return d if who is None else redact_job(d, who[0], who[1])

    def get_row(job_id: int) -> JobRow:
        row = store.get_job(job_id)
        if row is None:
            raise HTTPException(404, f"no job {job_id}")
        return row

    @app.exception_handler(LimitExceeded)
    def _over(_req: Request, e: LimitExceeded) -> JSONResponse:
        return JSONResponse(status_code=e.status, content={"detail": str(e)}, headers=e.headers)

    @app.exception_handler(SubmitError)
    def _refused(_req: Request, e: SubmitError) -> JSONResponse:
        return JSONResponse(
            status_code=422,
            content={"detail": [{"loc": ["body", e.field or "spec"], "msg": str(e), "type": e.kind}]},
        )

    @app.exception_handler(StoreFull)
    def _full(_req: Request, e: StoreFull) -> JSONResponse:  # any write while the state disk is full
        return JSONResponse(status_code=503, content={"detail": str(e)}, headers={"Retry-After": "60"})

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    def _store_down(_req: Request, e: Exception) -> JSONResponse:  # the database unreachable, restarting
        log.warning("the store cannot answer a request: %s", str(e).splitlines()[0] if str(e) else type(e).__name__)
        return JSONResponse(status_code=503, content={"detail": "the database cannot be reached; retry later"},
                            headers={"Retry-After": "10"})

    @app.get("/health")
    def health() -> dict[str, Any]:
        """Liveness: the process answers (memory only: 200 while the database is down)."""
        return liveness(service)

    @app.get("/ready")
    def ready(response: Response) -> dict[str, Any]:
        """Readiness: the store answers and takes records, this server holds its lock, rounds run (503
        naming what fails)."""
        ok, body = readiness(service)
        if not ok:
            response.status_code = 503
        return body

    @app.post("/jobs", status_code=201)
    def submit(body: JobSubmit, who: Auth, response: Response,
               idempotency_key: Annotated[str | None, Header(max_length=200, pattern=r"^[\x21-\x7e]+$")] = None,
               ) -> dict[str, Any]:
        t0 = time.perf_counter()
        user, admin = who
        service.limits.rate(user, admin)  # 429 over the user's submissions per second (:mod:`..service.admission`)
        spec = body.to_spec()
        owner = spec.pop("user", None) or user
        if owner != user and not admin:
            raise HTTPException(403, f"token of {user!r} cannot submit as {owner!r}")
        if spec.get("reservation"):
            from .reservations import check_submit

            check_submit(store, spec["reservation"], owner)  # 422 unknown, 403 not one of its users
        try:
            spec = service.queues.assign(spec, owner, admin)
        except QueueDenied as e:  # a queue not open to the user, a priority above its limit
            raise HTTPException(403, str(e)) from None
        except QueueError as e:
            raise HTTPException(422, [{"loc": ["body", "queue"], "msg": str(e), "type": "no_queue"}]) from None
        with service.limits.admitting(store, spec, owner, admin, idempotency_key, service.queues.check_pending):
            row = None
            if idempotency_key is None:  # (its row read back under the insert's hold of the store's lock)
                row = service.submit_row(spec, owner, user)
            else:  # a retry with the same key gets the job the first attempt created
                jid, new = service.submit_once(spec, owner, idempotency_key, user)
                if not new:
                    response.status_code = 200
        service.telemetry.submit_seconds.observe(time.perf_counter() - t0)
        return job_json(row if row is not None else get_row(jid))

    @app.get("/jobs")
    def list_jobs(
        who: Auth,
        response: Response,
        state: Annotated[list[JobState] | None, Query(max_length=len(JobState))] = None,
        user: Annotated[str | None, Query(pattern=USER_RE)] = None,
        since: Annotated[float | None, Query(ge=0, le=1e11, allow_inf_nan=False)] = None,
        after: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1000,
        fields: Annotated[str | None, Query(max_length=1000)] = None,
    ) -> list[dict[str, Any]]:
        """Jobs by id, filtered by state, user and time (``since``, Unix seconds: jobs not ended before it,
        like sacct's start time); a page of at most ``limit`` after id ``after``.  A full page names the
        next one in ``X-Next-After``; ``X-Total-Count`` says how many jobs the filters match, on every page.
        ``fields=id,name,st``: only those fields of each job."""
        keys = job_fields(fields)
        states = [s.value for s in state] if state else None
        rows = store.list_jobs(states, user=user, after_id=after, since=since, limit=limit)
        if len(rows) == limit:
            response.headers["X-Next-After"] = str(rows[-1].id)
        response.headers["X-Total-Count"] = str(store.count_jobs(states, user=user, since=since))
        jobs = [as_json(r, who) for r in rows]
        return jobs if keys is None else [{k: j[k] for k in keys} for j in jobs]

    @app.get("/jobs/stream", response_class=StreamingResponse)
    def stream_jobs(
        who: Auth,
        state: Annotated[list[JobState] | None, Query(max_length=len(JobState))] = None,
        user: Annotated[str | None, Query(pattern=USER_RE)] = None,
        since: Annotated[float | None, Query(ge=0, le=1e11, allow_inf_nan=False)] = None,
        fields: Annotated[str | None, Query(max_length=1000)] = None,
    ) -> StreamingResponse:
        """Every job ``GET /jobs`` would list with these filters, in one response of JSON lines:
        ``{"fields": [...]}``, then blocks of jobs (each job a list of its values in that order), then
        ``{"end": COUNT}`` (:mod:`.listing`)."""
        from .listing import job_lines

        def live(jid: int, st: str) -> int | None:
            return service.last_progress(jid) if st in HOLDING else None

        lines = job_lines(store, job_fields(fields) or list(JOB_FIELDS), who, service.clock.time, live,
                          [s.value for s in state] if state else None, user, since)
        first = next(lines)  # (a store that cannot answer: 503 now, not a broken stream)
        return StreamingResponse(itertools.chain([first], lines), media_type="application/x-ndjson")

    @app.get("/jobs/{job_id}")
    def get_job(job_id: JobId, who: Auth) -> dict[str, Any]:
        from ..service.starts import job_start  # queue position and estimated start (a waiting job)

        return {**as_json(get_row(job_id), who), **job_start(service, job_id)}

    @app.delete("/jobs/{job_id}")
    def cancel(job_id: JobId, who: Auth) -> dict[str, Any]:
        user, admin = who
        try:
            row = service.cancel(job_id, user, admin)
        except NotFound:
            raise HTTPException(404, f"no job {job_id}") from None
        except PermissionDenied as e:
            raise HTTPException(403, str(e)) from None
        return job_json(row)

    @app.get("/jobs/{job_id}/logs", response_class=PlainTextResponse)
    def logs(job_id: JobId, who: Auth, tail: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
             offset: Annotated[int | None, Query(ge=0, le=MAX_ID, description="Read from this byte (for -f).")] = None,
             ) -> StreamingResponse:
        """The log's last ``tail`` bytes, or the bytes from ``offset``; header ``X-Log-Offset``: where
        the text returned ends (the next ``offset``)."""
        user, admin = who
        row = get_row(job_id)
        if not admin and row.user != user:
            raise HTTPException(403, f"job {job_id} belongs to {row.user}")
        # offsets count the bytes the job wrote, so a cut of the log does not move them; streamed a
        # chunk at a time: a request costs the server one chunk of memory whatever the log holds
        path = service.log_path(job_id)
        following = offset is not None and row.state not in FINAL_STATES  # whole lines only
        start, end = joblogs.span(path, tail, offset, MAX_LOG_BYTES, whole_lines=following)
        return StreamingResponse(joblogs.text(path, start, end), media_type="text/plain; charset=utf-8",
                                 headers={"X-Log-Offset": str(end)})

    @app.get("/jobs/{job_id}/events")
    def job_events(job_id: JobId, who: Auth) -> list[dict[str, Any]]:
        row = get_row(job_id)
        events = [{**e, "time": iso(e["time"])} for e in store.events(job_id)]
        return redact_events(events, row.user, who[0], who[1])

    @app.get("/nodes")
    def nodes(who: Auth) -> list[dict[str, Any]]:
        return service.nodes()

    @app.post("/tokens", status_code=201)
    def tokens(body: TokenCreate, who: Auth) -> dict[str, Any]:
        if not who[1]:
            raise HTTPException(403, "only an admin may create tokens")
        exp = body.expires  # already seconds (parsed)
        token = create_token(store, body.user, body.admin, None if exp is None else float(exp))
        audit.token_created(store, who[0], body.user, token, body.admin, None if exp is None else float(exp))
        return {"user": body.user, "admin": body.admin, "token": token, "expires_in": exp}

    @app.get("/tokens")
    def tokens_list(who: Auth) -> list[dict[str, Any]]:
        """Tokens (never their secret): every one for an admin, one's own otherwise."""
        return list_tokens(store, None if who[1] else who[0])

    @app.delete("/tokens/{token_id}")
    def tokens_revoke(token_id: Annotated[str, PathParam(max_length=64)], who: Auth) -> dict[str, Any]:
        owner = audit.token_owner(store, token_id)
        if not revoke_token(store, token_id, None if who[1] else who[0]):
            raise HTTPException(404, f"no token {token_id[:64]!r}" + ("" if who[1] else " of yours"))
        audit.record(store, who[0], "token.revoke", owner, token_id)
        return {"id": token_id, "revoked": True}

    from .ops import mount

    mount(app, service, _auth)
    from .audit import mount as mount_audit

    mount_audit(app, service, _auth)  # GET /audit
    from .starts import mount as mount_starts

    mount_starts(app, service, _auth)  # GET /starts
    from .reservations import mount as mount_reservations

    mount_reservations(app, service, _auth)  # /reservations
    from .control import mount as mount_control

    mount_control(app, service, _auth)  # node drain/resume/maintenance, POST /jobs/actions
    add_queue_routes(app, _auth)  # GET/PUT/DELETE /queues..., PUT /users/{user}/queue, PUT /queue-default
    return app
