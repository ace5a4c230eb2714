"""The benchmarks are run by hand (``python benchmarks/run.py``): these keep the parts that check
results, or parse their arguments, from breaking unnoticed as the code under them changes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_synergy_round_keeps_tune_promises(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the one-round table checks TUNE's promises with the place policy TUNE placed through
    load("bench_synergy").round_times(data_dir / "synergy" / "model_sensitivity_profiles.csv")
    out = capsys.readouterr().out
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines()[2:] if ln.strip()}
    assert set(rows) == {"proportional", "greedy", "tune", "opt"}
    assert rows["proportional"][3:5] == ["274", "512"] and rows["tune"][3:5] == ["283", "512"]


@pytest.mark.parametrize("argv,parts", [([], ["round"]), (["philly"], ["philly"]), (["round", "philly"], ["round", "philly"]),
                                       (["skip"], ["skip"])])
def test_bench_queues_parts(argv: list[str], parts: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # with no part named it runs 'round' (Python 3.11's argparse refused that default)
    mod = load("bench_queues")
    ran: list[str] = []
    monkeypatch.setattr(mod, "bench_round", lambda: ran.append("round"))
    monkeypatch.setattr(mod, "bench_philly", lambda *a: ran.append("philly"))
    monkeypatch.setattr(mod, "bench_skip", lambda *a: ran.append("skip"))
    monkeypatch.setattr(mod, "DATA", BENCH)  # (a directory: the data check passes)
    monkeypatch.setattr(sys, "argv", ["bench_queues.py", *argv])
    mod.main()
    assert ran == parts


def test_bench_queues_refuses_an_unknown_part(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    mod = load("bench_queues")
    monkeypatch.setattr(sys, "argv", ["bench_queues.py", "rounds"])
    with pytest.raises(SystemExit):
        mod.main()
    assert "invalid choice: 'rounds'" in capsys.readouterr().err


def test_bench_targets_repeats_alternate_and_show_each_sides_fastest(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    mod = load("bench_targets")
    calls: list[str] = []
    walls = {"before": iter([7.0, 5.0, 6.0]), "after": iter([4.0, 3.0, 9.0])}

    def child(checkout: Path, case: str, timeout: float) -> dict:
        side = "before" if checkout == Path("/b") else "after"
        calls.append(side)
        w = next(walls[side])
        return {"wall": w, "cpu": w, "result": f"{side} {w:g}"}

    monkeypatch.setattr(mod, "run_child", child)
    mod.table(["philly"], Path("/b"), 10.0, repeat=3)
    assert calls == ["before", "after"] * 3
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[:4] == ["philly", "5", "s", "5"] and row[5] == "3" and row[7] == "1.7x"
    assert "before 5 | after 3" in " ".join(row)
    assert mod.fastest([{"wall": 2.0, "timeout": True, "result": "t"}, {"error": "x", "result": "f"}])["result"] == "t"
    with pytest.raises(SystemExit):
        mod.main(["--repeat", "0"])


def test_bench_targets_interleaves_the_cases_and_takes_ratios_round_by_round(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # every case on each side once a round, the order reversed every other round; the ratios are taken between
    # the runs of one round (Muri-L against its reference 2D-LAS + muri, and after against before)
    mod = load("bench_targets")
    cpus = {("2d-las-muri-trace1", "before"): iter([10.0, 12.0, 11.0]),
            ("2d-las-muri-trace1", "after"): iter([10.0, 12.0, 11.0]),
            ("muri-l-trace1", "before"): iter([11.0, 13.0, 12.0]),
            ("muri-l-trace1", "after"): iter([9.0, 11.0, 10.0])}
    results = iter(["a", "a", "b"])
    calls: list[tuple[str, str]] = []

    def child(checkout: Path, case: str, timeout: float) -> dict:
        side = "before" if checkout == Path("/b") else "after"
        calls.append((case, side))
        c = next(cpus[case, side])
        return {"wall": c + 1.0, "cpu": c,
                "result": next(results) if (case, side) == ("2d-las-muri-trace1", "before") else "r"}

    monkeypatch.setattr(mod, "run_child", child)
    runs = mod.interleave(["2d-las-muri-trace1", "muri-l-trace1"], Path("/b"), 10.0, 3)
    one = [("2d-las-muri-trace1", "before"), ("2d-las-muri-trace1", "after"), ("muri-l-trace1", "before"),
           ("muri-l-trace1", "after")]
    assert calls == one + one[::-1] + one
    assert [r["cpu"] for r in runs["muri-l-trace1", "after"]] == [9.0, 11.0, 10.0]
    out = capsys.readouterr().out.splitlines()
    table = out[out.index(next(ln for ln in out if ln.startswith("case"))) + 1:out.index(
        next(ln for ln in out if ln.startswith("CPU ratios")))]
    rows = {(ln.split()[0], ln.split()[1]): ln.split() for ln in table}
    assert len(rows) == 4
    assert rows["2d-las-muri-trace1", "before"][2:6] == ["3", "11", "10", "12"]
    assert " ".join(rows["2d-las-muri-trace1", "before"][6:]) == "differs: a / b"
    assert rows["muri-l-trace1", "after"][2:7] == ["3", "10", "9", "11", "r"]
    text = "\n".join(out)
    # after / before: 9/11, 11/13, 10/12; Muri-L / 2D-LAS + muri after: 9/10, 11/12, 10/11; before: 11/10, ...
    assert "muri-l-trace1 after / before: 0.833x  (0.818-0.846x, under 1 in 3/3)" in text
    assert "2d-las-muri-trace1 after / before: 1.000x  (1.000-1.000x, under 1 in 0/3)" in text
    assert ("muri-l-trace1 / 2d-las-muri-trace1 (after): 0.909x  (0.900-0.917x, under 1 in 3/3); "
            "target 1x: median met") in text
    assert ("muri-l-trace1 / 2d-las-muri-trace1 (before): 1.091x  (1.083-1.100x, under 1 in 0/3); "
            "target 1x: median not met") in text
    with pytest.raises(SystemExit):
        mod.main(["--interleave", "-1"])


@pytest.mark.parametrize("before,after,met", [(23.5, 4.9, "yes/yes/yes"), (23.5, 5.2, "no/no/no"),
                                              (30.0, 5.5, "no/no/yes"), (20.0, 4.5, "yes/yes/no")])
def test_bench_targets_meets_a_target_also_by_its_ratio_against_the_reference(
        before: float, after: float, met: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Philly's target, 5 s against the reference's 23.5 s, asks a 4.7x speed-up measured side by side
    mod = load("bench_targets")
    assert mod.needs("philly") == pytest.approx(4.7) and mod.needs("muri-s") == pytest.approx(4.0)
    assert mod.needs("philly-nocheck") is None and mod.needs("place-10240") is None
    monkeypatch.setattr(mod, "run_child", lambda checkout, case, timeout: {
        "wall": before if checkout == Path("/b") else after, "cpu": before if checkout == Path("/b") else after,
        "result": "r"})
    mod.table(["philly"], Path("/b"), 10.0, reference=True)
    out = capsys.readouterr().out
    assert "the targets' reference, f0ff3f3" in out
    row = out.splitlines()[-1].split()
    assert row[9] == "4.7x" and row[10] == met
    # a base that is not the reference gets no ratio verdict
    mod.table(["philly"], Path("/b"), 10.0, reference=False)
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[9] == "-" and row[10] == met.rsplit("/", 1)[0]


@pytest.mark.parametrize("wall,cpu,met", [(12.0, 8.0, "yes/yes"), (13.1, 8.0, "no/yes"), (12.0, 8.1, "yes/no"),
                                          (None, None, "no/no")])
def test_bench_targets_judges_the_command_against_a_plain_run(
        wall: float | None, cpu: float | None, met: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # philly-command: the whole command at most 1.3 times a plain run of its configuration (10 s wall, 6.2 s CPU
    # here), wall by wall and CPU by CPU, not the run inside the command (11 s, 7 s: by that, 13.1 s would meet
    # it); a run that gave no plain run's time (it failed, or timed out) meets nothing
    mod = load("bench_targets")
    assert mod.RATIO_TARGETS == {"philly-command": 1.3}
    after: dict = {"wall": 20.0, "cpu": 20.0, "timeout": True, "result": "t"} if wall is None else \
        {"wall": wall, "cpu": cpu, "plain_wall": 10.0, "plain_cpu": 6.2, "sim_wall": 11.0, "sim_cpu": 7.0,
         "result": "r"}
    monkeypatch.setattr(mod, "run_child", lambda checkout, case, timeout: after if checkout != Path("/b") else
                        {"wall": 20.0, "cpu": 15.0, "plain_wall": 10.0, "plain_cpu": 6.2, "result": "b"})
    mod.table(["philly-command"], Path("/b"), 10.0, reference=False)
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[:3] == ["philly-command", "1.3x", "sim"] and row[10] == met


def test_bench_targets_takes_the_fastest_plain_run_of_the_repeats() -> None:
    # each run's plain run is disturbed apart from its command: the command's fastest run, against the fastest
    # plain run of all (not the one that ran after that command)
    mod = load("bench_targets")
    runs = [{"wall": 13.0, "cpu": 8.0, "plain_wall": 10.0, "plain_cpu": 6.5, "result": "a"},
            {"wall": 12.0, "cpu": 7.9, "plain_wall": 14.0, "plain_cpu": 6.2, "result": "b"},
            {"wall": 30.0, "cpu": 9.0, "timeout": True, "plain_wall": 1.0, "plain_cpu": 1.0, "result": "t"}]
    best = mod.fastest(runs)
    assert (best["wall"], best["cpu"], best["plain_wall"], best["plain_cpu"]) == (12.0, 7.9, 10.0, 6.2)
    assert best["result"].startswith("b; fastest plain run of 2 10 s (cpu 6.2): command 1.20x (cpu 1.27x)")
    assert runs[1]["plain_wall"] == 14.0  # (the runs themselves unchanged)
    assert mod.fastest(runs[:1]) == runs[0]


def test_bench_targets_plain_run_runs_the_pickled_configuration(tmp_path: Path) -> None:
    # the plain run philly-command is judged against: the configuration the command ran, pickled, run again in
    # this process with nothing but Simulator.run timed; the same figures as the run itself
    import pickle

    from gpuloom.core import parse_cluster
    from gpuloom.sim.engine import SimConfig
    from gpuloom.sim.generator import generate
    from gpuloom.sim.runconfig import RunConfig, run_config

    mod = load("bench_targets")
    rc = RunConfig("fifo", "fifo", "none", "proportional", "packed-sticky", True, {},
                   sim=SimConfig(round_len=300.0, restart_overhead=10.0))
    cl, specs = parse_cluster("4x4"), generate(60, 40.0, 3)
    (tmp_path / "config.pickle").write_bytes(pickle.dumps((rc, cl, specs, None)))
    s = run_config(rc, cl, specs).summary()
    got = mod.plain_run(tmp_path / "config.pickle")
    assert got["result"] == f"jct {s['mean_jct_s']:.6g} done {s['completed']}" and s["completed"] == 60
    assert 0 < got["wall"] and 0 < got["cpu"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the age is read from /proc")
def test_bench_targets_times_a_process_from_its_start() -> None:
    # philly-command's wall time is its process's age: a process that sleeps 0.3 s reads an age between
    # that and the time its parent saw pass around it (to a clock tick, 10 ms), not the boot time's rounding
    # more (psutil's create_time read up to a second long)
    code = (f"import sys, time; sys.path.insert(0, {str(BENCH)!r}); time.sleep(0.3); "
            "from bench_targets import process_age; print(process_age())")
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    elapsed = time.monotonic() - t
    age = float(out.stdout)
    assert 0.3 - 0.011 <= age <= elapsed + 0.011


def test_bench_targets_knows_the_reference_checkout_by_its_commit(tmp_path: Path) -> None:
    mod = load("bench_targets")
    assert not mod.is_reference(tmp_path)  # not a git checkout at all
    repo = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    assert mod.is_reference(repo) == head.startswith(mod.REFERENCE)


def test_bench_deps_holds_the_dependent_array_and_judges_the_extra_time(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    mod = load("bench_deps")
    r = mod.case(20, 10, 1)  # this checkout, in process: 10 tasks held on an array of 20
    assert r["held"] == 10 and r["db1_mb"] >= r["db0_mb"] > 0 and r["with_ms"] > 0
    monkeypatch.setattr(mod, "run_child", lambda checkout, name, rounds, timeout: {
        "without_ms": 5.0, "with_ms": 80.0 if checkout == Path("/b") else 40.0,
        "extra_ms": 75.0 if checkout == Path("/b") else 35.0, "extra_cpu_ms": 60.0 if checkout == Path("/b") else 20.0,
        "first_ms": 1.0, "submit_s": 1.0, "held": 1000,
        "db0_mb": 1.0, "db1_mb": 2.0, "rss_mb": 3.0})
    mod.table(["1000-on-1000", "1000-on-10000"], Path("/b"), 3, 10.0)
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()[-4:]]
    assert [(r[0], r[1], r[6]) for r in rows] == [("1000-on-1000", "before", "no/no"), ("1000-on-1000", "after", "yes/yes"),
                                                   ("1000-on-10000", "before", "-"), ("1000-on-10000", "after", "-")]
    with pytest.raises(SystemExit):
        mod.main(["--cases", "1000-on-5"])


def test_bench_scale_reads_the_slowest_round_from_the_histogram(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    mod = load("bench_scale")
    before = {0.01: 3, 0.05: 5, 0.1: 5, float("inf"): 5}
    assert mod._slowest(before, {0.01: 9, 0.05: 12, 0.1: 13, float("inf"): 13}) == 0.1  # one more in (0.05, 0.1]
    assert mod._slowest(before, {0.01: 4, 0.05: 6, 0.1: 6, float("inf"): 6}) == 0.01  # no round slower than 10 ms
    assert mod._slowest(before, {0.01: 4, 0.05: 6, 0.1: 6, float("inf"): 7}) == float("inf")
    monkeypatch.setattr(sys, "argv", ["bench_scale.py", "--db", "sqlite,mysql"])
    with pytest.raises(SystemExit):
        mod.main()
    assert "--db: sqlite or postgres, got 'mysql'" in capsys.readouterr().err


def test_bench_gavel_round_fills_the_cluster_and_solves_gavels_lp(data_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    mod = load("bench_gavel")
    monkeypatch.setattr(mod, "DATA", data_dir)
    got = mod.gpuloom_round(108, 1000, 1)
    assert got["placed"] == 108  # every GPU of the 36 + 36 + 36 given a job
    # the least normalised effective throughput Gavel's own LP (ECOS) reaches on the same 1,000 jobs
    # (bench_gavel's Gavel row, run beside it): the per-kind LP through HiGHS finds the same optimum
    assert got["objective"] == pytest.approx(0.135921, abs=1e-6)
    assert mod.cluster_spec(2048) == {"v100": 684, "p100": 682, "k80": 682}


def test_bench_targets_queue_cases_are_held_to_a_ratio_of_the_run_without_queues(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # the queue stacks' target: at most 1.5x philly-20k's times in the same table
    mod = load("bench_targets")
    walls = {"philly-20k": 2.0, "queues-drf": 2.5, "queues-quota": 4.0}
    monkeypatch.setattr(mod, "run_child", lambda checkout, case, timeout: {
        "wall": walls[case], "cpu": walls[case] - 0.5, "result": "r"})
    mod.table(["philly-20k", "queues-drf", "queues-quota"], None, 10.0)
    rows = [r.split() for r in capsys.readouterr().out.splitlines()[-3:]]
    assert rows[0][:2] == ["philly-20k", "-"]
    assert rows[1][:5] == ["queues-drf", "1.5x", "2.5", "2", "yes/yes"] and "1.2x philly-20k" in " ".join(rows[1])
    assert rows[2][:5] == ["queues-quota", "1.5x", "4", "3.5", "no/no"]
    # without the case it is measured against, no verdict
    mod.table(["queues-drf"], None, 10.0)
    assert capsys.readouterr().out.splitlines()[-1].split()[4] == "-"
