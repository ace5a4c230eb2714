"""Property-based fuzzing of the HTTP API (hypothesis): no input gets a 500.

Every endpoint (the job API, tokens, and the operator's: history, series, cluster, metrics,
allocations, progress) gets generated input: job bodies with each field set to any JSON value (NaN, ±inf,
integers beyond 64 bits, NUL bytes and control characters, deep nesting, unknown keys), raw
bodies that are not JSON, query strings and path segments of any text, tokens of any shape.  The
answer must be a 2xx or a 4xx, never a 5xx, and the test reports how many requests it sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuloom.core.cluster import Cluster
from gpuloom.runtime.api.app import create_app, create_token, ensure_admin_token
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import own_cgroup_parent

FIELDS = ["name", "command", "gpus", "cpus", "mem", "model", "profile", "checkpoint_dir", "time_limit", "user",
          "env", "workdir", "priority", "batch_size", "throughput", "min_gpus", "resource_times", "iteration_time"]
NASTY_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["", "\x00", "a\x00b", "[/]", "\x1b[31m", "../../etc/passwd", "/etc/passwd", "8G", "8Gi", "512K", "-1G",
     "1e999", "NaN", "Infinity", "1:30:00", "2-00:00:00", "99999999999999999999", "true", "0", "/tmp/x"])
NUMBERS = (st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([0, 1, -1, 2**63, 2**64, 10**30, 1e308, -0.0]))
SCALARS = st.none() | st.booleans() | NUMBERS | NASTY_TEXT
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(NASTY_TEXT, inner, max_size=5),
                    max_leaves=12)
BODIES = st.fixed_dictionaries(
    {"command": st.sampled_from(["true", "sleep 1"]) | JSON, "gpus": st.sampled_from([1, 2]) | JSON},
    optional={f: JSON for f in FIELDS if f not in ("command", "gpus")} | {"extra": JSON},
)
COUNT = {"requests": 0, "5xx": 0}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict[str, str]]]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    parent = own_cgroup_parent()
    name = next(parent)
    store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
    cluster = Cluster.homogeneous(2, 4)
    svc = Service(store, cluster, local_executor(cluster, tmp / "run", True, name), Scheduler.from_names(),
                  ServiceConfig(tmp))
    tokens = {"admin": ensure_admin_token(store, tmp), "alice": create_token(store, "alice")}
    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        yield c, tokens
    svc.terminate_all()
    svc.shutdown()
    store.close()
    next(parent, None)


def _send(c: TestClient, method: str, path: str, **kw: Any) -> int:
    r = c.request(method, path, **kw)
    COUNT["requests"] += 1
    if r.status_code >= 500:
        COUNT["5xx"] += 1
    assert r.status_code < 500, (method, path, kw, r.status_code, r.text[:300])
    return r.status_code


def fuzz(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                    derandomize=True)


@pytest.mark.slow
def test_fuzz_api_never_answers_500(client: tuple[TestClient, dict[str, str]]) -> None:
    c, tokens = client
    hd = {"Authorization": f"Bearer {tokens['alice']}", "content-type": "application/json"}
    admin = {"Authorization": f"Bearer {tokens['admin']}", "content-type": "application/json"}

    @fuzz(500)
    @given(body=BODIES, as_admin=st.booleans(), key=st.none() | st.text(max_size=30))
    def submit(body: dict, as_admin: bool, key: str | None) -> None:
        headers = dict(admin if as_admin else hd)
        if key is not None and key.isascii() and key.isprintable():
            headers["Idempotency-Key"] = key
        _send(c, "POST", "/jobs", content=json.dumps(body, allow_nan=True), headers=headers)

    @fuzz(150)
    @given(raw=st.binary(max_size=200) | NASTY_TEXT.map(str.encode))
    def raw_body(raw: bytes) -> None:
        _send(c, "POST", "/jobs", content=raw, headers=hd)

    @fuzz(200)
    @given(segment=NASTY_TEXT | NUMBERS.map(str), method=st.sampled_from(["GET", "DELETE"]),
           sub=st.sampled_from(["", "/logs", "/events"]),
           params=st.dictionaries(st.sampled_from(["tail", "state", "user", "since", "after", "limit", "x"]),
                                  NASTY_TEXT | NUMBERS.map(str), max_size=4))
    def paths(segment: str, method: str, sub: str, params: dict) -> None:
        from urllib.parse import quote

        path = f"/jobs/{quote(segment, safe='')}{sub}"
        _send(c, method if not sub else "GET", path, params=params, headers=hd)
        _send(c, "GET", "/jobs", params=params, headers=hd)

    @fuzz(200)
    @given(path=st.sampled_from(["/history", "/history/trace", "/stats/series", "/cluster", "/whoami", "/metrics",
                                 "/nodes", "/health", "/tokens"]),
           sub=st.sampled_from(["allocations", "progress"]), segment=NASTY_TEXT | NUMBERS.map(str),
           params=st.lists(st.tuples(st.sampled_from(["since", "until", "state", "user", "job", "allocations", "x"]),
                                     NASTY_TEXT | NUMBERS.map(str)), max_size=5))
    def operations(path: str, sub: str, segment: str, params: list) -> None:
        from urllib.parse import quote

        _send(c, "GET", path, params=params, headers=hd)
        _send(c, "GET", path, params=params, headers=admin)
        _send(c, "GET", f"/jobs/{quote(segment, safe='')}/{sub}", params=params, headers=hd)

    @fuzz(100)
    @given(body=JSON, token=NASTY_TEXT, tid=NASTY_TEXT)
    def tokens_and_auth(body: Any, token: str, tid: str) -> None:
        from urllib.parse import quote

        _send(c, "POST", "/tokens", content=json.dumps(body, allow_nan=True), headers=admin)
        if token.isascii() and token.isprintable():
            _send(c, "GET", "/jobs", headers={"Authorization": f"Bearer {token}"})
        _send(c, "DELETE", f"/tokens/{quote(tid, safe='') or 'x'}", headers=hd)

    for run in (submit, raw_body, paths, operations, tokens_and_auth):
        run()
    print(f"\nAPI fuzz: {COUNT['requests']} requests, {COUNT['5xx']} answers of 5xx")
    assert COUNT["requests"] >= 1000 and COUNT["5xx"] == 0
