"""GPU telemetry through NVML, driven by the file-backed fake NVML (``GPULOOM_FAKE_NVML``): exact readings
end up per GPU and per job in ``/metrics``, in ``GET /jobs/{id}/gpus`` and, totalled, in ``/history``;
"busy" follows the process and the GPUs' utilisation; without NVML nothing is sampled and nothing fails."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpuloom.core.cluster import Cluster
from gpuloom.core.lifecycle import JobState
from gpuloom.runtime.api.app import create_app, ensure_admin_token
from gpuloom.runtime.exec import fakenvml
from gpuloom.runtime.exec.clock import ManualClock
from gpuloom.runtime.exec.gpustats import GpuSampler, load_nvml, read_all
from gpuloom.runtime.exec.router import local_executor
from gpuloom.runtime.service.config import ServiceConfig
from gpuloom.runtime.service.service import Service
from gpuloom.runtime.state.store import Store
from gpuloom.scheduler import Scheduler
from service_util import own_cgroup_parent

A100 = {"name": "NVIDIA A100-SXM4-40GB", "mem_total_mb": 40960}


def write_gpus(path: Path, *gpus: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"gpus": [{**A100, **g} for g in gpus]}))
    tmp.replace(path)  # whole: the sampler never reads half a file


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml.json"
    write_gpus(path, {"util": 80, "mem_used_mb": 1000, "power_w": 200, "temp_c": 60},
               {"util": 60, "mem_used_mb": 3000, "power_w": 100, "temp_c": 55})
    monkeypatch.setenv(fakenvml.ENV, str(path))
    return path


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    made: list[Service] = []
    parents = own_cgroup_parent()
    parent = next(parents)

    def _make(clock: ManualClock, gpus: int = 2) -> Service:
        cl = Cluster.homogeneous(1, gpus)
        svc = Service(Store(f"sqlite:///{tmp_path / 'db.sqlite'}"), cl,
                      local_executor(cl, tmp_path / "run", True, parent), Scheduler.from_names("fifo"),
                      ServiceConfig(tmp_path, round_s=1000.0, grace_s=0.0, clock=clock))
        made.append(svc)
        return svc

    yield _make
    for svc in made:
        svc.terminate_all()
        svc.shutdown()
        svc.store.close()
    next(parents, None)


def sampled(svc: Service, util0: float, timeout: float = 10.0) -> None:
    """Wait until the executor's sampler has read GPU 0 at ``util0`` (it samples every 2 s, off the loop)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = svc.executor.gpu_readings().get("node-0", {})
        if 0 in got and got[0].util == util0:
            return
        time.sleep(0.05)
    raise AssertionError(f"the sampler did not read GPU 0 at {util0}%")


