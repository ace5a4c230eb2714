"""The service on Ray against the local executor, on a fake 3-node Ray cluster on this machine.

A ``ray.cluster_utils.Cluster`` of 3 nodes, each declaring 16 GPUs and 16 CPUs (8 GiB), and a
real ``gpuloom serve`` in a subprocess, once with ``--ray ADDRESS --shared-dir`` and once with
the local executor on the same declared inventory (``--cluster 3x16``):

Both services run at once, so that they are measured under the same load (the machine is shared):

* **latency**: 40 one-GPU jobs (``sleep``) per service, submissions interleaved (one to each
  service every 0.2 s, in alternating order); submit -> launch is ``first_start - submit_time``
  from the store (round on arrival, plan, cores, the launch: for Ray a call to the node's agent
  actor, which starts the process);
* **burst**: 48 one-GPU jobs from 8 clients at once: launches per second from the first submit
  to the last launch (the 3 nodes' 48 GPUs); two bursts per service, in the order local, Ray,
  Ray, local, and their mean;
* **memory**: RSS of the service process with the 48 jobs running (the larger of its two bursts);
  on Ray also of each node agent (a Ray worker process) and its fence process;
* **recovery** (Ray only): 24 jobs running (16 on n0, 8 on n1); n1 leaves the Ray cluster
  (``remove_node``); time until the service noticed (its ``node-lost`` events) and until the 8
  jobs run again on n2 (the service's fence wait, grace + 1 s = 3 s, included).  Then a node n3
  joins and n2's raylet is SIGKILLed: a node that dies without saying so is noticed through Ray's
  health checks (defaults), and its 8 jobs move to n3.

Run: ``python benchmarks/run.py ray`` (needs the ray extra; about 3 minutes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
NODE = {"num_cpus": 16, "num_gpus": 16, "memory": 8 * 2**30, "object_store_memory": 80 * 2**20}
GRACE = "2"


class Server:
    def __init__(self, state_dir: Path, *args: str) -> None:
        self.state_dir = state_dir
        env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
        self.out = open(state_dir / "serve.out", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuloom", "serve", "--port", "0", "--state-dir",
                                      str(state_dir), "--log-level", "warning", "--round", "5", "--grace", GRACE,
                                      *args], env=env, stdout=self.out, stderr=subprocess.STDOUT)
        from gpuloom.cli.testbed import wait_for_serve

        up = wait_for_serve(state_dir, self.proc, 180)
        if up is None:
            raise RuntimeError("server did not start")
        self.url, self.token = up
        self.http = httpx.Client(base_url=self.url, timeout=120, headers={"Authorization": f"Bearer {self.token}"})

    def store(self) -> Any:
        from gpuloom.runtime.state.store import Store

        return Store(f"sqlite:///{self.state_dir / 'gpuloom.db'}")

    def submit(self, n: int, clients: int, gap: float = 0.0) -> list[int]:
        ids: list[int] = []
        lock = threading.Lock()

        def run(k: int) -> None:
            with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=120) as h:
                for _ in range(k, n, clients):
                    r = h.post("/jobs", json={"name": "b", "command": "sleep 600", "gpus": 1})
                    r.raise_for_status()
                    with lock:
                        ids.append(r.json()["id"])
                    if gap:
                        time.sleep(gap)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sorted(ids)

    def wait_running(self, ids: list[int], timeout: float = 180.0) -> list[Any]:
        end = time.monotonic() + timeout
        store = self.store()
        try:
            while time.monotonic() < end:
                rows = [store.get_job(i) for i in ids]
                if all(r.first_start is not None and r.state in ("launching", "running_protected", "running")
                       for r in rows):
                    return rows
                time.sleep(0.1)
            why = {r.state + ": " + str(r.reason) for r in rows if r.first_start is None or r.state not in (
                "launching", "running_protected", "running")}
        finally:
            store.close()
        raise RuntimeError(f"jobs did not launch: {sorted(why)[:3]}")

    def cancel_all(self, ids: list[int]) -> None:
        for i in ids:
            self.http.delete(f"/jobs/{i}")
        store = self.store()
        end = time.monotonic() + 120
        while time.monotonic() < end and store.count_jobs(["launching", "running_protected", "running",
                                                            "checkpointing", "stopping"]):
            time.sleep(0.1)
        store.close()

    def rss_mb(self) -> float:
        return psutil.Process(self.proc.pid).memory_info().rss / 2**20

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


def post(s: Server) -> int:
    r = s.http.post("/jobs", json={"name": "b", "command": "sleep 600", "gpus": 1})
    r.raise_for_status()
    return int(r.json()["id"])


def latency(servers: dict[str, Server], n: int = 40, gap: float = 0.2) -> dict[str, np.ndarray]:
    """Submit->launch ms of ``n`` one-GPU jobs per service, submissions interleaved (one to each service per
    step, in alternating order) so both see the same machine load."""
    ids: dict[str, list[int]] = {f: [] for f in servers}
    faces = list(servers)
    for k in range(n):
        for f in faces if k % 2 == 0 else faces[::-1]:
            ids[f].append(post(servers[f]))
            time.sleep(gap / 2)
    out = {}
    for f, s in servers.items():
        rows = s.wait_running(ids[f])
        out[f] = np.array([r.first_start - r.submit_time for r in rows]) * 1000
        print(f"{f}: submit->launch ms, in submission order: {' '.join(f'{x:.0f}' for x in out[f])}")
        s.cancel_all(ids[f])
    return out


def burst(s: Server) -> tuple[float, float, list[int]]:
    """48 one-GPU jobs from 8 clients at once: (launches/s from the first submit to the last launch,
    service RSS MB with them running, their ids)."""
    ids = s.submit(48, 8)
    rows = s.wait_running(ids)
    span = max(r.first_start for r in rows) - min(r.submit_time for r in rows)
    time.sleep(1.0)
    return 48 / span, s.rss_mb(), ids


def agent_memory(namespace: str, names: list[str]) -> list[tuple[str, float, float]]:
    import ray

    from gpuloom.runtime.exec.ray_executor import AGENT_PREFIX

    out = []
    for n in names:
        info = ray.get(ray.get_actor(AGENT_PREFIX + n, namespace=namespace).info.remote())
        fence = psutil.Process(info["fence_pid"]).memory_info().rss / 2**20
        out.append((n, info["rss_mb"], fence))
    return out


def wait_relaunched(s: Server, ids: list[int], t0: float, timeout: float = 180.0) -> tuple[float, float]:
    """(seconds from t0 to the service's node-lost events, to the last of ``ids`` running again)."""
    store = s.store()
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            rows = [store.get_job(i) for i in ids]
            if all(r.last_start >= t0 and r.state in ("launching", "running_protected", "running") for r in rows):
                lost = min(e["time"] for i in ids for e in store.events(i) if e["kind"] == "node-lost" and e["time"] >= t0)
                return lost - t0, max(r.last_start for r in rows) - t0
            time.sleep(0.05)
    finally:
        store.close()
    raise RuntimeError("jobs were not relaunched")


def recovery(cluster: Any, nodes: dict[str, Any], s: Server) -> list[tuple[str, int, float, float]]:
    ids = s.submit(24, 4)
    rows = s.wait_running(ids)
    on = {n: [r.id for r in rows if r.alloc["parts"][0]["node"] == n] for n in nodes}
    out = []
    t0 = time.time()
    cluster.remove_node(nodes.pop("n1"))
    detect, back = wait_relaunched(s, on["n1"], t0)
    out.append(("remove_node (graceful)", len(on["n1"]), detect, back))
    nodes["n3"] = cluster.add_node(**NODE, labels={"gpuloom.io/name": "n3"})
    time.sleep(3.0)  # the service sees n3
    store = s.store()
    on2 = [i for i in ids if store.get_job(i).alloc and store.get_job(i).alloc["parts"][0]["node"] == "n2"]
    store.close()
    raylet = nodes["n2"].all_processes["raylet"][0].process
    t0 = time.time()
    os.kill(raylet.pid, signal.SIGKILL)
    detect, back = wait_relaunched(s, on2, t0, timeout=300)
    out.append(("raylet SIGKILL (health check)", len(on2), detect, back))
    s.cancel_all(ids)
    return out


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster

    from gpuloom.runtime.exec.ray_executor import NAME_LABEL

    print(f"fake Ray cluster: 3 nodes x 16 GPUs on one machine ({psutil.cpu_count()} cores); grace {GRACE} s")
    t = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False,
                                                           "labels": {NAME_LABEL: "n0"}})
    nodes = {"n0": cluster.head_node}
    for n in ("n1", "n2"):
        nodes[n] = cluster.add_node(**NODE, labels={NAME_LABEL: n})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, logging_level="warning")
    print(f"cluster up in {time.monotonic() - t:.1f} s")
    rec: list[tuple[str, int, float, float]] = []
    ns = ""
    try:
        with tempfile.TemporaryDirectory() as d:
            os.chmod(d, 0o755)  # the shared directory below must be reachable by the job account
            (Path(d) / "local").mkdir()
            (Path(d) / "ray").mkdir()
            servers: dict[str, Server] = {}
            try:
                servers["local"] = Server(Path(d) / "local", "--cluster", "3x16", "--cpus-per-node", "16",
                                          "--mem-gb-per-node", "8")
                t = time.monotonic()
                servers["ray"] = Server(Path(d) / "ray", "--ray", cluster.address, "--shared-dir", str(Path(d) / "shared"))
                started = time.monotonic() - t
                store = servers["ray"].store()
                ns = f"gpuloom-{store.get_meta('service_id')}"
                store.close()
                lat = latency(servers)
                # bursts in the order local, ray, ray, local: each face's mean of two, under the same drift in load
                bursts: dict[str, list[tuple[float, float]]] = {"local": [], "ray": []}
                for f in ("local", "ray", "ray", "local"):
                    rate, rss, ids = burst(servers[f])
                    if f == "ray" and len(bursts["ray"]) == 0:
                        agents = agent_memory(ns, ["n0", "n1", "n2"])
                    servers[f].cancel_all(ids)
                    bursts[f].append((rate, rss))
                    print(f"{f}: burst of 48 at {rate:.1f} launches/s; service RSS {rss:.0f} MB")
                servers.pop("local").close()
                rec = recovery(cluster, nodes, servers["ray"])
            finally:
                for s in servers.values():
                    s.close()
                from gpuloom.runtime.exec.ray_executor import AGENT_PREFIX

                for n in ("n0", "n1", "n2", "n3"):
                    try:
                        ray.kill(ray.get_actor(AGENT_PREFIX + n, namespace=ns), no_restart=True)
                    except ValueError:
                        pass
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"\nservice start with --ray (connect, 3 agents): {started:.1f} s")
    res = {f: {"p50": float(np.percentile(lat[f], 50)), "p99": float(np.percentile(lat[f], 99)),
               "max": float(lat[f].max()), "burst": float(np.mean([b[0] for b in bursts[f]])),
               "rss": float(max(b[1] for b in bursts[f]))} for f in ("local", "ray")}
    print(f"\n{'executor':<8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'burst launches/s':>17} {'service RSS MB':>15}")
    for f, r in res.items():
        print(f"{f:<8} {r['p50']:>8.1f} {r['p99']:>8.1f} {r['max']:>8.1f} {r['burst']:>17.1f} {r['rss']:>15.0f}")
    loc, on_ray = res["local"], res["ray"]
    print(f"ratio ray/local: p50 {on_ray['p50'] / loc['p50']:.2f}x, p99 {on_ray['p99'] / loc['p99']:.2f}x, "
          f"burst {on_ray['burst'] / loc['burst']:.2f}x, service memory {on_ray['rss'] / loc['rss']:.2f}x")
    print("\nagent memory (16 jobs each):")
    for n, rss, fence in agents:
        print(f"  {n}: agent actor {rss:.0f} MB RSS, fence {fence:.0f} MB")
    print(f"\n{'node loss':<30} {'jobs':>5} {'noticed s':>10} {'running again s':>16}")
    for what, n, detect, back in rec:
        print(f"{what:<30} {n:>5} {detect:>10.2f} {back:>16.2f}")


if __name__ == "__main__":
    main()
