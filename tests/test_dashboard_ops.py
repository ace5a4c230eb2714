"""The dashboard's operator views in a real headless browser: the queues page (tree, usage vs guarantee vs
limit, over time, zoomable), a job page with GPU telemetry from the fake NVML, readable event details and
no node list as a running job's reason, the job list's filters, search and collapsed arrays.

Screenshots: ``docs/img/dashboard-queues.png`` and ``docs/img/dashboard-job-telemetry.png`` are made
here (``GPULOOM_SCREENSHOTS=docs/img`` refreshes them; else they go to the test's directory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuloom.runtime.exec import fakenvml
from service_util import REPO, Server, kill_jobs, shot, submit, wait_for

GPUS = [{"name": "NVIDIA A100-SXM4-40GB", "util": u, "mem_used_mb": m, "mem_total_mb": 40960, "power_w": p,
         "temp_c": 60} for u, m, p in ((87, 30000, 250), (62, 12000, 180), (0, 0, 60), (0, 0, 60))]


def table(page: Any, rows: str, key: str = "") -> list[tuple[str | None, list[str]]]:
    """(the rows' data-KEY, their cells' text), read in one go (the page redraws itself every refresh)."""
    return [(k, c) for k, c in page.eval_on_selector_all(
        rows, f"rs => rs.map(r => [r.dataset['{key}'] ?? null, [...r.cells].map(c => c.textContent)])")]


def test_queues_page_and_job_telemetry_in_a_browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, browser: Any,
                                                    shots: Path) -> None:
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"gpus": GPUS}))
    monkeypatch.setenv(fakenvml.ENV, str(nvml))  # the server inherits it
    (tmp_path / "state").mkdir()
    s = Server(tmp_path / "state", "--cluster", "2x4", "--cpus-per-node", "8", "--round", "0.3",
               "--queues", str(REPO / "examples" / "queues.toml")).start()
    try:
        admin = s.client()
        alice_t = admin.post("/tokens", json={"user": "alice"}).json()["token"]
        bob_t = admin.post("/tokens", json={"user": "bob"}).json()["token"]
        alice, bob = s.client(alice_t), s.client(bob_t)
        train = submit(alice, name="vit-large", command="sleep 600", gpus=2)  # vision: node-0 GPUs 0, 1
        submit(bob, name="bert", command="sleep 600", gpus=2)
        sweep = submit(bob, name="sweep", command="sleep 600", gpus=1, array="0-5%2", queue="shared")
        wait_for(lambda: alice.get(f"/jobs/{train}").json()["st"] == "R", what="the training job to run")
        wait_for(lambda: alice.get(f"/jobs/{train}/gpus").json()["total"] is not None, what="GPU samples")
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        page.goto(s.url + f"/?refresh=500#/job/{train}")
        page.fill("#token", admin.headers["Authorization"].split()[1])
        page.click("#login-form button")
        # the job page: GPU telemetry from the fake NVML, exact
        page.wait_for_selector("#gpu-now tbody tr")
        rows = [c for _, c in table(page, "#gpu-now tbody tr")]
        assert [r[1:3] + r[4:] for r in rows] == [["0", "87%", "250 W", "60 °C"], ["1", "62%", "180 W", "60 °C"]]
        assert "utilisation mean 74.5%, max 87%" in page.inner_text("#gpu-total")
        page.wait_for_function("document.querySelectorAll('svg[data-chart=gpu-util] path').length == 1")
        # a running job has no reason (its nodes are a field of their own); details read as key: value
        spec = dict(page.eval_on_selector_all("#spec dt", "ds => ds.map(d => [d.textContent, "
                                              "d.nextElementSibling.textContent])"))
        assert spec["reason"] == "-" and spec["nodes"].startswith("node-")
        details = page.eval_on_selector_all("#timeline td.detail", "ds => ds.map(d => d.textContent)")
        assert details and not any(d.startswith("{") for d in details)
        assert any("user: alice" in d for d in details)
        page.set_viewport_size({"width": 1100, "height": 1000})
        page.wait_for_timeout(1500)
        shot(page, shots / "dashboard-job-telemetry.png")
        page.set_viewport_size({"width": 1100, "height": 760})
        # the queues page: the tree, usage vs guarantee vs limit, pending; charts zoom
        page.goto(s.url + "/?refresh=500#/queues")
        page.wait_for_selector("#queues tr[data-queue='vision']")
        cells = dict(table(page, "#queues tbody tr", "queue"))
        assert [cells["research"][i] for i in (2, 3, 4)] == ["4", "6", "7"]  # vision 2 + nlp 2
        assert [cells["vision"][i] for i in (1, 2, 3, 4)] == ["research", "2", "3", "-"]
        # two sweep tasks run, four wait for the array's limit
        assert cells["shared"][2] == "2" and cells["shared"][7] == "4" and "held" in cells["shared"][8]
        page.wait_for_selector("svg[data-chart=queue-vision]")
        page.click("#ranges button[data-range='15m']")
        page.wait_for_selector("#ranges button.on[data-range='15m']")
        page.wait_for_timeout(1200)
        shot(page, shots / "dashboard-queues.png")
        # the job list: an array is one row until expanded; filters and search
        page.goto(s.url + "/?refresh=500#/")
        page.wait_for_selector(f"#queue tr[data-array='{sweep}']")
        assert page.locator(f"#queue tr[data-array='{sweep}'] td").nth(1).inner_text() == "6 tasks"
        assert page.locator("#queue tbody tr").count() == 3  # vit-large, bert, the sweep
        page.click(f"button.toggle[data-array='{sweep}']")
        page.wait_for_function("document.querySelectorAll('#queue tbody tr.task').length == 6")
        page.select_option("#filter-user", "alice")
        page.wait_for_function("document.querySelectorAll('#queue tbody tr').length == 1")
        page.select_option("#filter-user", "")
        page.wait_for_function("document.querySelectorAll('#queue tbody tr').length == 9")
        page.fill("#filter-search", "bert")
        page.press("#filter-search", "Enter")
        page.wait_for_function("(() => { const r = document.querySelectorAll('#queue tbody tr');"
                               " return r.length == 1 && r[0].cells[2].textContent == 'bert'; })()")
    finally:
        s.stop()
        kill_jobs(tmp_path / "state")