def scrape(c: TestClient, h: dict[str, str]) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(c.get("/metrics", headers=h).text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_the_fake_reads_as_pynvml_does(fake: Path) -> None:
    nvml = load_nvml()
    assert nvml is fakenvml
    nvml.nvmlInit()
    got = read_all(nvml, 5.0)
    assert [(r.util, r.mem_used_mb, r.mem_total_mb, r.power_w, r.temp_c) for r in got.values()] == \
        [(80.0, 1000.0, 40960.0, 200.0, 60.0), (60.0, 3000.0, 40960.0, 100.0, 55.0)]
    write_gpus(fake, {"util": 5, "mem_used_mb": 1})  # no power or temperature sensor
    (r,) = read_all(nvml, 6.0).values()
    assert (r.time, r.util, r.power_w, r.temp_c) == (6.0, 5.0, None, None)
    fake.write_text("{not json")
    with pytest.raises(fakenvml.NVMLError, match="nvml.json"):
        read_all(nvml, 7.0)


def test_without_nvml_nothing_is_sampled_and_it_is_said_once(monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(fakenvml.ENV, "/nonexistent/nvml.json")
    s = GpuSampler(period_s=0.01)
    with caplog.at_level(logging.INFO, logger="gpuloom.runtime.exec.gpustats"):
        assert s.readings() == {}
        end = time.monotonic() + 5
        while s.available is None and time.monotonic() < end:
            time.sleep(0.01)
        assert s.readings() == {}
    s.close()
    assert s.available is False
    said = [r for r in caplog.records if "NVML unavailable" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


def test_readings_reach_metrics_the_job_and_its_history(make: Any, fake: Path, tmp_path: Path) -> None:
    clock = ManualClock(1_700_000_000.0)
    svc = make(clock)
    admin = ensure_admin_token(svc.store, tmp_path)
    h = {"Authorization": f"Bearer {admin}"}
    jid = svc.submit({"name": "train", "command": "sleep 60", "gpus": 2}, "alice")
    gpus = json.loads(fake.read_text())["gpus"]
    write_gpus(fake)  # no GPU to read until the job runs: its first round cannot sample it, however threads interleave
    svc.round()  # launched, and the sampler started: no reading yet
    write_gpus(fake, *gpus)
    sampled(svc, 80.0)
    clock.advance(2)
    svc.round()  # the job's first sample: no interval yet, so no energy
    clock.advance(10)
    svc.round()  # 10 s later: 300 W x 10 s
    with TestClient(create_app(svc)) as c:
        m = scrape(c, h)
        now = c.get(f"/jobs/{jid}/gpus", headers=h).json()
    lab = {"node": "node-0", "job": str(jid), "user": "alice"}
    key = {g: tuple(sorted({**lab, "gpu": str(g)}.items())) for g in (0, 1)}
    assert {g: m["gpuloom_gpu_utilization"][key[g]] for g in (0, 1)} == {0: 80.0, 1: 60.0}
    assert {g: m["gpuloom_gpu_memory_used_bytes"][key[g]] for g in (0, 1)} == {0: 1000 * 2**20, 1: 3000 * 2**20}
    assert m["gpuloom_gpu_memory_total_bytes"][key[0]] == 40960 * 2**20
    assert {g: m["gpuloom_gpu_power_watts"][key[g]] for g in (0, 1)} == {0: 200.0, 1: 100.0}
    assert {g: m["gpuloom_gpu_temperature_celsius"][key[g]] for g in (0, 1)} == {0: 60.0, 1: 55.0}
    job_key = (("job", str(jid)), ("user", "alice"))
    assert m["gpuloom_job_gpu_utilization"] == {job_key: 70.0}
    assert m["gpuloom_job_gpu_memory_used_bytes"] == {job_key: 4000 * 2**20}
    assert m["gpuloom_node_gpus_busy"][(("node", "node-0"),)] == 2.0  # its process runs and the GPUs compute
    assert [(g["gpu"], g["util"], g["mem_used_mb"], g["power_w"], g["temp_c"]) for g in now["now"]] == \
        [(0, 80.0, 1000.0, 200.0, 60.0), (1, 60.0, 3000.0, 100.0, 55.0)]
    assert now["total"] == {"gpu_util_mean": 70.0, "gpu_util_max": 80.0, "gpu_mem_max_mb": 4000.0,
                            "gpu_energy_wh": round(3000 / 3600, 3), "gpu_samples": 2}
    # the GPUs go idle: busy no more, though the process still runs
    write_gpus(fake, {"util": 0, "mem_used_mb": 500, "power_w": 50, "temp_c": 40},
               {"util": 0, "mem_used_mb": 500, "power_w": 50, "temp_c": 40})
    sampled(svc, 0.0)
    clock.advance(4)
    svc.round()  # + 100 W x 4 s; mean 0
    assert svc.telemetry.gpu_use()["busy"]["node-0"] == set()
    svc.cancel(jid, "alice", False)
    svc.round()
    assert svc.store.get_job(jid).state == JobState.CANCELLED.value
    with TestClient(create_app(svc)) as c:
        (rec,) = c.get("/history", params={"job": jid}, headers=h).json()
    assert {k: rec[k] for k in ("gpu_util_mean", "gpu_util_max", "gpu_mem_max_mb", "gpu_energy_wh", "gpu_samples")} \
        == {"gpu_util_mean": round(140 / 3, 1), "gpu_util_max": 80.0, "gpu_mem_max_mb": 4000.0,
            "gpu_energy_wh": round(3400 / 3600, 3), "gpu_samples": 3}


def test_a_sleep_job_is_busy_at_launch_without_nvml(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fakenvml.ENV, "/nonexistent/nvml.json")  # NVML absent (whatever this machine has)
    svc = make(ManualClock(1_700_000_000.0))
    jid = svc.submit({"name": "nap", "command": "sleep 60", "gpus": 1}, "alice")
    svc.round()
    assert svc.jobs[str(jid)].lifecycle.state is JobState.LAUNCHING  # no progress line yet (nor ever)
    assert svc.telemetry.gpu_use()["busy"]["node-0"] == {0}
    assert svc.telemetry.sample()["busy"] == 1.0


@pytest.mark.slow  # 10-25 s of sampling: handed out early (tests/conftest.py)
def test_show_and_history_print_the_jobs_gpu_use(tmp_path: Path, fake: Path) -> None:
    from typer.testing import CliRunner

    from gpuloom.cli import app
    from service_util import Server, kill_jobs, wait_for

    (tmp_path / "state").mkdir()
    s = Server(tmp_path / "state", "--cluster", "1x2", "--cpus-per-node", "2", "--round", "0.3").start()
    try:
        c = s.client()
        jid = c.post("/jobs", json={"name": "t", "command": "sleep 600", "gpus": 2}).json()["id"]
        wait_for(lambda: (c.get(f"/jobs/{jid}/gpus").json()["total"] or {}).get("gpu_samples", 0) >= 2,
                 what="two GPU samples of the job")
        sd = ("--state-dir", str(tmp_path / "state"))
        out = CliRunner().invoke(app, ["show", str(jid), *sd]).output
        line = next(x for x in out.splitlines() if "GPUUtil=" in x)
        assert line.split()[:2] == ["GPUUtil=70%/80%", "GPUMemMax=4000MiB"] and "GPUEnergy=" in line
        assert c.delete(f"/jobs/{jid}").status_code == 200
        out = CliRunner().invoke(app, ["history", *sd]).output
        assert "GPU-UTIL" in out and "70%/80%" in out and "4000MiB" in out
    finally:
        s.stop()
        kill_jobs(tmp_path / "state")
