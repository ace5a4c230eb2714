"""The operator's endpoints, mounted on the API by :func:`mount`.

=============================  =================================================
``GET /metrics``               Prometheus text format (:mod:`..service.telemetry`)
``GET /whoami``                the token's user and admin flag
``GET /cluster``               nodes x GPUs: who holds each, allocated / busy
``GET /stats/series``          stored samples: GPUs allocated / busy, jobs
                               pending / running, per queue (``?since=&step=``)
``GET /history``               accounting records (:mod:`..state.history`), ``?user=
                               &state=&since=&until=&allocations=true``, paged
                               like ``/jobs``: ``?limit=&after=``, ``X-Next-After``
``GET /history/trace``         finished jobs as a replayable trace (:mod:`..state.export`)
``GET /jobs/{id}/allocations`` what the job held, from when to when
``GET /jobs/{id}/progress``    its ``GPULOOM_PROGRESS`` points (owner or admin)
``GET /jobs/{id}/gpus``        its GPUs' NVML readings now, and its totals
``GET /``                      the dashboard (:mod:`.dashboard`)
``GET /docs``                  the OpenAPI page, its assets served from here
=============================  =================================================

Every endpoint but the static pages needs a bearer token, like the rest of
the API; ``/metrics`` too (Prometheus sends one with ``authorization:``
``credentials_file:`` in its scrape config, see ``docs/operations.md``).
"""

# (no ``from __future__ import annotations``: the endpoints' annotations name a dependency made in mount())
import importlib.resources
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import Field

from ...core.lifecycle import SHORT_STATE, JobState
from ...core.units import parse_wall_time
from ..exec import joblogs
from ..exec.progress import scan
from ..service.series import downsample
from ..service.service import Service
from ..state import gpudb
from ..state.gpudb import COARSE_S
from ..state.history import HISTORY_PAGE, MAX_HISTORY_PAGE, history, iso, span_json
from .limits import MAX_ID

DASHBOARD = Path(__file__).parent / "dashboard"
MAX_PROGRESS_BYTES = 4 << 20  # progress points are read from the log's last 4 MiB
MAX_POINTS = 2000


def states_of(names: list[str] | None) -> list[str] | None:
    """Lifecycle states for names given as states (``running``) or Slurm codes (``R``, ``PD``...)."""
    if not names:
        return None
    out: list[str] = []
    for n in names:
        for part in n.split(","):
            p = part.strip()
            if not p:
                continue
            code = [s.value for s, c in SHORT_STATE.items() if c == p.upper()]
            if code:
                out.extend(code)
                continue
            try:
                out.append(JobState(p.lower()).value)
            except ValueError:
                raise HTTPException(422, f"state: unknown state {p!r} (use a lifecycle state or one of "
                                         f"{', '.join(sorted(set(SHORT_STATE.values())))})") from None
    return out


def progress_points(path: Path) -> list[dict[str, Any]]:
    """``[{"t": unix seconds or None, "iter": n}, ...]`` from a log's progress lines in its last
    MAX_PROGRESS_BYTES (at most MAX_POINTS; read a chunk at a time, thinned as they come)."""
    end = joblogs.logical_size(path)
    if end is None:
        return []
    pts: list[dict[str, Any]] = []
    last = None
    for p in scan(path, max(0, end - MAX_PROGRESS_BYTES)):
        last = {"t": p.t, "iter": p.iter}
        pts.append(last)
        if len(pts) >= 4 * MAX_POINTS:  # every other one: memory stays bounded whatever the log holds
            pts = pts[::2]
    if last is not None and pts[-1] is not last:
        pts.append(last)
    if len(pts) > MAX_POINTS:
        step = len(pts) / MAX_POINTS
        pts = [pts[int(i * step)] for i in range(MAX_POINTS - 1)] + [pts[-1]]
    return pts


def reading_json(got: Any) -> dict[str, Any]:
    """A GPU's last NVML reading for ``/cluster`` (nothing where it is not sampled)."""
    if got is None:
        return {}
    r = got[0]
    return {"util": r.util, "mem_used_mb": round(r.mem_used_mb, 1), "mem_total_mb": round(r.mem_total_mb, 1),
            "power_w": r.power_w, "temp_c": r.temp_c}


