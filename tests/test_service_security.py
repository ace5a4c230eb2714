"""A service many users can share: one regression test (or more) per defect of the security review.

Numbered as in the review: 1 privilege (jobs as unprivileged accounts, private files, no server
environment), 2 one bad job stopping scheduling, 3 minimums and units, 4 one server per state,
5 launch recorded before the process, 6 failure exit records final, 7 size limits and listing,
8 names escaped in tables, 9 500s instead of 4xx, 10 the smaller ones.  Tests that switch OS
accounts need root (they create and delete their own accounts) and are skipped otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuloom.core.cluster import Cluster
from gpuloom.core.lifecycle import JobState
from gpuloom.runtime.api.app import create_app, create_token, ensure_admin_token
from gpuloom.runtime.exec.executor import ExecutorError, LaunchSpec
from gpuloom.runtime.exec.identity import Identities, IdentityError, creatable, lookup
from gpuloom.runtime.exec.local import LocalExecutor, NodeAgent
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.isolation import Backoff
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import JOB_PY, job_writable, ledger, stepper_cmd, wait_for

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="switching OS accounts needs root")


class Env:
    """An in-process service (no loop thread: tests call rounds), its API and tokens."""

    def __init__(self, tmp: Path, cgroup_parent: str, cluster: Cluster | None = None, names: tuple = (),
                 **kw: object) -> None:
        self.tmp = tmp
        self.cluster = cluster or Cluster.homogeneous(2, 4)
        self.store = Store(f"sqlite:///{tmp / 'state' / 'db.sqlite'}")
        self.cgroup_parent = cgroup_parent
        self.names = names
        self.kw = kw
        self.svc = self.service()
        self.admin = ensure_admin_token(self.store, tmp / "state")
        self.tokens = {"admin": self.admin, "alice": create_token(self.store, "alice"),
                       "bob": create_token(self.store, "bob")}
        self.client = TestClient(create_app(self.svc))

    def service(self) -> Service:
        ex = local_executor(self.cluster, self.tmp / "state" / "run", True, self.cgroup_parent)
        return Service(self.store, self.cluster, ex, Scheduler.from_names(*self.names),
                       ServiceConfig(self.tmp / "state",
                       round_s=1000.0, grace_s=5.0, **self.kw))  # type: ignore[arg-type]

    def post(self, who: str, body: dict, key: str | None = None):  # noqa: ANN201
        hd = {**h(self.tokens[who]), **({"Idempotency-Key": key} if key else {})}
        return self.client.post("/jobs", json=body, headers=hd)

    def run_until(self, jids: list[int], states: tuple[str, ...] = ("finished", "failed"), timeout: float = 30) -> None:
        def done() -> bool:
            self.svc.round()
            return all(self.store.get_job(j).state in states for j in jids)  # type: ignore[union-attr]

        wait_for(done, timeout, f"jobs {jids} to end")

    def close(self) -> None:
        self.svc.terminate_all()
        self.svc.shutdown()
        self.store.close()
        import shutil

        if self.svc.guard.identities.switch:
            shutil.rmtree(self.svc.guard.job_dir, ignore_errors=True)


@pytest.fixture
def env(tmp_path: Path, cgroup_parent: str) -> Iterator[Env]:
    root = job_writable(tmp_path) / "ckroot"  # an operator's --checkpoint-root that job accounts may write
    root.mkdir()
    os.chmod(root, 0o1777)
    e = Env(tmp_path, cgroup_parent, checkpoint_roots=[root])
    yield e
    e.close()


def h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def locs(r) -> list[str]:  # noqa: ANN001
    assert r.status_code == 422, (r.status_code, r.text[:300])
    return [str(d["loc"][-1]) for d in r.json()["detail"]]


# -- 1. any user can become admin ----------------------------------------------------------------------
@needs_root
def test_1_jobs_run_unprivileged_without_the_servers_environment_and_files_are_private(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULOOM_TEST_SECRET", "s3cret")  # the server's environment must not reach jobs
    state = env.tmp / "state"
    probe = (f"id -u; cat {state}/admin.token && echo TOKEN-READ; ls {state}/logs && echo LOGS-LISTED; "
             f"env | grep -c GPULOOM_TEST_SECRET; echo HOME=$HOME")
    jid = env.post("alice", {"name": "probe", "command": probe, "gpus": 1}).json()["id"]
    env.run_until([jid])
    out = env.svc.log_path(jid).read_text().splitlines()
    acc = lookup("gpuloom")
    assert out[0] == str(acc.uid) and acc.uid != 0
    assert "TOKEN-READ" not in out and "LOGS-LISTED" not in out
    assert "0" in out  # grep -c: no line of the job's environment names the server's secret
    # the state directory and everything private in it
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for f in (state / "db.sqlite", state / "admin.token", env.svc.log_path(jid)):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    # the job's own checkpoint directory: its account's, private
    ck = Path(env.store.get_job(jid).checkpoint_dir)  # type: ignore[union-attr, arg-type]
    st = ck.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (acc.uid, 0o700)
    assert stat.S_IMODE(ck.parent.stat().st_mode) == 0o711  # enterable, not listable


@needs_root
def test_1_users_mapped_to_accounts_cannot_touch_each_others_jobs(tmp_path: Path, cgroup_parent: str,
                                                                   os_users: list[str]) -> None:
    alice, bob = os_users
    e = Env(tmp_path, cgroup_parent, identities=Identities({"alice": alice, "bob": bob}))
    try:
        share = job_writable(tmp_path)
        a = e.post("alice", {"name": "a", "command": f"echo $$ > {share}/a.pid; echo $GPULOOM_CHECKPOINT_DIR "
                                                      f"> {share}/a.ckpt; export KEY=alice-secret; sleep 30",
                             "gpus": 1, "env": {"KEY": "alice-secret"}}).json()["id"]
        e.svc.round()
        wait_for(lambda: (share / "a.ckpt").exists() and (share / "a.ckpt").read_text().strip(), what="job a")
        pid = (share / "a.pid").read_text().strip()
        ck = (share / "a.ckpt").read_text().strip()
        spy = (f"cat /proc/{pid}/environ >/dev/null 2>&1 && echo ENVIRON-READ; "
               f"kill -0 {pid} 2>/dev/null && echo SIGNAL-SENT; ls {ck} >/dev/null 2>&1 && echo CKPT-LISTED; "
               f"touch {ck}/x 2>/dev/null && echo CKPT-WRITTEN; id -un")
        b = e.post("bob", {"name": "b", "command": spy, "gpus": 1}).json()["id"]
        e.run_until([b])
        out = e.svc.log_path(b).read_text()
        assert out.strip().splitlines() == [bob], out
        assert e.store.get_job(a).state in ("launching", "running_protected", "running")  # type: ignore[union-attr]
    finally:
        e.close()


def test_1_accounts_never_root_unless_explicitly_allowed() -> None:
    if not ROOT:
        with pytest.raises(IdentityError, match="only a server running as root"):
            Identities({"alice": "alice"}).check()
        return
    with pytest.raises(IdentityError, match="allow-root-jobs"):
        Identities(job_user="root").check()
    with pytest.raises(IdentityError, match="allow-root-jobs"):
        Identities({"alice": "root"}).check()
    ok = Identities(job_user="root", allow_root=True)
    ok.check()
    assert ok.os_user("anyone") is None  # the server's own account: root, as told
    ids = Identities()
    ids.check()
    assert ids.os_user("alice") == "gpuloom" and lookup("gpuloom").uid != 0


def test_1_creatable_follows_permission_bits(tmp_path: Path) -> None:
    nobody = lookup("nobody")
    base = job_writable(tmp_path)  # every directory above it enterable
    d = base / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    assert creatable(d / "ck", nobody) is None
    os.chmod(d, 0o755)
    assert "may not create" in (creatable(d / "ck" / "deeper", nobody) or "")
    os.chmod(d, 0o777)
    os.chmod(base, 0o700)
    if ROOT:
        assert "may not enter" in (creatable(d / "ck", nobody) or "")
    (base / "file").write_text("")
    assert "not a directory" in (creatable(base / "file" / "ck", nobody) or "")


# -- 2. one bad job stops scheduling for everyone ---------------------------------------------------------
def test_2_what_a_round_would_choke_on_is_refused_at_submission(env: Env) -> None:
    base = {"command": "true", "gpus": 2}
    assert locs(env.post("alice", {**base, "checkpoint_dir": "/etc/passwd"})) == ["checkpoint_dir"]
    assert locs(env.post("alice", {**base, "checkpoint_dir": "/etc/gpuloom-ckpt"})) == ["checkpoint_dir"]
    outside = f"{env.svc.guard.job_dir}/../escape"
    assert locs(env.post("alice", {**base, "checkpoint_dir": outside})) == ["checkpoint_dir"]
    assert locs(env.post("alice", {**base, "min_gpus": 50})) == ["min_gpus"]
    assert locs(env.post("alice", {**base, "min_gpus": 3})) == ["min_gpus"]  # more than it asks for
    assert locs(env.post("alice", {**base, "throughput": [0, 0]})) == ["throughput"]
    assert locs(env.post("alice", {**base, "throughput": {"16": 2.0}})) == ["throughput"]
    assert locs(env.post("alice", {**base, "resource_times": [0, 0, 0, 0]})) == ["resource_times"]
    assert locs(env.post("alice", {**base, "resource_times": [0.1, 0.2]})) == ["resource_times"]
    assert env.client.get("/jobs", headers=h(env.admin)).json() == []
    # what is fine passes: a checkpoint directory under the job directory, sane fields
    if env.svc.guard.identities.switch:  # the job directory is the server's: a job account may not create in it
        assert locs(env.post("alice", {**base, "checkpoint_dir": f"{env.svc.guard.job_dir}/x"})) == ["checkpoint_dir"]
    ok = {**base, "checkpoint_dir": f"{env.svc.guard.roots[0]}/mine", "throughput": [1.0, 1.8],
          "min_gpus": 1, "resource_times": [0.1, 0.2, 0.3, 0.1]}
    assert env.post("alice", ok).status_code == 201


@pytest.mark.parametrize("names,bad", [
    (("fifo", "none", "elastic", "packed-sticky"), {"min_gpus": 50}),
    (("fifo", "none", "elastic", "packed-sticky"), {"throughput": [0, 0]}),
    (("fifo", "none", "proportional", "packed-sticky"), {"throughput": {"abc": 1}}),
    (("fifo", "muri", "proportional", "packed-sticky"), {"resource_times": [0, 0, 0, 0]}),
])
def test_2_a_job_the_scheduler_chokes_on_fails_alone(tmp_path: Path, cgroup_parent: str, names: tuple,
                                                     bad: dict) -> None:
    """Stored as an older release (or another server) would have accepted it: the round fails that job
    with the reason, and everyone else's jobs launch in the same round."""
    e = Env(tmp_path, cgroup_parent, names=names)
    try:
        rt = {"resource_times": [0.1, 0.3, 0.1, 0.05]} if names[1] == "muri" else {}
        good = e.svc.submit({"name": "good", "command": "sleep 30", "gpus": 2, **rt}, "bob")
        jid = e.store.add_job({"name": "bad", "command": "sleep 30", "gpus": 2, **bad}, "alice",
                              JobState.WAITING_FOR_INITIAL_CONTACT.value)
        good2 = e.svc.submit({"name": "good2", "command": "sleep 30", "gpus": 2, **rt}, "bob")
        e.svc.round()
        row = e.store.get_job(jid)
        assert row.state == "failed" and row.attempts == 0, row  # type: ignore[union-attr]
        assert "cannot be scheduled" in row.reason or "throughput model" in row.reason  # type: ignore[union-attr, operator]
        assert {e.store.get_job(j).state for j in (good, good2)} == {"launching"}  # type: ignore[union-attr]
    finally:
        e.close()


