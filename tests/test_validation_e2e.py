"""One cluster, two views, for real: a workload through ``gpuloom serve`` (real processes on a declared 1x4
fake-GPU cluster) and through the simulator; the service's history exported and replayed.

The tolerance of the simulated mean JCT (test_simulator_predicts_the_service):

* the simulator is calibrated with what the service measured in the same run (each job's launch, exit and
  stop times, from its export): however slow this shared machine is while the test runs, that part of the
  JCTs is known to the simulator;
* ``sleepy_train.py`` keeps its step rate by deadlines (late wake-ups are made up), so the speeds the model
  gives hold under load;
* what the simulator cannot know is event latency: the service notices an exit at its next poll (0.1 s),
  runs a round at least 20 ms after an event and longer under load, and submissions travel over HTTP.  On
  an idle machine that is well under 0.5 s per job on JCTs of 5-30 s (measured: 0.5 % of the mean JCT for
  this stack); a loaded machine stretches it as it stretches launches;

so the test allows 10 % of the mean JCT plus twice the measured launch and exit overhead per job relative to
the mean JCT: the margin grows with the load.  ``gpuloom validate`` runs the full version (docs/validation.md).
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.cli.testbed import Testbed
from gpuloom.core.cluster import Cluster, load_cluster_file
from gpuloom.sim.traces.own import read_jsonl
from gpuloom.sim.validate import (
    STACKS,
    SimSetup,
    TestbedJob,
    compare,
    lifecycle_attrs,
    outcomes_of,
    simulate,
    with_attrs,
)
from service_util import JOB_PY, Server, kill_jobs, shared_copy, submit, wait_for

SLEEPY = Path(__file__).resolve().parents[1] / "examples" / "sleepy_train.py"
CL = Cluster.homogeneous(1, 4, 48, 256_000)  # Muri's testbed has 11.5 cores per GPU

#: 12 jobs of 1, 2 and 4 GPUs, 3-8 s alone, arriving over 7 s: they queue, backfill and preempt
#: (id, arrival, gpus, iterations, stages CPU/GPU/network s, CPU-bound)
JOBS = [("0", 0.0, 1, 24, (0.05, 0.15, 0.0), False), ("1", 0.3, 2, 20, (0.02, 0.18, 0.05), False),
        ("2", 0.8, 1, 30, (0.2, 0.02, 0.0), True), ("3", 1.5, 4, 15, (0.05, 0.2, 0.05), False),
        ("4", 2.0, 1, 20, (0.1, 0.1, 0.0), True), ("5", 2.4, 2, 25, (0.05, 0.1, 0.05), False),
        ("6", 3.1, 1, 15, (0.0, 0.25, 0.01), False), ("7", 3.9, 1, 40, (0.15, 0.05, 0.0), True),
        ("8", 4.6, 2, 18, (0.1, 0.15, 0.0), False), ("9", 5.2, 1, 30, (0.05, 0.1, 0.05), False),
        ("10", 6.0, 4, 12, (0.02, 0.2, 0.08), False), ("11", 7.0, 1, 25, (0.12, 0.08, 0.0), True)]


def workload() -> list[TestbedJob]:
    return [TestbedJob(i, a, g, n, st, 12 * g, 24 * g if cpu else 12 * g) for i, a, g, n, st, cpu in JOBS]


@pytest.mark.slow  # 30 s of jobs: handed out early, not at the suite's end (tests/conftest.py)
def test_simulator_predicts_the_service(tmp_path: Path, monkeypatch) -> None:
    jobs = workload()
    stack = STACKS["fifo/proportional/packed"]
    start = Testbed.start  # its server's start, not the workload: 60 s (the command's) is too few under load
    monkeypatch.setattr(Testbed, "start", lambda self: start(self, timeout=120))
    t0 = time.monotonic()
    run = Testbed(tmp_path, CL, stack, round_s=2.0, script=SLEEPY).run(jobs, timeout=240)
    assert run.states == {j.id: "finished" for j in jobs}
    assert len(run.trace) == 12
    ids = {str(r["id"]): str(r["attrs"]["name"])[1:] for r in run.trace}
    measured = {ids[str(r["id"])]: lifecycle_attrs(r) for r in run.trace}
    specs = [j.spec(CL, arrival=run.outcomes[j.id].arrival) for j in jobs]
    res = simulate(with_attrs(specs, measured), CL, stack, SimSetup(round_s=2.0))
    c = compare(run.outcomes, outcomes_of(res))
    overhead = statistics.fmean(a.get("launch_time", 0.0) for a in measured.values())
    tol = 0.10 + 2 * overhead / c["mean_jct_real"]
    assert c["jobs"] == 12
    assert abs(c["mean_jct_err"]) <= tol, (c["mean_jct_real"], c["mean_jct_sim"], tol, c["per_job"])
    assert abs(c["makespan_err"]) <= tol, (c["makespan_real"], c["makespan_sim"], tol)
    # the exported trace replays: every job, its measured work, the measured speeds
    f = tmp_path / "trace.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in run.trace))
    replay = read_jsonl(f).jobs
    assert sorted(int(s.iterations or 0) for s in replay) == sorted(j.iterations for j in jobs)
    assert outcomes_of(simulate(replay, CL, stack, SimSetup(round_s=2.0))).keys() == set(ids)
    print(f"\n12 jobs: mean JCT real {c['mean_jct_real']:.2f} s, simulated {c['mean_jct_sim']:.2f} s "
          f"({100 * c['mean_jct_err']:+.1f} %, tolerance {100 * tol:.1f} %), {time.monotonic() - t0:.0f} s",
          file=sys.stderr)


@pytest.mark.slow  # 10-25 s of a service's jobs: handed out early (tests/conftest.py)
def test_history_as_trace_from_the_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    s = Server(tmp_path, "--cluster", "1x4", "--cpus-per-node", "8", "--round", "0.5").start()
    sd = ("--state-dir", str(tmp_path))
    try:
        with s.client() as c:
            cmd = f"{JOB_PY} {shared_copy(SLEEPY)} --steps 6 --stages 0.01,0.02,0"
            a = submit(c, name="a", command=cmd, gpus=1, model="m")
            b = submit(c, name="b", command=cmd, gpus=2, cpus=2)
            wait_for(lambda: all(c.get(f"/jobs/{j}").json()["state"] == "finished" for j in (a, b)), 60,
                     "both jobs to finish")
        out = tmp_path / "week.jsonl"
        r = runner.invoke(app, ["history", "--as-trace", str(out), *sd])
        assert r.exit_code == 0, r.output
        assert f"wrote 2 finished jobs to {out}" in r.output
        ra, rb = read_jsonl(out).jobs
        assert (ra.id, ra.gpus, ra.iterations, ra.model, rb.gpus, rb.cpus) == (str(a), 1, 6, "m", 2, 2)
        assert rb.attrs["allocations"][0]["cpus"] == 2 and ra.attrs["allocations"][0]["it_s"] > 0
        cl = load_cluster_file(tmp_path / "week.cluster.toml")
        assert (cl.num_nodes, cl.num_gpus, cl.total_cpus) == (1, 4, 8)
        r = runner.invoke(app, ["history", "--as-trace", str(out), "--state", "F", *sd])
        assert r.exit_code != 0 and "--state does not apply" in r.output
        r = runner.invoke(app, ["history", "--as-trace", str(tmp_path / "none.jsonl"), "--until", "2001-01-01", *sd])
        assert r.exit_code == 1 and "no finished job matches" in r.output
        assert not (tmp_path / "none.jsonl").exists()
        r = runner.invoke(app, ["simulate", "--trace", str(out), "--cluster", str(tmp_path / "week.cluster.toml"),
                                "--order", "srtf", "--out", str(tmp_path / "sim"), "--json"])
        assert r.exit_code == 0, r.output
    finally:
        s.stop()
        kill_jobs(tmp_path)


@pytest.mark.parametrize("bad", ["order=nope", "order=fifo,colour=red"])
def test_validate_refuses_bad_stacks_before_starting_anything(tmp_path: Path, bad: str) -> None:
    (tmp_path / "t.csv").write_text("id,arrival,gpus,duration\na,0,1,10\n")
    r = CliRunner().invoke(app, ["validate", "--trace", str(tmp_path / "t.csv"), "--stack", bad,
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and ("nope" in r.output or "colour" in r.output)
    assert not (tmp_path / "o" / "validation.json").exists()


def test_testbed_state_is_where_its_folder_is_from_any_directory(tmp_path: Path, monkeypatch) -> None:
    """``--out quick`` (a relative folder): the server runs in that folder, so a relative --state-dir would
    nest under it and the testbed would wait for a server.json that never comes."""
    monkeypatch.chdir(tmp_path)
    tb = Testbed(Path("quick") / "x", CL, STACKS["srsf+muri"], script=SLEEPY)
    try:
        cmd = tb.command()
        assert tb.workdir == tmp_path.resolve() / "quick" / "x"
        assert Path(cmd[cmd.index("--state-dir") + 1]) == tb.workdir / "state"
    finally:
        assert tb.share is not None
        shutil.rmtree(tb.share)


def test_a_server_that_does_not_come_up_in_time_is_stopped(tmp_path: Path, monkeypatch) -> None:
    start = Testbed.start
    monkeypatch.setattr(Testbed, "start", lambda self: start(self, timeout=0.01))  # spawned, not up yet
    tb = Testbed(tmp_path, CL, STACKS["fifo/proportional/packed"], script=SLEEPY)
    with pytest.raises(RuntimeError, match="did not come up in 0 s"):
        tb.run(workload(), timeout=60)
    assert tb.proc is not None and tb.proc.poll() is not None
