"""``gpuloom simulate`` writes the same bytes as it did before its speed-ups, for several stacks.

The expected digests were made by the command at commit a05ac5a, before the start-up and exit changes: a
change that alters one byte of ``jobs.csv``, ``series.csv``, ``summary.json`` or ``report.md`` of these runs
fails here.  Only what changes from run to run is left out: wall times, the
run's start, the folder the files went to and the version of gpuloom.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuloom import __version__
from gpuloom.cli import app

#: the stacks run, by name: options after ``--trace <the trace>``
STACKS: dict[str, list[str]] = {
    "fifo": ["--cluster", "4x4"],
    "srtf-non-sticky": ["--cluster", "4x4", "--order", "srtf", "--place", "packed-non-sticky",
                        "--restart-overhead", "30"],
    "2d-las-random": ["--cluster", "3x4", "--order", "2d-las", "--place", "random-sticky", "--seed", "7",
                      "--reschedule-on", "both"],
    "las-window": ["--cluster", "4x4", "--order", "las", "--measure-jobs", "10:40", "--round", "300",
                   "--launch-overhead", "5"],
}
FILES = ("jobs.csv", "series.csv", "summary.json", "report.md")
#: lines that change from run to run
VARYING = (b"wall_time_s", b"wall time", b'"started"')


def write_philly(path: Path, n: int = 48) -> Path:
    """A Philly job list of ``n`` jobs (``timestamp,duration,num_gpus,gpu_time,cluster``), not sorted by time."""
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for k in range(n):
        minute = (k * 37) % 240  # submissions over four hours, out of order
        dur = float(60 + (k * 7919) % 9000)
        gpus = (1, 1, 2, 4, 1, 8)[k % 6]
        lines.append(f"2017-10-09 {6 + minute // 60:02d}:{minute % 60:02d}:{(k * 13) % 60:02d},{dur},{gpus},"
                     f"{dur * gpus},{('vc1', 'vc2', 'vc3')[k % 3]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def digests(folder: Path, tmp: Path) -> dict[str, str]:
    """SHA-256 of each of :data:`FILES`, without the :data:`VARYING` lines, the temporary folder's path and the
    version."""
    out = {}
    for name in FILES:
        data = (folder / name).read_bytes()
        if not name.endswith(".csv"):
            data = b"".join(x for x in data.splitlines(keepends=True) if not any(w in x for w in VARYING))
            data = data.replace(str(tmp).encode(), b"<tmp>").replace(__version__.encode(), b"<version>")
        out[name] = hashlib.sha256(data).hexdigest()
    return out


#: each stack's digests, as the command wrote them at a05ac5a
EXPECTED: dict[str, dict[str, str]] = {
    "fifo": {
        "jobs.csv": "716d74f88453f702a1ed6b2c345de9967c25766c7f0752211962c8db93a35288",
        "series.csv": "cf0a34adb274d53c31683c56d041cfd11051ddcc34e69e0f8c70f32d064c5b81",
        "summary.json": "96050fcaa8cccee5f83472275d0c27ede9b211cb3183ca229f47a19e3df43ed5",
        "report.md": "8c98894b1e158852d354589948777be3167538f0796d39be9b7a0a5fb25edd62",
    },
    "srtf-non-sticky": {
        "jobs.csv": "c865f3ea187aad1fe7e6af1afe9ecf8e5a16ddd8e61352dac9088ab63873be4c",
        "series.csv": "0344ff852285d7761ab3cf4993341e1332f2109d2e7e417c03e44052a7be6f8d",
        "summary.json": "537cff10731393907f730cad461e4e0fa0b465931c6d59a526bfaf0c6c6d4a9c",
        "report.md": "7c73ca75c3df4f6f1da13dbc7c3a1b8a6731c484c7c568e05560c5731917f881",
    },
    "2d-las-random": {
        "jobs.csv": "a08bd99d047bf25f5690c6dbdaf14d48fc629ffcffae5eaff48b145ba1671aa0",
        "series.csv": "c9c5045d33d4ed297a88c9265fb3c0c7045d1a27d5df1958dabf9b08de367bfe",
        "summary.json": "a0b2915e0f328dd3f2dfd68554dbf15422ef95a39bb8222a4f86b27253b04407",
        "report.md": "b2a454a60b9d652c8666f9e5c8613f7c74efb5f9432b1e9be36642f7326c5bd9",
    },
    "las-window": {
        "jobs.csv": "3af9ccc472118e29f94f9889505b9648ea4faaa4d6a2a7806f66863d6322a554",
        "series.csv": "37ecb949f561e7a7cdf9595bcb3de7bced92861500bf886f7ea8ca64e700f905",
        "summary.json": "8ed4b0b64aeef3adfd2a3f16e777b7661281157dae43b32c9f6d029c0097433a",
        "report.md": "6eeaa38306aab3ad52f857c791486dd8659075effd179dfbae39f3e910c82604",
    },
}


@pytest.mark.parametrize("stack", list(STACKS))
def test_simulate_writes_the_bytes_it_wrote_before(stack: str, tmp_path: Path) -> None:
    trace = write_philly(tmp_path / "philly.csv")
    r = CliRunner().invoke(app, ["simulate", "--trace", str(trace), *STACKS[stack], "--no-plots",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert digests(tmp_path / "o", tmp_path) == EXPECTED[stack]
