"""The dashboard in a real headless browser (playwright driving the system's Chromium).

Login; the job list updates after a submit; the queue pages (a count of all,
Next and Previous); a job page shows progress; the cancel button works for the
owner and is refused to others; /docs renders with an Authorize button;
nothing is fetched from outside the service; a page left while it loads is
not drawn over the next.

Screenshots go to the test's temporary directory, or to ``$GPULOOM_SCREENSHOTS``
(``GPULOOM_SCREENSHOTS=docs/img`` refreshes the ones in the docs).  Where
Chromium cannot be found the test is skipped with a loud message (``.ci/run``
installs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service_util import shot, submit, wait_for

# prints progress with timestamps until stopped
PROGRESS = ("python3 -c \"import time\nfor i in range(100000):\n"
            "    print('GPULOOM_PROGRESS iter=%d t=%f' % (i * 10, time.time()), flush=True); time.sleep(0.2)\"")


def test_dashboard_in_a_browser(server: Any, browser: Any, shots: Path) -> None:
    s = server("--cluster", "2x2", "--cpus-per-node", "4", "--round", "0.3")
    admin = s.client()
    alice_t = admin.post("/tokens", json={"user": "alice"}).json()["token"]
    bob_t = admin.post("/tokens", json={"user": "bob"}).json()["token"]
    alice, bob = s.client(alice_t), s.client(bob_t)
    j1 = submit(alice, name="resnet-a", command=PROGRESS, gpus=2, mem="4G", time_limit="1:00:00")
    submit(bob, name="bert-b", command="sleep 600", gpus=1)
    wait_for(lambda: alice.get(f"/jobs/{j1}").json()["st"] == "R", what="job 1 to run")
    outside: list[str] = []
    page = browser.new_page(viewport={"width": 1100, "height": 720})
    page.on("request", lambda r: None if r.url.startswith(s.url) else outside.append(r.url))
    page.goto(s.url + "/?refresh=500")
    # login
    page.wait_for_selector("#login-form", state="visible")
    page.fill("#token", "not-a-token")
    page.click("#login-form button")
    page.wait_for_selector("#login-error:has-text('not accepted')")
    page.fill("#token", alice_t)
    page.click("#login-form button")
    page.wait_for_selector(f"#queue tr[data-job='{j1}']")
    assert page.inner_text("#who") == "alice"
    assert page.locator("#cluster .gpu.busy, #cluster .gpu.allocated").count() == 3
    # the list updates after a submit: a job that cannot fit yet shows why it waits
    j3 = submit(alice, name="gpt-c", command="sleep 600", gpus=2)
    row = page.wait_for_selector(f"#queue tr[data-job='{j3}']")
    page.wait_for_selector(f"#queue tr[data-job='{j3}'] td.reason:has-text('Resources')")
    assert "PD" in row.inner_text() and "alice" in row.inner_text()
    page.wait_for_function("document.querySelectorAll('svg[data-chart=utilisation] path').length == 2")
    wait_for(lambda: len(admin.get("/stats/series").json()) >= 3, what="three samples")
    page.wait_for_timeout(700)
    shot(page, shots / "dashboard-overview.png")
    # the queue a page at a time (here two jobs a page): how many in all, Next and Previous
    page.goto(s.url + "/?refresh=500&page=2")
    page.wait_for_selector("#queue-title:has-text('Queue (3 active jobs)')")
    assert page.inner_text("#queue-range") == "jobs 1–2 of 3, by id" and page.is_disabled("#queue-prev")
    assert [r.get_attribute("data-job") for r in page.query_selector_all("#queue tbody tr")] == ["1", "2"]
    page.click("#queue-next")
    page.wait_for_selector("#queue-range:has-text('jobs 3–3 of 3')")
    assert [r.get_attribute("data-job") for r in page.query_selector_all("#queue tbody tr")] == [str(j3)]
    assert page.is_disabled("#queue-next")
    page.wait_for_timeout(1200)  # refreshes keep the page shown
    assert page.inner_text("#queue-range") == "jobs 3–3 of 3, by id"
    page.click("#queue-prev")
    page.wait_for_selector("#queue-range:has-text('jobs 1–2 of 3')")
    # a job page shows progress
    page.goto(s.url + f"/?refresh=500#/job/{j1}")
    page.wait_for_selector("#spec")
    wait_for(lambda: len(alice.get(f"/jobs/{j1}/progress").json()) >= 5, what="progress lines")
    page.wait_for_function("(() => { const p = document.querySelector('svg[data-chart=progress] path');"
                           " return p && p.getAttribute('d').split('L').length >= 5; })()")
    assert "resnet-a" in page.inner_text("main h2") and "GPULOOM_PROGRESS" in page.inner_text("#log")
    assert "launch" in page.inner_text("#timeline") and "node-" in page.inner_text("#allocations")
    assert page.is_enabled("#cancel")
    shot(page, shots / "dashboard-job.png")
    # bob may look, not cancel
    other = browser.new_page(viewport={"width": 1100, "height": 720})
    other.goto(s.url + f"/#/job/{j1}")
    other.fill("#token", bob_t)
    other.click("#login-form button")
    other.wait_for_selector("#spec")
    assert other.is_disabled("#cancel") and "only alice" in other.get_attribute("#cancel", "title")
    assert "only the owner" in other.inner_text("#log")
    assert bob.delete(f"/jobs/{j1}").status_code == 403  # what the button would get
    # the owner cancels
    page.click("#cancel")
    page.wait_for_selector("#job-msg:has-text('job 1:')")
    wait_for(lambda: alice.get(f"/jobs/{j1}").json()["st"] == "CA", what="job 1 to be cancelled")
    page.wait_for_selector("#spec dd:has-text('CA (cancelled)')")
    assert "job 1:" in page.inner_text("#job-msg")  # the answer outlives the page's refreshes
    # the history view
    page.goto(s.url + "/#/history")
    page.wait_for_selector(f"#history tr[data-job='{j1}']")
    # the API page, with its assets served locally and an Authorize button
    page.goto(s.url + "/docs")
    page.wait_for_selector("button.authorize")
    page.click("button.authorize")
    page.wait_for_selector("text=HTTPBearer")
    assert outside == []  # no CDN, nothing from outside


# Set when the answer to /cluster (the job list's first request) has been read and every step the
# page takes with it is done: those steps are promise callbacks, run before the next task (setTimeout).
CLUSTER_READ = """
const json = Response.prototype.json;
Response.prototype.json = function () {
  const p = json.call(this);
  if (new URL(this.url).pathname === "/cluster") p.then(() => setTimeout(() => { window.clusterRead = true; }, 0));
  return p;
};
"""


def test_a_page_left_while_loading_is_not_drawn_over_the_next(server: Any, browser: Any) -> None:
    """The job list still waiting for /cluster when the user opens the history: the list's late answer
    must not replace the history, the page the address names (a user would see the list come back)."""
    s = server("--cluster", "1x2", "--cpus-per-node", "4", "--round", "0.3")
    held: list[Any] = []
    page = browser.new_page()
    page.add_init_script(CLUSTER_READ)
    page.route("**/cluster", lambda route: route.continue_() if held else held.append(route))
    page.goto(s.url + "/?refresh=600000#/")  # no refresh while the test runs: only the renders it causes
    page.fill("#token", s.client().headers["Authorization"].split()[1])
    page.click("#login-form button")
    for _ in range(600):  # the job list's render has asked for /cluster: its answer is held
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the job list never asked for /cluster"
    page.evaluate("location.hash = '#/history'")
    page.wait_for_selector("#history")
    held[0].continue_()
    page.wait_for_function("window.clusterRead === true")
    assert page.locator("#history").count() == 1 and page.locator("#cluster").count() == 0
