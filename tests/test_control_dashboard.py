"""A drained node on the dashboard, in a real headless browser (as tests/test_dashboard.py).

``GPULOOM_SCREENSHOTS=docs/img`` refreshes ``docs/img/dashboard-node-drained.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service_util import login, shot, submit, wait_for


def test_drained_node_is_marked_with_its_reason(tmp_path: Path, server: Any, browser: Any, shots: Path) -> None:
    s = server("--cluster", "2x2", "--cpus-per-node", "4", "--round", "0.3")
    admin = s.client()
    j1 = submit(admin, name="train-a", command="sleep 600", gpus=1)
    wait_for(lambda: admin.get(f"/jobs/{j1}").json()["st"] == "R", what="job 1 to run")
    (node,) = admin.get(f"/jobs/{j1}").json()["nodes"]
    r = admin.post(f"/nodes/{node}/drain", json={"reason": "GPU 1 Xid 79", "mode": "wait"})
    assert r.status_code == 200 and r.json()["state"] == "drng"
    j2 = submit(admin, name="train-b", command="sleep 600", gpus=1)
    wait_for(lambda: admin.get(f"/jobs/{j2}").json()["st"] == "R", what="job 2 to run")
    assert admin.get(f"/jobs/{j2}").json()["nodes"] != [node]  # not on the drained node
    page = browser.new_page(viewport={"width": 1100, "height": 720})
    login(page, s.url + "/?refresh=500", (tmp_path / "admin.token").read_text().strip())
    card = page.wait_for_selector(f"#cluster .node.drained[data-node='{node}'][data-state='drng']")
    assert "drng: GPU 1 Xid 79" in card.inner_text()
    assert page.locator("#cluster .node.drained").count() == 1
    page.wait_for_timeout(700)
    shot(page, shots / "dashboard-node-drained.png")
