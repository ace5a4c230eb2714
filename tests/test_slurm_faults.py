"""The fault suite with Slurm as the engine (``gpuloom serve --slurm``, batch jobs and ``--executor slurm-srun``):
the server SIGKILLed at random points, PostgreSQL stopped and restarted mid-run, the state disk filled and freed,
a second server after a database restart.

Each scenario ends as the local executor's do (tests/test_service_faults.py, tests/test_service_chaos.py):
0 lost, 0 stuck, every job run to its end exactly once (its ledger), 0 GPU overlaps in the allocation
records and ``/cluster`` matching the jobs that hold GPUs.  The test Slurm is tests/slurm_util.py's.
"""

from __future__ import annotations

import errno
import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuloom.runtime.exec.executor import LaunchSpec
from gpuloom.runtime.exec.slurm import SlurmExecutor
from gpuloom.runtime.state.store import Store
from service_util import Server, fill, job, job_writable, ledger, stepper_cmd, submit, wait_for
from slurm_util import SlurmCluster, slurm_fixture, wait_until  # noqa: F401 (a fixture)
from test_service_faults import (  # noqa: F401 (pg: a fixture)
    ROOT,
    Arrivals,
    Postgres,
    cluster_matches_store,
    final_check,
    launched,
    ledger_counts,
    overlaps,
    pg,
    ready,
)

LAUNCHERS = {"sbatch": (), "srun": ("--executor", "slurm-srun")}