def mount(app: FastAPI, service: Service, auth: Callable[..., tuple[str, bool]]) -> None:
    Auth = Annotated[tuple[str, bool], Depends(auth)]
    store = service.store
    tel = service.telemetry

    def now() -> float:
        return service.clock.time()

    def owned(job_id: int, who: tuple[str, bool]) -> None:
        row = store.get_job(job_id)
        if row is None:
            raise HTTPException(404, f"no job {job_id}")
        if not who[1] and row.user != who[0]:
            raise HTTPException(403, f"job {job_id} belongs to {row.user}")

    @app.get("/metrics", tags=["operations"])
    def metrics(who: Auth) -> Response:
        """Prometheus text format: GPUs per node, jobs by state and queue, round and latency histograms."""
        return Response(tel.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/whoami", tags=["operations"])
    def whoami(who: Auth) -> dict[str, Any]:
        return {"user": who[0], "admin": who[1]}

    @app.get("/cluster", tags=["operations"])
    def cluster(who: Auth) -> dict[str, Any]:
        """Per node and GPU: the jobs holding it (co-runners share one), and whether they progress."""
        cl = service.cluster
        current = dict(service.driver.current)
        rows = dict(service.mirror.rows)
        use = tel.gpu_use()
        holders: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for jid, a in current.items():
            row = rows.get(jid)
            who_ = {"id": int(jid), "user": row.user if row else None, "name": row.name if row else None}
            for p in a.parts:
                name = cl.nodes[p.node].name
                for g in p.gpus:
                    holders.setdefault((name, cl.local_index(g)), []).append(who_)
        nodes = []
        for n, info in zip(cl.nodes, service.nodes(), strict=True):
            slots = []
            for g in range(n.gpus):
                state = "busy" if g in use["busy"][n.name] else "allocated" if g in use["allocated"][n.name] else "idle"
                slots.append({"gpu": g, "state": state, "jobs": holders.get((n.name, g), []),
                              **reading_json(tel.gpus.gpus.get((n.name, g)))})
            nodes.append({**info, "slots": slots, "gpus_allocated": len(use["allocated"][n.name]),
                          "gpus_busy": len(use["busy"][n.name])})
        s = tel.sample()
        return {"nodes": nodes, "time": iso(s["time"]), "gpus": s["gpus"], "gpus_allocated": s["allocated"],
                "gpus_busy": s["busy"], "jobs_pending": s["pending"], "jobs_running": s["running"]}

    @app.get("/stats/series", tags=["operations"])
    def series(who: Auth, since: Annotated[str | None, Query(description="ISO time, Unix seconds or an age (1h)")]
               = None, step: Annotated[float | None, Query(gt=0, le=86400, description="seconds per point "
                                                             "(default: every sample, at most 2000 points)")] = None
               ) -> list[dict[str, Any]]:
        """The cluster over time, stored: GPUs allocated / busy, jobs pending / running, GPUs used per queue.
        Samples are 2 s apart for the last 24 hours, 5-minute means for 30 days; ``step`` averages them
        (from 300 s on, over the 5-minute means)."""
        t0 = _time(since, "since")
        t0 = now() - 3600.0 if t0 is None else t0
        pts = tel.series.read(t0, coarse=step is not None and step >= COARSE_S)
        if step is None and len(pts) > MAX_POINTS:
            step = (pts[-1]["time"] - pts[0]["time"]) / (MAX_POINTS - 1) or None
        if step is not None:
            pts = downsample(pts, step)
        return [{**{k: v for k, v in p.items() if k != "step"}, "time": iso(p["time"])} for p in pts]

    def _time(v: str | None, where: str) -> float | None:
        if v is None:
            return None
        try:
            return parse_wall_time(v, now(), where, -1)
        except ValueError as e:
            raise HTTPException(422, str(e)) from None

    @app.get("/history", tags=["operations"])
    def hist(who: Auth, response: Response, user: Annotated[str | None, Query()] = None,
             state: Annotated[list[str] | None, Query(description="states or Slurm codes (CD, F, CA, ...)")] = None,
             since: Annotated[str | None, Query(description="jobs not ended before: ISO, Unix or an age (2h)")] = None,
             until: Annotated[str | None, Query(description="jobs submitted by: ISO, Unix or an age")] = None,
             allocations: bool = False,
             job: Annotated[list[Annotated[int, Field(ge=1, le=MAX_ID)]] | None,
                            Query(max_length=1000, description="only these job ids")] = None,
             after: Annotated[int | None, Query(ge=0, le=MAX_ID, description="the page after this job id")] = None,
             limit: Annotated[int, Query(ge=1, le=MAX_HISTORY_PAGE, description="records per page")]
             = HISTORY_PAGE) -> list[dict[str, Any]]:
        """Accounting (like sacct): start, end, elapsed, GPU-hours, exit code; with the allocations held.  A page
        of at most ``limit`` records by job id after ``after``; a full page names the next in ``X-Next-After``."""
        recs = history(store, now(), user, states_of(state), _time(since, "since"), _time(until, "until"),
                       allocations, job, after, limit)
        if len(recs) == limit:
            response.headers["X-Next-After"] = str(recs[-1]["id"])
        return with_gpu_usage(recs)

    def with_gpu_usage(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Records with their jobs' NVML totals (None where no GPU of theirs was sampled)."""
        use = gpudb.job_usage(store, [r["id"] for r in recs])
        empty = dict.fromkeys(("gpu_util_mean", "gpu_util_max", "gpu_mem_max_mb", "gpu_energy_wh", "gpu_samples"))
        return [{**r, **use.get(r["id"], empty)} for r in recs]

    @app.get("/history/trace", tags=["operations"])
    def hist_trace(who: Auth, user: Annotated[str | None, Query()] = None,
                   since: Annotated[str | None, Query(description="jobs not ended before: ISO, Unix or an age")] = None,
                   until: Annotated[str | None, Query(description="jobs submitted by: ISO, Unix or an age")] = None,
                   job: Annotated[list[Annotated[int, Field(ge=1, le=MAX_ID)]] | None,
                                  Query(max_length=1000, description="only these job ids")] = None,
                   ) -> list[dict[str, Any]]:
        """The finished jobs as rows of gpuloom's JSONL trace format (:mod:`..state.export`), replayable in the simulator.

        Progress comes from the jobs' logs: a user who is not an admin gets only their own jobs."""
        from ..state.export import export_trace

        if not who[1]:
            if user is not None and user != who[0]:
                raise HTTPException(403, f"only an admin may export another user's jobs ({user})")
            user = who[0]
        return export_trace(store, service.actuator.log_dir, service.cluster, user, _time(since, "since"),
                            _time(until, "until"), job)

    @app.get("/jobs/{job_id}/allocations", tags=["operations"])
    def job_allocs(job_id: Annotated[int, PathParam(ge=1, le=MAX_ID)], who: Auth) -> list[dict[str, Any]]:
        if store.get_job(job_id) is None:
            raise HTTPException(404, f"no job {job_id}")
        return [span_json(a) for a in store.allocations([job_id])]

    @app.get("/jobs/{job_id}/gpus", tags=["operations"])
    def job_gpus(job_id: Annotated[int, PathParam(ge=1, le=MAX_ID)], who: Auth) -> dict[str, Any]:
        """NVML telemetry of the job: each GPU it holds at the last sample, and its totals so far."""
        if store.get_job(job_id) is None:
            raise HTTPException(404, f"no job {job_id}")
        series = [{"time": iso(t), "util": u, "mem_used_mb": round(m, 1)}
                  for t, u, m in list(tel.gpus.recent.get(str(job_id), ()))]
        return {"now": tel.gpus.job_now(str(job_id)), "total": gpudb.job_usage(store, [job_id]).get(job_id),
                "series": series}

    @app.get("/jobs/{job_id}/progress", tags=["operations"])
    def progress(job_id: Annotated[int, PathParam(ge=1, le=MAX_ID)], who: Auth) -> list[dict[str, Any]]:
        """The job's progress points, from its log (owner or admin)."""
        owned(job_id, who)
        return progress_points(service.log_path(job_id))

    # -- OpenAPI page with local assets ------------------------------------------------------------
    assets = importlib.resources.files("fastapi_offline") / "static"
    app.mount("/docs-assets", StaticFiles(directory=str(assets)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title="gpuloom API",
                                   oauth2_redirect_url="/docs/oauth2-redirect",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon.png",
                                   swagger_ui_parameters={"persistAuthorization": True})

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def docs_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    # -- the dashboard ---------------------------------------------------------------------------
    app.mount("/ui", StaticFiles(directory=str(DASHBOARD / "static")), name="dashboard")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(DASHBOARD / "index.html", media_type="text/html")