def test_2_failing_rounds_back_off_exponentially_and_log_once(caplog: pytest.LogCaptureFixture) -> None:
    b = Backoff(0.1, 30.0)
    delays = []
    with caplog.at_level(logging.DEBUG, "gpuloom.service"):
        for _ in range(12):
            try:
                raise RuntimeError("broken policy")
            except RuntimeError:
                delays.append(b.failed())
        b.succeeded()
    assert delays[:5] == [0.1, 0.2, 0.4, 0.8, 1.6] and delays[-1] == 30.0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None  # one traceback
    assert any("work again after 12" in r.getMessage() for r in caplog.records)


# -- 3. minimums and units ------------------------------------------------------------------------------
def test_3_minimums_units_and_use_is_counted(env: Env) -> None:
    base = {"command": "sleep 30", "gpus": 1}
    assert locs(env.post("alice", {**base, "cpus": 0})) == ["cpus"]
    assert locs(env.post("alice", {**base, "mem": 0})) == ["mem"]
    assert locs(env.post("alice", {**base, "mem": "512K"})) == ["mem"]
    assert locs(env.post("alice", {**base, "mem": True})) == ["mem"]
    assert locs(env.post("alice", {**base, "gpus": True})) == ["gpus"]
    assert locs(env.post("alice", {**base, "cpus": 1.5})) == ["cpus"]
    r = env.post("alice", {**base, "cpus": 1, "mem": "64Mi"})
    assert r.status_code == 201 and r.json()["mem_mb"] == 68  # 67.108864 MB, rounded up
    env.svc.round()
    (n0, _) = env.svc.nodes()
    assert (n0["cpus_used"], n0["mem_mb_used"]) == (1, 68)
    # node memory counts in the same unit: --mem-gb-per-node 4 is 4000 MB, as 4G is for a job
    from gpuloom.core.cluster import parse_cluster
    from gpuloom.runtime.state.specs import parse_mem

    assert parse_cluster("1x4", 8, 4).nodes[0].mem_mb == parse_mem("4G") == 4000


