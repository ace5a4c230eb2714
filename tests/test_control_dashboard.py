"""A drained node on the dashboard, in a real headless browser (as tests/test_dashboard.py).

``GPULOOM_SCREENSHOTS=docs/img`` refreshes ``docs/img/dashboard-node-drained.png``.
"""

from __future__ import annotations

import os
from pathlib import Path

from service_util import Server, kill_jobs, submit, wait_for
from test_dashboard import ARGS, CHROMIUM, _browser, _shot


def test_drained_node_is_marked_with_its_reason(tmp_path: Path) -> None:
    sync_playwright = _browser()
    shots = Path(os.environ.get("GPULOOM_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    s = Server(tmp_path, "--cluster", "2x2", "--cpus-per-node", "4", "--round", "0.3").start()
    try:
        admin = s.client()
        j1 = submit(admin, name="train-a", command="sleep 600", gpus=1)
        wait_for(lambda: admin.get(f"/jobs/{j1}").json()["st"] == "R", what="job 1 to run")
        (node,) = admin.get(f"/jobs/{j1}").json()["nodes"]
        r = admin.post(f"/nodes/{node}/drain", json={"reason": "GPU 1 Xid 79", "mode": "wait"})
        assert r.status_code == 200 and r.json()["state"] == "drng"
        j2 = submit(admin, name="train-b", command="sleep 600", gpus=1)
        wait_for(lambda: admin.get(f"/jobs/{j2}").json()["st"] == "R", what="job 2 to run")
        assert admin.get(f"/jobs/{j2}").json()["nodes"] != [node]  # not on the drained node
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1100, "height": 720})
                page.goto(s.url + "/?refresh=500")
                page.wait_for_selector("#login-form", state="visible")
                page.fill("#token", (tmp_path / "admin.token").read_text().strip())
                page.click("#login-form button")
                card = page.wait_for_selector(f"#cluster .node.drained[data-node='{node}'][data-state='drng']")
                assert "drng: GPU 1 Xid 79" in card.inner_text()
                assert page.locator("#cluster .node.drained").count() == 1
                page.wait_for_timeout(700)
                _shot(page, shots / "dashboard-node-drained.png")
            finally:
                browser.close()
    finally:
        s.stop()
        kill_jobs(tmp_path)
