"""The benchmarks are run by hand (``python benchmarks/run.py``): these keep the parts that check
results, or parse their arguments, from breaking unnoticed as the code under them changes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
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


def test_bench_targets_knows_the_reference_checkout_by_its_commit(tmp_path: Path) -> None:
    mod = load("bench_targets")
    assert not mod.is_reference(tmp_path)  # not a git checkout at all
    repo = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    assert mod.is_reference(repo) == head.startswith(mod.REFERENCE)


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