# -- 4. one server per state ------------------------------------------------------------------------------
def test_4_a_second_server_on_the_same_state_or_database_exits(tmp_path: Path) -> None:
    from service_util import Server

    s = Server(tmp_path / "a", "--cluster", "1x1", "--round", "0.2")
    (tmp_path / "a").mkdir()
    s.start()
    try:
        for args in (("--state-dir", str(tmp_path / "a")),
                     ("--state-dir", str(tmp_path / "b"), "--db", f"sqlite:///{tmp_path / 'a' / 'gpuloom.db'}")):
            r = subprocess.run([sys.executable, "-m", "gpuloom", "serve", "--port", "0", "--cluster", "1x1", *args],
                               capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1] / "src")))
            assert r.returncode == 2, r.stderr
            assert "another gpuloom server" in r.stderr and f"pid {s.proc.pid}" in r.stderr  # type: ignore[union-attr]
    finally:
        s.stop()
    # once it is gone (even killed), the state is free again
    s2 = Server(tmp_path / "a", "--cluster", "1x1", "--round", "0.2").start()
    s2.kill()
    s3 = Server(tmp_path / "a", "--cluster", "1x1", "--round", "0.2").start()
    s3.stop()


# -- 5. a process launched without being recorded ----------------------------------------------------------
class Crash(BaseException):
    """The server dies (no except clause of the service catches it)."""


