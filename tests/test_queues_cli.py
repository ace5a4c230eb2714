"""The queue commands: ``simulate``/``compare --queues``, and ``serve --queues`` with ``submit --queue`` and
``gpuloom queues`` against a real server."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from typer.testing import CliRunner

from gpuloom.cli import app
from service_util import REPO, Server, kill_jobs, wait_for

runner = CliRunner()
EXAMPLES = REPO / "examples"


def run(*args: str, env: dict[str, str] | None = None) -> str:
    r = runner.invoke(app, list(args), env=env)
    assert r.exit_code == 0, r.output
    return r.output


def test_simulate_with_a_queue_file_writes_per_queue_results(tmp_path: Path) -> None:
    run("simulate", "--trace", str(EXAMPLES / "queued_jobs.csv"), "--cluster", "2x4", "--queues",
        str(EXAMPLES / "queues.toml"), "--out", str(tmp_path), "--no-plots")
    rows = {r["queue"]: r for r in csv.DictReader(open(tmp_path / "queues.csv"))}
    assert list(rows) == ["vision", "nlp", "shared"]
    assert [rows[q]["jobs"] for q in rows] == ["12", "10", "11"]  # alice's three sent to shared count there
    assert all(r["limit_violations"] == "0" for r in rows.values())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["queue"] == "quota"
    assert (tmp_path / "queue_series.csv").exists() and not (tmp_path / "queue_share.png").exists()


def test_compare_measures_every_run_against_the_same_quotas(tmp_path: Path) -> None:
    run("compare", "--trace", str(EXAMPLES / "queued_jobs.csv"), "--cluster", "2x4", "--queues", "demand",
        "-c", "order=fifo", "-c", "order=fifo,queue=quota,P.borrow=false,label=strict", "--out", str(tmp_path),
        "-j", "1")
    rows = list(csv.DictReader(open(tmp_path / "queues.csv")))
    assert {r["run"] for r in rows} == {"fifo", "strict"}
    # demand quotas: the three user queues (no queue column for most jobs: the user's name)
    assert {r["queue"] for r in rows} == {"alice", "bob", "carol", "shared"}
    assert sum(float(r["guarantee"]) for r in rows if r["run"] == "fifo") == 8


def test_a_bad_queue_file_is_one_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "q.toml"
    f.write_text('[[queue]]\nname = "a"\nguarantee = 9\n')
    r = runner.invoke(app, ["simulate", "--cluster", "2x4", "--queues", str(f), "--out", str(tmp_path)])
    assert r.exit_code == 2
    assert "the top-level queues' guarantees ask for 9 gpus, the cluster has 8" in r.output


def test_serve_queues_submit_and_usage(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    srv = Server(sd, "--cluster", "2x4", "--queues", str(EXAMPLES / "queues.toml"), "--queue-policy", "drf",
                 "--round", "0.2").start()
    env = {"GPULOOM_STATE_DIR": str(sd), "GPULOOM_URL": srv.url}
    try:
        spec = tmp_path / "job.yaml"
        # (jobs that outlive the test: its last check needs job 2 still active, and a loaded machine took more
        # than 30 s to get there once)
        spec.write_text("command: sleep 600\ngpus: 2\nuser: alice\n")
        assert "Submitted job 1" in run("submit", str(spec), env=env)
        assert "Submitted job 2" in run("submit", str(spec), "--queue", "shared", env=env)
        bad = runner.invoke(app, ["submit", str(spec), "--queue", "research"], env=env)
        assert bad.exit_code == 2 and "queue: the job: queue 'research' has sub-queues" in bad.output
        jobs = json.loads(run("queue", "--all", "--json", env=env))
        assert [(j["id"], j["queue"]) for j in jobs] == [(1, "vision"), (2, "shared")]
        wait_for(lambda: json.loads(run("queues", "--json", env=env))["queues"][1]["used"]["gpus"] == 2,
                 what="vision to hold its job's GPUs")
        out = {q["name"]: q for q in json.loads(run("queues", "--json", env=env))["queues"]}
        assert out["research"]["used"]["gpus"] == 2 and out["shared"]["used"]["gpus"] == 2
        assert out["research"]["guarantee"]["gpus"] == 6 and out["research"]["limit"] == {"gpus": 7.0}
        table = run("queues", env=env)
        assert "research" in table and "vision" in table and "alice → vision" in table
        run("queues", "set", "shared", "--guarantee", "1", "--weight", "2", env=env)
        run("queues", "set", "ops", "--guarantee", "1", env=env)
        run("queues", "user", "carol", "ops", env=env)
        out = json.loads(run("queues", "--json", env=env))
        assert out["users"] == {"alice": "vision", "bob": "nlp", "carol": "ops"}
        # who may submit, and the queue's own limits
        run("queues", "group", "cv", "carol", "dave", env=env)
        run("queues", "set", "ops", "--guarantee", "1", "--user", "erin", "--group", "cv", "--max-priority", "5",
            "--max-pending", "100", env=env)
        run("queues", "set", "lab", "--per-user", "--per-user-limit", "1", env=env)
        out = json.loads(run("queues", "--json", env=env))
        rows = {q["name"]: q for q in out["queues"]}
        assert out["groups"] == {"cv": ["carol", "dave"]}
        assert {k: rows["ops"].get(k) for k in ("users", "groups", "max_priority", "max_pending", "open")} == \
            {"users": ["erin"], "groups": ["cv"], "max_priority": 5, "max_pending": 100, "open": None}
        assert (rows["lab"]["per_user"], rows["lab"]["per_user_limit"]) == (True, {"gpus": 1.0})
        table = run("queues", env=env)
        assert "erin @cv prio<=5 pend<=100" in table and "per-user (limit 1)" in table
        gone = runner.invoke(app, ["queues", "group", "cv", "-"], env=env)
        assert gone.exit_code == 2 and "queue 'ops': no group 'cv'" in gone.output
        denied = runner.invoke(app, ["queues", "delete", "shared"], env=env)
        assert denied.exit_code == 2 and "active jobs would have no queue" in denied.output
    finally:
        srv.stop()
        kill_jobs(sd)