@pytest.fixture
def serve(slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Server]]:
    """``serve(*args)`` -> a started ``gpuloom serve --slurm all`` on ``tmp_path``'s state (a new one each call,
    as after a crash); every one is stopped after the test, then the test Slurm's jobs are cancelled."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    jobs = job_writable(tmp_path) / "jobs"  # (the server makes it its own: the test's jobs write beside it)
    jobs.mkdir()
    made: list[Server] = []

    def make(*args: str, state: Path = tmp_path) -> Server:
        s = Server(state, "--slurm", "all", "--round", "0.2", "--job-dir", str(jobs), *args).start()
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()
    slurm.cancel_all()
    slurm.run("scancel", "--user=gpuloom", check=False)


def ended(c: Any, jid: int, timeout: float) -> dict[str, Any]:
    return wait_for(lambda: (j := job(c, jid))["state"] in ("finished", "failed", "cancelled") and j, timeout,
                    f"job {jid} to end")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["sbatch", "srun"])
def test_sigkill_at_random_points_every_ledger_exactly_once(serve: Callable[..., Server], launcher: str) -> None:
    """Stepper jobs of 1, 2 or 4 GPUs on the test node's 4 under SRTF with preemption; the server is SIGKILLed
    at random moments (launches before or after their record, preemptions, completions, recovery) and
    started again: every job finishes, every step in its ledger exactly once."""
    rng = random.Random(7)
    args = ("--order", "srtf", "--grace", "10", *LAUNCHERS[launcher])
    steps: dict[int, int] = {}
    s = serve(*args)
    kills = 0
    while kills < 7:
        with s.client() as c:
            for _ in range(rng.choice([1, 1, 2])):
                n = rng.randint(5, 25)
                jid = submit(c, name=f"s{n}", command=stepper_cmd(n, 0.1), gpus=rng.choice([1, 2, 2, 4]),
                             time_limit=f"{10 * n}s")
                steps[jid] = n
        time.sleep(rng.uniform(0.05, 2.0))
        s.kill()
        kills += 1
        s = serve(*args)
    store = Store(f"sqlite:///{s.state_dir / 'gpuloom.db'}")
    try:
        with s.client() as c:
            rows = {jid: ended(c, jid, 180) for jid in steps}
            assert overlaps(store) == [] and cluster_matches_store(c, store)
    finally:
        store.close()
    ledgers = {jid: ledger(r["checkpoint_dir"]) for jid, r in rows.items()}
    assert {jid: (r["state"], r["reason"]) for jid, r in rows.items() if r["state"] != "finished"} == {}
    assert {jid: ledgers[jid] for jid, n in steps.items() if ledgers[jid] != list(range(n))} == {}
    print(f"\nchaos on Slurm ({launcher}): {kills} SIGKILLs of the server, {len(steps)} jobs, "
          f"{sum(steps.values())} steps, {sum(r['preemptions'] for r in rows.values())} preemptions, "
          f"{sum(r['attempts'] for r in rows.values())} launches; 0 steps lost or repeated")


def settle(c: Any, store: Store, arrivals: Arrivals, ledger: Path) -> dict[str, Any]:
    """After the fault: nothing left to record, the cluster as the store has it; arrivals go on 2 s more, then
    every job acknowledged ends, once, with the cluster still matching the store."""
    assert c.get("/health").json()["unrecorded"] == 0
    wait_for(lambda: cluster_matches_store(c, store), timeout=20, what="/cluster to match the store")
    time.sleep(2.0)  # arrivals go on
    arrivals.stop()
    wait_for(lambda: all(j in ledger_counts(ledger) for j in arrivals.acked), timeout=120, what="every job to end")
    wait_for(lambda: all(job(c, j)["state"] == "finished" for j in arrivals.acked), timeout=30,
             what="every end recorded")
    assert cluster_matches_store(c, store) and arrivals.errors == []
    return final_check(store, arrivals.acked, ledger)


def hold_job(c: Any, d: Path, ledger: Path, then: str = "") -> tuple[int, Path]:
    """A job that runs until the test touches the file returned (then runs ``then``), started and its launch
    recorded."""
    started, go = d / "started", d / "go"
    jid = submit(c, command=f"touch {started}; until [ -e {go} ]; do sleep 0.05; done; {then}"
                            f"echo $GPULOOM_JOB_ID >> {ledger}", gpus=1)
    wait_for(lambda: started.exists() and launched(job(c, jid)), timeout=60,
             what="the held job to start and its launch to be recorded")
    return jid, go


@pytest.mark.parametrize("launcher", ["sbatch", "srun"])
def test_postgres_stopped_and_restarted_while_slurm_jobs_run_and_end(serve: Callable[..., Server], pg: Postgres,  # noqa: F811
                                                                      tmp_path: Path, launcher: str) -> None:
    """PostgreSQL stops for 15 s while Slurm jobs run and end: their ends wait in the service and are recorded
    once it is back; nothing starts meanwhile; 0 lost, 0 stuck, each job run once, no GPU given twice."""
    d = job_writable(tmp_path)
    ledger = d / "ledger"
    s = serve("--db", pg.url, "--grace", "2", *LAUNCHERS[launcher])
    store = Store(pg.url)
    arrivals = Arrivals(s.url, s.token, ledger, gap=0.7, first="echo out $GPULOOM_JOB_ID; ").start()
    try:
        with s.client() as c:
            wait_for(lambda: len(ledger_counts(ledger)) >= 2, timeout=60, what="jobs to end")
            held, go = hold_job(c, d, ledger)
            pg.stop()
            t_stop = time.monotonic()
            wait_for(lambda: ready(c)[0] == 503, what="/ready to say so")
            go.touch()
            wait_for(lambda: held in ledger_counts(ledger), timeout=60, what="a job to end while the database is down")
            wait_for(lambda: c.get("/health").json()["unrecorded"] > 0, timeout=60,
                     what="an end waiting to be recorded")
            time.sleep(max(0.0, 15.0 - (time.monotonic() - t_stop)))
            t_start = pg.start()
            wait_for(lambda: ready(c)[0] == 200, timeout=60, what="/ready after the restart")
            recovered = time.monotonic() - t_start
            out = settle(c, store, arrivals, ledger)
            assert "out" in c.get(f"/jobs/{max(arrivals.acked)}/logs").text
        row = store.get_job(held)
        assert row is not None and (row.state, row.attempts) == ("finished", 1)
        print(f"\nPostgreSQL down {t_start - t_stop:.1f} s under Slurm ({launcher}): {out['jobs']} jobs, "
              f"{out['launches']} launches, {arrivals.refused} submissions refused meanwhile; ready again "
              f"{recovered:.2f} s after it restarted; 0 lost, 0 stuck, 0 overlaps")
    finally:
        arrivals.stop()
        store.close()


@pytest.mark.skipif(not ROOT, reason="mounting a small tmpfs needs root")
@pytest.mark.parametrize("launcher", ["sbatch", "srun"])
def test_state_disk_filled_and_freed_while_slurm_jobs_print(serve: Callable[..., Server], tmp_path: Path,
                                                            tmpfs: Callable[[str, str], Path], launcher: str) -> None:
    """The state disk (the database, and the jobs' logs the service copies Slurm's output into) fills while
    Slurm jobs print and end: their ends wait, nothing starts; once space is freed every job ends once, and
    each log has its output once."""
    state = tmpfs("state", "48m")
    d = job_writable(tmp_path)
    ledger = d / "ledger"
    s = serve("--grace", "2", *LAUNCHERS[launcher], state=state)
    store = Store(f"sqlite:///{state / 'gpuloom.db'}")
    lines = "seq 1 2000 | sed s/^/line/; "
    arrivals = Arrivals(s.url, s.token, ledger, gap=0.7, first=lines).start()
    try:
        with s.client() as c:
            wait_for(lambda: len(ledger_counts(ledger)) >= 2, timeout=60, what="jobs to end")
            held, go = hold_job(c, d, ledger, lines)  # (its output comes while the disk is full)
            filler = fill(state)
            t_full = time.monotonic()
            assert ready(c)[0] == 503
            go.touch()
            wait_for(lambda: held in ledger_counts(ledger), timeout=60, what="a job to end on the full disk")
            wait_for(lambda: c.get("/health").json()["unrecorded"] > 0, timeout=60,
                     what="an end waiting to be recorded")
            time.sleep(max(0.0, 5.0 - (time.monotonic() - t_full)))
            filler.unlink()
            t_free = time.monotonic()
            wait_for(lambda: ready(c)[0] == 200, timeout=60, what="/ready once space is freed")
            recovered = time.monotonic() - t_free
            out = settle(c, store, arrivals, ledger)
            logs = {j: c.get(f"/jobs/{j}/logs").text for j in {*arrivals.acked, held}}
        numbered = [f"line{i}" for i in range(1, 2001)]
        assert {j for j, text in logs.items() if [ln for ln in text.splitlines() if ln.startswith("line")]
                != numbered} == set()
        print(f"\nstate disk full {t_free - t_full:.1f} s under Slurm ({launcher}): {out['jobs']} jobs, "
              f"{out['launches']} launches, {arrivals.refused} submissions refused meanwhile; ready again "
              f"{recovered:.2f} s after space was freed; 0 lost, 0 stuck, 0 overlaps, every log whole")
    finally:
        arrivals.stop()
        store.close()


def test_a_copy_into_a_log_its_disk_refuses_is_undone_and_made_once_later(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The append went through, the record of how far the copy got did not (the disk filled in between): the
    append is undone, so the next copy, from the same byte, leaves each line in the log once."""
    from gpuloom.runtime.exec import logmirror

    local = tmp_path / "j.log"
    local.write_bytes(b"a\n")
    record = logmirror.set_mirror_offset

    def full(*_: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(logmirror, "set_mirror_offset", full)
    assert not logmirror.copy_new(str(local), "slurm", "/out/j.log", 0, b"b\nc\n")
    assert local.read_bytes() == b"a\n" and logmirror.mirror_offset(str(local), "slurm", "/out/j.log") == 0
    monkeypatch.setattr(logmirror, "set_mirror_offset", record)
    assert logmirror.copy_new(str(local), "slurm", "/out/j.log", 0, b"b\nc\n")
    assert local.read_bytes() == b"a\nb\nc\n" and logmirror.mirror_offset(str(local), "slurm", "/out/j.log") == 4


@pytest.mark.parametrize("launcher", ["sbatch", "srun"])
def test_a_second_server_after_a_database_restart_adopts_the_slurm_jobs_and_the_first_gives_up(
        serve: Callable[..., Server], pg: Postgres, tmp_path: Path, launcher: str) -> None:  # noqa: F811
    """The first server is stopped (SIGSTOP) while PostgreSQL restarts, and a second one takes the database:
    it adopts the Slurm jobs; the first, resumed, gives up (exit 3) and touches none of them; each runs once."""
    d = job_writable(tmp_path)
    ledger = d / "ledger"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = serve("--db", pg.url, *LAUNCHERS[launcher], state=tmp_path / "a")
    store = Store(pg.url)
    try:
        with a.client() as c:
            cmd = f"while [ ! -e {d}/end ]; do sleep 0.05; done; echo $GPULOOM_JOB_ID >> {ledger}"
            ids = [submit(c, command=cmd, gpus=1) for _ in range(4)]
            wait_for(lambda: all(launched(job(c, j)) for j in ids), timeout=90, what="the jobs to run")
        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)
        pg.stop()
        pg.start()
        b = serve("--db", pg.url, *LAUNCHERS[launcher], state=tmp_path / "b")
        with b.client() as c:
            wait_for(lambda: all("adopt" in [e["kind"] for e in c.get(f"/jobs/{j}/events").json()] for j in ids),
                     timeout=60, what="the second server to adopt the jobs")
            a.proc.send_signal(signal.SIGCONT)
            assert a.proc.wait(timeout=60) == 3, (tmp_path / "a" / "serve.out").read_text()[-2000:]
            time.sleep(1.0)  # rounds of the second server: every job still its own, running
            rows = [job(c, j) for j in ids]
            assert {(r["state"] in ("launching", "running", "running_protected"), r["attempts"]) for r in rows} == \
                {(True, 1)}, rows
            (d / "end").touch()
            wait_for(lambda: all(job(c, j)["state"] == "finished" for j in ids), timeout=90,
                     what="the jobs to end under the second server")
            assert cluster_matches_store(c, store)
        out = final_check(store, set(ids), ledger)
        assert out["launches"] == 4  # adopted, not launched again
    finally:
        if a.proc is not None and a.proc.poll() is None:
            a.proc.send_signal(signal.SIGCONT)
        store.close()


