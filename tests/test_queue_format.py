"""``gpuloom queue``: pending array tasks collapsed as squeue does, ``--array`` expands them, and
``--format`` with squeue's codes or field names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.cli.queuefmt import CODES, FormatError, cells, code_lines, collapse, parse_format, task_ranges
from service_util import Server, kill_jobs, wait_for

FIELDS = ["id", "array", "name", "user", "queue", "st", "state", "time_limit", "held_s", "gpus", "gpu_type",
          "progress", "nodes", "pending_reason", "reason"]
runner = CliRunner()


def job(jid: int, array: str | None = None, st: str = "PD", why: str | None = "Resources", **kw: Any) -> list[Any]:
    d = {"id": jid, "array": array, "name": "train", "user": "alice", "queue": None, "st": st,
         "state": "running" if st == "R" else "waiting_for_initial_resource", "time_limit": None, "held_s": 0.0,
         "gpus": 1, "gpu_type": None, "progress": None, "nodes": ["node-0"] if st == "R" else [],
         "pending_reason": why if st == "PD" else None, "reason": None, **kw}
    return [d[f] for f in FIELDS]


def test_task_ranges() -> None:
    assert task_ranges([3]) == "3"
    assert task_ranges([3, 4, 5, 291]) == "3-5,291"
    assert task_ranges([0, 2, 4, 5, 6, 9]) == "0,2,4-6,9"


def test_pending_tasks_of_an_array_and_reason_are_one_line_in_the_order_of_the_first() -> None:
    rows = [job(16, "16_0", "R"), job(17, "16_1", "R"), job(18, "16_2"), job(20, None),
            *(job(16 + k, f"16_{k}", why="JobArrayTaskLimit") for k in range(3, 8)), job(30, "30_0"),
            job(31, "30_1", "CG", why=None)]
    out, counts = collapse(rows, FIELDS)
    at = FIELDS.index("array")
    assert [(r[0], r[at]) for r in out] == [(16, "16_0"), (17, "16_1"), (18, "16_2"), (20, None), (19, "16_[3-7]"),
                                            (30, "30_0"), (31, "30_1")]
    assert counts == {4: 5}  # a group of one stays as it was
    assert rows[4][at] == "16_3"  # (the input is not changed)


def test_format_codes_and_names() -> None:
    fmt = parse_format("%.6i|%5u %t %M %l %D %b %R %n %K 100%%")
    assert isinstance(fmt, tuple)
    rows = [job(5, None, "R", held_s=75.0, time_limit=3600.0, gpu_type="v100", gpus=2),
            job(19, "16_[3-7]", why="JobArrayTaskLimit")]
    assert code_lines(rows, FIELDS, {1: 5}, fmt) == [
        " JOBID|USER  ST TIME TIME_LIMIT NODES GRES NODELIST(REASON) TASKS TASK 100%",
        "     5|alice R 1:15 1:00:00 1 gpu:v100:2 node-0 1 - 100%",
        "16_[3-7]|alice PD 0:00 UNLIMITED - gpu:1 (JobArrayTaskLimit) 5 [3-7] 100%"]
    assert parse_format("id, user,ST") == ["id", "user", "st"]
    assert cells(rows[1], FIELDS, ["jobid", "id", "task", "queue", "state", "reason"], 5) == [
        "16_[3-7]", "19", "[3-7]", "-", "WAITING_FOR_INITIAL_RESOURCE", "JobArrayTaskLimit"]
    assert set(CODES) >= set("iujtMlDbR")  # squeue's default columns all have a code


@pytest.mark.parametrize(("text", "msg"), [
    ("%i %Z", "--format: unknown code %Z at character 4; codes: %i %A"),
    ("id,colour", "--format: unknown field 'colour'; fields: jobid, id, task"),
    ("%.i", "--format: %.i needs a width (%.10i)"),
    ("%i %", "--format: no code at character 4: %[[.]SIZE]CODE"),
    ("%-5u %i", "--format: no code at character 1"),
    (",", "--format: no field given"),
])
def test_bad_formats_say_what_is_wrong(text: str, msg: str) -> None:
    with pytest.raises(FormatError) as e:
        parse_format(text)
    assert str(e.value).startswith(msg), str(e.value)


def test_queue_collapses_an_array_and_expands_it_with_array(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    srv = Server(sd, "--cluster", "1x2", "--round", "0.2").start()
    env = {"GPULOOM_STATE_DIR": str(sd), "GPULOOM_URL": srv.url}
    try:
        with srv.client() as c:
            first = c.post("/jobs", json={"name": "sweep", "command": "sleep 60", "gpus": 1, "array": "0-299%2"})
            assert first.status_code == 201
        aid = first.json()["array_id"]

        def queue(*args: str) -> list[str]:
            r = runner.invoke(app, ["queue", *args], env=env)
            assert r.exit_code == 0, r.output
            return r.output.splitlines()

        wait_for(lambda: len([x for x in queue("--format", "%t") if x == "R"]) == 2, what="two tasks running")
        lines = queue()
        assert len(lines) == 4, lines  # the header, two running tasks, one line for 298 pending ones
        assert lines[3].split() == [str(aid + 2), f"{aid}_[2-299]", "sweep", "admin", "-", "PD", "0:00", "1", "-",
                                    "(JobArrayTaskLimit)", "298", "tasks"]
        assert len(queue("--array")) == 301
        assert queue("--format", "%i %t %n")[1:] == [f"{aid}_0 R 1", f"{aid}_1 R 1", f"{aid}_[2-299] PD 298"]
        named = queue("-o", "jobid,st,tasks")
        assert [x.split() for x in named] == [["JOBID", "ST", "TASKS"], [f"{aid}_0", "R", "1"],
                                              [f"{aid}_1", "R", "1"], [f"{aid}_[2-299]", "PD", "298"]]
        assert len(json.loads(runner.invoke(app, ["queue", "--json"], env=env).output)) == 300  # unchanged
        bad = runner.invoke(app, ["queue", "--format", "%Z"], env=env)
        assert bad.exit_code == 2 and "unknown code %Z at character 1" in bad.output
    finally:
        srv.stop()
        kill_jobs(sd)
