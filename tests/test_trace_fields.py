"""The trace readers' shared field toolkit (exact error messages), the one parser of Synergy's
profile file (one error type from every former entry point), and model names matched through
normalise_model inside the readers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuloom.core.job import JobSpec
from gpuloom.core.parse import FieldError
from gpuloom.perf.scaling import synergy_curves
from gpuloom.perf.sensitivity import SensitivityError, load_catalogue
from gpuloom.perf.synergy_profiles import ProfileFileError, read_profile_rows
from gpuloom.sim.traces import TraceError, load_trace, read_synergy_profiles, save_trace
from gpuloom.sim.traces.fields import (
    Builder,
    Header,
    Where,
    check_width,
    first_row,
    float_field,
    int_field,
    read_rows,
    str_field,
)

# --------------------------------------------------------------------------- toolkit messages


@pytest.fixture
def w(tmp_path: Path) -> Where:
    where = Where(tmp_path / "f.csv")
    where.line = 7
    return where


def message(fn, *args, **kw) -> str:  # noqa: ANN001, ANN002, ANN003
    with pytest.raises(TraceError) as e:
        fn(*args, **kw)
    assert isinstance(e.value, FieldError) and isinstance(e.value, ValueError)
    return str(e.value)


def test_field_converters(w: Where) -> None:
    assert int_field("4", "gpus", w) == 4 and int_field("4.0", "gpus", w) == 4
    assert int_field("0", "n", w, low=0) == 0
    assert message(int_field, "x", "num_gpus", w) == "f.csv:7: field 'num_gpus': expected a positive integer, got 'x'"
    assert message(int_field, "2.5", "n", w) == "f.csv:7: field 'n': expected a positive integer, got '2.5'"
    assert message(int_field, "-1", "n", w, low=0) == "f.csv:7: field 'n': expected an integer >= 0, got '-1'"
    assert float_field("0", "t", w) == 0.0 and float_field(" 1.5", "t", w) == 1.5
    assert message(float_field, "-1", "time", w) == "f.csv:7: field 'time': expected a number >= 0, got '-1'"
    assert message(float_field, "0", "d", w, positive=True) == "f.csv:7: field 'd': expected a number > 0, got '0'"
    assert message(float_field, "inf", "d", w) == "f.csv:7: field 'd': expected a number >= 0, got 'inf'"
    assert str_field("  a ", "id", w) == "a"
    assert message(str_field, "  ", "id", w) == "f.csv:7: field 'id': must not be empty"


def test_rows_header_width(tmp_path: Path) -> None:
    p = tmp_path / "h.csv"
    p.write_bytes(b"\xef\xbb\xbfa, b ,c\r\n\r\n1,2,3\r\n4,5\r\n")  # BOM, CRLF, a blank line
    w = Where(p)
    rows = read_rows(p, w)
    h = Header(first_row(rows, p), ("a", "b"), w)
    assert (h.names, h.pos["b"], h.width, w.line) == (["a", "b", "c"], 1, 3, 1)
    assert next(rows) == ["1", "2", "3"] and w.line == 3
    check_width(["1", "2", "3"], 3, w)
    row = next(rows)
    assert message(check_width, row, 3, w) == "h.csv:4: expected 3 fields, got 2"
    assert message(Header, ["a", "c"], ("a", "b", "d"), w) == "h.csv:4: header lacks column(s) b, d; has a, c"
    q = tmp_path / "blank.csv"
    q.write_text("\n \n")
    assert message(first_row, read_rows(q, Where(q)), q) == "blank.csv: empty file"
    assert message(lambda: list(read_rows(tmp_path / "nope.csv", w))).startswith("nope.csv: cannot open: ")
    b = tmp_path / "bin.csv"
    b.write_bytes(b"a,b\n\xff\xfe,1\n")
    assert message(lambda: list(read_rows(b, Where(b)))).endswith("not a UTF-8 text file")
    big = tmp_path / "big.csv"
    big.write_text("a\n" + "x" * 200_000 + "\n")
    assert message(lambda: list(read_rows(big, Where(big)))).startswith("big.csv:2: malformed CSV: field larger")


def test_builder(tmp_path: Path) -> None:
    p = tmp_path / "b.csv"
    w = Where(p)
    b = Builder(p, "x")
    assert message(b.done) == "b.csv: empty trace: no data rows"
    b.rows = 2
    b.skip("cpu-only")
    b.skip("cpu-only")
    assert message(b.done) == "b.csv: empty trace: no jobs (2 cpu-only skipped)"
    w.line = 2
    b.add(w, JobSpec, "j", 5.0, 1, 10.0)
    w.line = 3
    b.add(w, JobSpec, "k", 1.0, 2, 10.0)
    w.line = 5
    assert message(b.add, w, JobSpec, "j", 0.0, 1, 1.0) == "b.csv:5: field 'id': duplicate job id 'j' (first on line 2)"
    assert message(b.add, w, JobSpec, "z", 0.0, 0, 1.0).startswith("b.csv:5: ")  # JobSpec's own check
    tr = b.done(origin=1)
    assert [j.id for j in tr.jobs] == ["k", "j"] and tr.skipped == {"cpu-only": 2} and tr.meta == {"origin": 1}


# --------------------------------------------------------------------------- Synergy's profile file, parsed once

HEAD = "model_file,cpus,mem,speed,batch,placement_penalty,speedup,iter_time,iter_time_base,tput_rows(cpu_idx x mem_idx)\n"
MATRIX = " | ".join(["1,1,1,1,1"] * 9)


def good_row(name: str, iter_time: str = "0.5") -> str:
    return f'{name},3,62.5*2,1,1,1,1.2,{iter_time},,"{MATRIX}"\n'


def test_profile_rows(tmp_path: Path) -> None:
    p = tmp_path / "prof.csv"
    p.write_text(HEAD + good_row("res50_1") + "\n" + good_row("res50_2", ""))
    r1, r2 = read_profile_rows(p)
    assert (r1.name, r1.model, r1.gpus, r1.line, r1.cpus, r1.mem_gb, r1.iter_time, r1.speedup) == (
        "res50_1", "res50", 1, 2, 3.0, 125.0, 0.5, 1.2)
    assert r1.tput is not None and len(r1.tput) == 9 and r1.tput[0] == (1.0,) * 5
    assert (r2.line, r2.iter_time) == (4, None)  # an empty iter_time cell: not measured


BAD_PROFILES: list[tuple[str, str, int | None, str | None, str]] = [
    # (body after the header, line, field, words)
    (good_row("a_1") + 'b_1,os.system(1),1,1,1,1,1,1,,"1"\n', 3, "cpus", "unsupported expression element Call"),
    (good_row("a_1", "0"), 2, "iter_time", "expected a number > 0, got '0'"),
    ('alexnet,1,1,1,1,1,1,1,,"1"\n', 2, "model_file", "'alexnet' is not MODEL_GPUS"),
    (good_row("a_1") + good_row("a_1"), 3, "model_file", "'a_1' given twice (first on line 2)"),
    ('a_1,1,1,1,1,1,1,1,,"1,1,x | 1,1,1"\n', 2, "tput_rows", "tput row 0: "),
    ('a_1,1,1,1,1,1,1,1,,"1,1,1 | 1,1"\n', 2, "tput_rows", "tput rows have different lengths [2, 3]"),
    ('a_1,,1,1,1,1,1,1,,"1"\n', 2, "cpus", "must not be empty"),
    ("a_1,1,1\n", 2, None, "3 fields, the header has 10"),
    ("", None, None, "no profiles"),
]


def entry_points(p: Path) -> dict[str, object]:
    return {
        "read_profile_rows": lambda: read_profile_rows(p),
        "load_catalogue": lambda: load_catalogue(p),
        "synergy_curves": lambda: synergy_curves(p),
        "read_synergy_profiles": lambda: read_synergy_profiles(p),
    }


@pytest.mark.parametrize(("body", "line", "field", "words"), BAD_PROFILES,
                         ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD_PROFILES)])
def test_profile_errors_are_one_type_from_every_entry_point(tmp_path: Path, body: str, line: int | None,
                                                            field: str | None, words: str) -> None:
    p = tmp_path / "prof.csv"
    p.write_text(HEAD + body)
    texts = set()
    for name, call in entry_points(p).items():
        with pytest.raises(ProfileFileError) as ei:
            call()  # type: ignore[operator]
        e = ei.value
        assert isinstance(e, SensitivityError) and isinstance(e, FieldError), name
        assert (Path(e.path or "").name, e.line, e.field) == ("prof.csv", line, field), name
        assert words in str(e), name
        texts.add(str(e))
    assert len(texts) == 1  # the same message whichever way the file was read
    (tmp_path / "t.csv").write_text("0,a,0,10,1\n")
    with pytest.raises(TraceError) as ti:
        load_trace(tmp_path / "t.csv", "synergy", profiles=p)
    assert str(ti.value) == texts.pop() and isinstance(ti.value.__cause__, ProfileFileError)


def test_profile_file_level_errors(tmp_path: Path) -> None:
    for content, words in (("", "prof.csv: empty file"),
                           ("model_file,cpus\n", "prof.csv:1: missing column(s) mem, iter_time")):
        (tmp_path / "prof.csv").write_text(content)
        for call in entry_points(tmp_path / "prof.csv").values():
            with pytest.raises(ProfileFileError, match="^" + re.escape(words)):
                call()  # type: ignore[operator]
    for call in entry_points(tmp_path / "absent.csv").values():
        with pytest.raises(ProfileFileError, match=r"^absent\.csv: cannot open: No such file"):
            call()  # type: ignore[operator]


def test_catalogue_only_checks_name_line_and_field(tmp_path: Path) -> None:
    p = tmp_path / "prof.csv"
    p.write_text(HEAD + good_row("a_1") + "b_1,1,1,1,1,1,1,1,,\n")  # the trace reader needs no matrix
    assert read_synergy_profiles(p)["b_1"] == {"cpus": 1.0, "mem_gb": 1.0, "iter_time": 1.0, "speedup": 1.0}
    with pytest.raises(ProfileFileError, match=r"^prof\.csv:3: field 'tput_rows': missing"):
        load_catalogue(p)
    p.write_text(HEAD + good_row("res50_1") + good_row("resnet50_1"))  # one model, two spellings
    with pytest.raises(ProfileFileError, match=r"^prof\.csv:3: field 'model_file': .*given twice"):
        load_catalogue(p)
    p.write_text(HEAD + 'a_1,1,1,1,1,1,1,1,,"1,1,1 | 1,1,1"\n')
    with pytest.raises(ProfileFileError, match=r"^prof\.csv:2: field 'tput_rows': a_1 has 2 CPU rows, expected 9"):
        load_catalogue(p)


# --------------------------------------------------------------------------- model names inside the readers

def test_readers_match_models_by_normalised_name(tmp_path: Path) -> None:
    prof = tmp_path / "model_sensitivity_profiles.csv"
    prof.write_text(HEAD + good_row("res50_1", "0.25") + good_row("res50_2", "0.5"))
    t = tmp_path / "syn.csv"
    t.write_text("0,ResNet-50,0,100,1\n1,resnet50,1,100,4\n2,vae,2,10,1\n")
    a, b, c = load_trace(t, "synergy", iter_times={"VAE": 0.1})
    assert (a.iter_time, b.iter_time, c.iter_time) == (0.25, 0.5, 0.1)  # 4 GPUs: nearest lower row, res50_2
    assert a.model == "ResNet-50" and a.attrs["sensitivity"]["mem_gb"] == 125.0
    s = tmp_path / "w.csv"
    s.write_text("name,time,application,num_replicas,batch_size\na-0,5,deepspeech2,2,64\n")
    assert load_trace(s, durations={"DeepSpeech": 100.0})[0].duration == 100.0
    g = tmp_path / "g.trace"
    g.write_text("ResNet-18 (batch size 128)\tcmd\t--n\t1\t100\t0.0\t1\n"
                 "resnet-18 (batch size 64)\tcmd\t--n\t1\t100\t0.0\t1\n")
    j0, j1 = load_trace(g)
    assert j0.attrs["steps_per_second"] == 4000.0 / 128 and j1.attrs["steps_per_second"] == 4000.0 / 64
    mine = load_trace(g, steps_per_second={"resnet18": 5.0, "ResNet-18 (batch size 64)": 2.0})
    assert [j.attrs["steps_per_second"] for j in mine] == [5.0, 5.0]  # the exact job type is 'resnet-18 (...)'
    mine = load_trace(g, steps_per_second={"resnet18": 5.0, "resnet-18 (batch size 64)": 2.0})
    assert [j.attrs["steps_per_second"] for j in mine] == [5.0, 2.0]


def test_own_csv_keeps_bool_attrs(tmp_path: Path) -> None:
    jobs = [JobSpec("a", 0.0, 1, 10.0, attrs={"spot": True, "tag": "no", "n": 1}),
            JobSpec("b", 1.0, 1, 10.0, attrs={"spot": False, "tag": "yes", "n": 0})]
    save_trace(jobs, tmp_path / "t.csv")
    assert load_trace(tmp_path / "t.csv") == jobs
    assert [type(j.attrs["spot"]) for j in load_trace(tmp_path / "t.csv")] == [bool, bool]