def test_a_resume_after_the_wall_clock_stepped_back_is_a_new_slurm_job(slurm: SlurmCluster, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped job is kept held in Slurm for its resume, which releases it once the wall clock has passed the
    second of its requeue (slurmd refuses launch credentials as old as that).  The wall clock steps back 2 h
    in between: that release would wait 2 h (and slurmd would refuse the job till then), so the resume is a new
    Slurm job, which starts at once."""
    ex = SlurmExecutor(f"glclock{uuid.uuid4().hex[:6]}", grace_s=5.0, env=slurm.env, start_wait_s=20.0)
    ex.read_nodes()
    log = tmp_path / "c.log"
    spec = LaunchSpec("c", 'echo "run ${GPULOOM_RESUME:-0}"; sleep 30', "gpn0", (1,), (0,), 100, str(log), {},
                      attempt=1)
    try:
        first = ex.launch(spec)
        wait_until(lambda: "run 0" in log.read_text(), 30, "the first run")
        assert ex.stop("c", 5.0) == 143 and "c" in ex.held
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() - 7200.0)  # (this process's wall clock alone)
        again = ex.launch(LaunchSpec("c", spec.command, "gpn0", (1,), (0,), 100, str(log), {"GPULOOM_RESUME": "1"},
                                     attempt=2))
        wait_until(lambda: ex.poll() == {} and "run 1" in log.read_text(), 30, "the resumed run")
        assert again.pid != first.pid and slurm.job(first.pid)["JobState"] == "CANCELLED"
    finally:
        monkeypatch.undo()
        slurm.cancel_all()