class CrashAfterLaunch(LocalExecutor):
    def launch(self, spec: LaunchSpec):  # noqa: ANN201
        super().launch(spec)
        raise Crash


def test_5_launch_is_recorded_before_the_process_and_recovery_runs_it_once(tmp_path: Path,
                                                                           cgroup_parent: str) -> None:
    cluster = Cluster.homogeneous(1, 1)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    from gpuloom.runtime.exec.cgroups import CgroupManager

    def service(ex: LocalExecutor) -> Service:
        return Service(store, cluster, ex, Scheduler.from_names(), ServiceConfig(tmp_path, round_s=1000.0, grace_s=5.0))

    def executor(cls: type[LocalExecutor]) -> LocalExecutor:
        return cls("node-0", cgroups=CgroupManager(parent=cgroup_parent), run_dir=tmp_path / "run" / "node-0",
                   fold_cores=True)

    svc = service(executor(CrashAfterLaunch))
    jid = svc.submit({"name": "s", "command": stepper_cmd(30, 0.05), "gpus": 1}, "alice")
    with pytest.raises(Crash):
        svc.round()
    row = store.get_job(jid)
    assert row.procs == [{"job_id": str(jid), "node": "node-0", "pending": True}] and row.attempts == 1
    ck = row.checkpoint_dir
    wait_for(lambda: len(ledger(ck)) >= 3, what="the unrecorded process to make progress")
    # a new server: the unrecorded process is found and stopped (it checkpoints), then the job resumes once
    svc2 = service(executor(LocalExecutor))
    svc2.recover()
    stopped_at = len(ledger(ck))
    assert "launch-unconfirmed" in [e["kind"] for e in store.events(jid)]
    wait_for(lambda: (svc2.round(), store.get_job(jid).state)[1] == "finished", what="the job to finish")
    assert ledger(ck) == list(range(30)) and stopped_at < 30
    row = store.get_job(jid)
    assert row.attempts == 2 and row.resume_count == 1
    svc2.shutdown()
    store.close()


def test_5_a_job_the_model_cannot_rate_fails_alone_without_a_process(env: Env,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    a = env.svc.submit({"name": "a", "command": "sleep 30", "gpus": 1}, "alice")
    b = env.svc.submit({"name": "b", "command": "sleep 30", "gpus": 1}, "bob")
    real = env.svc.driver.speed

    def speed(job, alloc):  # noqa: ANN001, ANN202
        if job.id == str(a):
            raise ValueError("no curve")
        return real(job, alloc)

    monkeypatch.setattr(env.svc.driver, "speed", speed)
    env.svc.round()
    ra, rb = env.store.get_job(a), env.store.get_job(b)
    assert ra.state == "failed" and "throughput model" in ra.reason and ra.procs is None  # type: ignore[union-attr, operator]
    assert "launch-intent" not in [e["kind"] for e in env.store.events(a)]
    assert rb.state == "launching"  # type: ignore[union-attr]
    assert locs(env.post("alice", {"command": "true", "gpus": 1, "throughput": {"abc": 1}})) == ["throughput"]


# -- 6: see tests/test_service_recovery.py (a job that exits 3 while the server is down is FAILED, once) ---


# -- 7. size limits, listing, retention ---------------------------------------------------------------------
def test_7_bodies_and_fields_are_bounded_and_errors_do_not_echo(env: Env) -> None:
    big = {"command": "true", "gpus": 1, "env": {"X": "x" * (50 << 20)}}
    r = env.client.post("/jobs", content=json.dumps(big), headers={**h(env.admin), "content-type": "application/json"})
    assert r.status_code == 413 and len(r.content) < 300
    junk = "[" + ",".join(["1"] * 300_000) + "]"  # ~600 KB, under the body limit, invalid
    r = env.client.post("/jobs", content=junk, headers={**h(env.admin), "content-type": "application/json"})
    assert r.status_code == 422 and len(r.content) < 2000
    r = env.client.post("/jobs", content="x" * (23 << 20), headers={**h(env.admin), "content-type": "application/json"})
    assert r.status_code == 413 and len(r.content) < 300
    assert locs(env.post("alice", {"command": "true", "gpus": 1, "env": {"X": "x" * 40_000}})) == ["env"]
    assert locs(env.post("alice", {"command": "x" * 70_000, "gpus": 1})) == ["command"]
    assert locs(env.post("alice", {"command": "true", "gpus": 1, "env": {f"V{i}": "1" for i in range(200)}})) == ["env"]
    assert locs(env.post("alice", {"command": "true", "gpus": 1, "throughput": [1.0] * 2000})) == ["throughput"]
    assert env.store.count_jobs() == 0


def test_7_listing_is_paginated_filtered_and_finished_jobs_expire(tmp_path: Path, cgroup_parent: str) -> None:
    e = Env(tmp_path, cgroup_parent, keep_finished_s=3600.0)
    try:
        ids = [e.post("alice" if i % 2 else "bob", {"name": f"j{i}", "command": "true", "gpus": 1}).json()["id"]
               for i in range(7)]
        hd = h(e.admin)
        r = e.client.get("/jobs", params={"limit": 3}, headers=hd)
        assert [j["id"] for j in r.json()] == ids[:3] and r.headers["X-Next-After"] == str(ids[2])
        r = e.client.get("/jobs", params={"limit": 3, "after": ids[2]}, headers=hd)
        assert [j["id"] for j in r.json()] == ids[3:6]
        assert [j["id"] for j in e.client.get("/jobs", params={"user": "alice"}, headers=hd).json()] == ids[1::2]
        assert e.client.get("/jobs", params={"limit": 0}, headers=hd).status_code == 422
        e.run_until(ids)
        # since: jobs not ended before that time (sacct's start time)
        assert e.client.get("/jobs", params={"since": time.time() + 60}, headers=hd).json() == []
        assert len(e.client.get("/jobs", params={"since": time.time() - 3600}, headers=hd).json()) == 7
        # retention: jobs that ended more than keep_finished_s ago go, with their events and logs
        old = ids[:4]
        for j in old:
            e.store.update_job(j, {"end_time": time.time() - 7200})
        assert e.svc.guard.purge(e.svc) == 4
        assert [j["id"] for j in e.client.get("/jobs", headers=hd).json()] == ids[4:]
        assert e.store.events(old[0]) == [] and not e.svc.log_path(old[0]).exists()
    finally:
        e.close()


# -- 8. names rendered as markup --------------------------------------------------------------------------
def test_8_names_are_shown_as_they_are_in_every_table(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx
    from typer.testing import CliRunner

    from gpuloom.cli import app
    from gpuloom.cli.service import Client

    job = {"id": 1, "name": "[/]", "user": "[bold]x", "state": "running", "st": "R", "gpus": 1, "progress": None,
           "nodes": ["\x1b[31mred"], "reason": "[red]", "pending_reason": None, "last_start": None, "held_time": 0,
           "held_s": 0, "array": None, "queue": "[/]", "command": "echo \x1b]0;title\x07", "attempts": 1,
           "resume_count": 0, "preemptions": 0, "alloc": None, "time_limit": None, "gpu_type": None}
    node = {"name": "[/]", "state": "idle", "gpus": 1, "gpus_used": 0, "cpus": 1, "cpus_used": 0, "mem_mb": 1,
            "mem_mb_used": 0, "gpu_type": "\x1b]0;title\x07", "jobs": []}
    answers = {"/jobs": [job], "/nodes": [node], "/jobs/1": job,
               "/jobs/1/events": [{"time": None, "kind": "[/]", "detail": {"why": "\x1b[2J"}}], "/history": []}
    from gpuloom.cli import jobs as cli_jobs

    # the queue reads its listing a block at a time (field names, each job's values)
    monkeypatch.setattr(cli_jobs, "_listing", lambda client, params: iter([(list(job), [list(job.values())])]))
    monkeypatch.setattr(Client, "call", lambda self, m, p, raw=False, **kw:
                        httpx.Response(200, json=answers[p]) if raw else answers[p])
    runner = CliRunner()
    for cmd in (["queue"], ["nodes"], ["show", "1"]):
        r = runner.invoke(app, [*cmd, "--url", "http://127.0.0.1:1", "--token", "t"])
        assert r.exit_code == 0, (cmd, r.output, r.exception)
        assert "[/]" in r.output and "\x1b" not in r.output and "\x07" not in r.output, (cmd, r.output)
    assert "[bold]x" in runner.invoke(app, ["queue", "--url", "http://127.0.0.1:1", "--token", "t"]).output


# -- 9. 500s instead of 4xx ----------------------------------------------------------------------------------
def test_9_bad_numbers_huge_ids_and_nul_bytes_get_4xx(env: Env) -> None:
    hd = {**h(env.admin), "content-type": "application/json"}
    for raw in ('{"command": "true", "gpus": 1, "time_limit": NaN}',
                '{"command": "true", "gpus": 1, "time_limit": Infinity}',
                '{"command": "true", "gpus": 1, "time_limit": 1e999}',
                '{"command": "true", "gpus": 1, "throughput": [NaN]}',
                '{"command": "true", "gpus": 1, "iteration_time": -Infinity}',
                '{"command": "true", "gpus": 1, "time_limit": 100000000000000000000000000000}'):
        r = env.client.post("/jobs", content=raw, headers=hd)
        assert r.status_code == 422, (raw, r.status_code, r.text[:200])
    for path in ("/jobs/18446744073709551616", "/jobs/9223372036854775808", "/jobs/-1"):
        assert env.client.get(path, headers=hd).status_code == 422
        assert env.client.delete(path, headers=hd).status_code == 422
    assert env.client.get("/jobs/9223372036854775807", headers=hd).status_code == 404
    for body in ({"command": "tr\x00ue", "gpus": 1}, {"command": "true", "gpus": 1, "env": {"A": "b\x00"}},
                 {"command": "true", "gpus": 1, "name": "n\x00"},
                 {"command": "true", "gpus": 1, "profile": {"k\x00": 1}}):
        assert env.post("alice", body).status_code == 422
    assert env.store.count_jobs() == 0


def test_9_a_nul_byte_reaching_the_executor_leaves_no_cgroup(tmp_path: Path, cgroup_parent: str) -> None:
    from gpuloom.runtime.exec.cgroups import CgroupManager

    agent = NodeAgent(CgroupManager(parent=cgroup_parent), tmp_path / "run")
    with pytest.raises(ExecutorError, match="launch failed"):
        agent.launch(LaunchSpec("n1", "echo a\x00b", "", (), (0,), 64, str(tmp_path / "n1.log")))
    assert all(not d.exists() for d in agent.cgroups.job("n1").paths())


# -- 10. the smaller ones ------------------------------------------------------------------------------------
def test_10_oom_kills_are_named(tmp_path: Path, cgroup_parent: str) -> None:
    e = Env(tmp_path, cgroup_parent, cluster=Cluster.homogeneous(1, 1))
    try:
        if not e.svc.executor.agent.cgroups.support.memory:  # type: ignore[attr-defined]
            pytest.skip("no memory cgroups here")
        hog = f"{JOB_PY} -c 'x = bytearray(400 * 10**6); x[::4096] = bytes(len(x) // 4096); print(len(x))'"
        jid = e.post("alice", {"command": hog, "gpus": 1, "mem": "64M"}).json()["id"]
        e.run_until([jid])
        row = e.store.get_job(jid)
        assert row.state == "failed" and row.exit_code == 137, row  # type: ignore[union-attr]
        assert "OOM killer" in (row.reason or "")  # type: ignore[union-attr]
    finally:
        e.close()


def test_10_recovery_counts_the_preemption_it_finishes_and_ends_protection(tmp_path: Path,
                                                                          cgroup_parent: str) -> None:
    e = Env(tmp_path, cgroup_parent, protect_factor=1e6, launch_timeout_s=0.0)
    try:
        a = e.svc.submit({"name": "a", "command": "sleep 60", "gpus": 4}, "alice")
        b = e.svc.submit({"name": "b", "command": "sleep 60", "gpus": 4}, "alice")
        e.svc.round()
        e.svc.observe()  # launch timeout 0: running, protected for a very long time
        assert {e.store.get_job(j).state for j in (a, b)} == {"running_protected"}  # type: ignore[union-attr]
        # b's stop was under way when the server died; a keeps running
        e.store.update_job(b, {"state": "checkpointing"})
        e.svc.executor.stop(str(b), 1.0)
        e.svc = e.service()
        e.svc.recover()
        rb = e.store.get_job(b)
        assert rb.state == "standby" and rb.preemptions == 1  # type: ignore[union-attr]
        e.svc.observe()  # a was adopted: its protection (of unknown start) has ended
        assert e.store.get_job(a).state == "running"  # type: ignore[union-attr]
    finally:
        e.close()


def test_10_service_cgroup_parent_is_removed_at_shutdown(tmp_path: Path) -> None:
    parent = f"gpuloom-test-{uuid.uuid4().hex[:8]}"
    cluster = Cluster.homogeneous(1, 1)
    ex = local_executor(cluster, tmp_path / "run", True, parent)
    mgr = ex.agent.cgroups  # type: ignore[attr-defined]
    if mgr.mode == "none":
        pytest.skip("no cgroups here")
    dirs = [Path(mgr.root) / c / parent for c in ("memory", "cpuset")] if mgr.support.version == 1 else [
        Path(mgr.root) / parent]
    assert any(d.exists() for d in dirs)
    ex.close()
    assert not any(d.exists() for d in dirs)


def test_10_tokens_expire_list_and_revoke(env: Env) -> None:
    hd = h(env.admin)
    r = env.client.post("/tokens", json={"user": "carol", "expires": "1h"}, headers=hd)
    assert r.status_code == 201 and r.json()["expires_in"] == 3600.0
    carol = r.json()["token"]
    assert env.client.get("/jobs", headers=h(carol)).status_code == 200
    mine = env.client.get("/tokens", headers=h(carol)).json()
    assert [t["user"] for t in mine] == ["carol"] and mine[0]["expires"] > time.time() and "token" not in mine[0]
    assert {t["user"] for t in env.client.get("/tokens", headers=hd).json()} == {"admin", "alice", "bob", "carol"}
    # a user cannot revoke someone else's token; the admin can revoke any
    alice_id = next(t["id"] for t in env.client.get("/tokens", headers=hd).json() if t["user"] == "alice")
    assert env.client.delete(f"/tokens/{alice_id}", headers=h(carol)).status_code == 404
    assert env.client.delete(f"/tokens/{mine[0]['id']}", headers=h(carol)).status_code == 200
    assert env.client.get("/jobs", headers=h(carol)).status_code == 401  # revoked
    assert env.client.delete(f"/tokens/{alice_id}", headers=hd).status_code == 200
    assert env.client.get("/jobs", headers=h(env.tokens["alice"])).status_code == 401
    # expired: refused at once
    old = create_token(env.store, "dave", expires_in=-1.0)
    assert env.client.get("/jobs", headers=h(old)).status_code == 401


def test_10_others_jobs_are_listed_without_command_or_paths(env: Env) -> None:
    a = env.post("alice", {"name": "a", "command": "train --password hunter2", "gpus": 1,
                           "workdir": "/tmp/alice-secret-project"}).json()["id"]
    env.svc.round()
    seen_by_bob = env.client.get(f"/jobs/{a}", headers=h(env.tokens["bob"])).json()
    assert seen_by_bob["name"] == "a" and seen_by_bob["state"] == "launching"
    assert seen_by_bob["command"] is None and seen_by_bob["checkpoint_dir"] is None and seen_by_bob["procs"] is None
    assert seen_by_bob["workdir"] is None
    listed = json.dumps(env.client.get("/jobs", headers=h(env.tokens["bob"])).json())
    assert "hunter2" not in listed and "alice-secret-project" not in listed
    assert all(ev["detail"] == {} for ev in env.client.get(f"/jobs/{a}/events", headers=h(env.tokens["bob"])).json())
    own = env.client.get(f"/jobs/{a}", headers=h(env.tokens["alice"])).json()
    assert own["command"] == "train --password hunter2" and own["procs"] and own["workdir"] == "/tmp/alice-secret-project"
    assert env.client.get(f"/jobs/{a}", headers=h(env.admin)).json()["checkpoint_dir"]


def test_10_a_retried_submission_is_not_duplicated(env: Env) -> None:
    body = {"name": "once", "command": "true", "gpus": 1}
    r1 = env.post("alice", body, key="k-1")
    r2 = env.post("alice", body, key="k-1")
    assert (r1.status_code, r2.status_code) == (201, 200) and r1.json()["id"] == r2.json()["id"]
    r3 = env.post("bob", body, key="k-1")  # keys are per user
    assert r3.status_code == 201 and r3.json()["id"] != r1.json()["id"]
    assert env.store.count_jobs() == 2


def test_10_plain_http_beyond_loopback_warns(tmp_path: Path) -> None:
    from service_util import Server

    s = Server(tmp_path, "--cluster", "1x1", "--host", "0.0.0.0").start()
    try:
        pass
    finally:
        s.stop()
    out = (tmp_path / "serve.out").read_text()
    assert "serving plain HTTP on 0.0.0.0" in out


def test_10_tls_serves_https(tmp_path: Path) -> None:
    """--ssl-keyfile/--ssl-certfile: uvicorn serves HTTPS (a self-signed certificate made here)."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    import httpx

    from service_util import Server

    s = Server(tmp_path / "st", "--cluster", "1x1", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert))
    (tmp_path / "st").mkdir()
    import ssl

    s.verify = ssl.create_default_context(cafile=str(cert))
    s.start()
    try:
        assert s.url.startswith("https://")
        assert httpx.get(s.url + "/health", verify=s.verify).status_code == 200
    finally:
        s.stop()
