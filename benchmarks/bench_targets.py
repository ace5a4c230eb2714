"""The simulator's speed targets, and a before/after table against another checkout.

Run: ``python benchmarks/run.py targets`` (this checkout only), or

    python benchmarks/bench_targets.py --base ../gpuloom-before [--cases philly,muri] [--timeout 900] [--repeat 3]

to run every case against both checkouts, back to back in fresh processes
(``PYTHONPATH`` set to each checkout's ``src``; the case code is this file's, so
both run exactly the same benchmark), and print one table: seconds before and
after, their ratios (wall, CPU), and whether each target is met (``yes/no``: by
wall time / by CPU time).  ``cpu s`` is the process CPU time, the steadier
figure on a shared machine.  A case that runs past ``--timeout`` counts as that
many seconds (``>``; its CPU time, loading included, as a lower bound).  The ``result`` column is a
fingerprint of what the run computed (mean JCT, jobs finished), so a speed-up
that changed the results shows.  ``--repeat N`` runs each case N times per checkout,
alternating before and after, and the table gives each side's fastest run: other load on a
shared machine only ever adds time, so the fastest run is the one it disturbed least (the
convention of ``timeit``), and alternating spreads a slow spell over both sides.

**Interleaved runs** (``--interleave N``, :func:`interleave`) compare cases whose difference is smaller than a
shared machine's drift between two runs (Muri-L against 2D-LAS + muri).  N rounds, each running every case on
each side once, one fresh process per run, the order of the round reversed every other round (A, B, then B,
A, ...), so that each run of a case has its comparison next to it and no case is always first.  The table gives
each case and side's median and least CPU seconds over the rounds (and median wall time), and the ratios that are
taken round by round, CPU by CPU: after / before for each case (with ``--base``), and for a case with a relative
target (:data:`RELATIVE`) the case / its reference on each side; each ratio's median over the rounds, its least
and greatest, and in how many rounds it was under 1.  A slow spell then moves both runs of a round, not the
ratio; the spread says how far the load moved it.  ``result`` must be the same in every round (else ``differs``).

**Targets as ratios.**  The targets were set as ratios against the figures of the code of the
time, measured in the same run.  When they were set, the code of commit ``f0ff3f3``
(:data:`REFERENCE`) took 23.5 s on Philly with checks on (12.3 s off) and 11-12 s on Muri-S,
and the targets asked for 5 s and 3 s, so the speed-ups they ask are
23.5 / 5 = 4.7x and 12 / 3 = 4.0x (:data:`REFERENCE_FIGURES`; the upper end of a range, the
stricter).  When ``--base`` is a checkout of that commit, the table's ``needs`` column gives
that speed-up and ``met`` a third verdict, ``wall/cpu/ratio``: whether the wall-time ratio of
this run reaches it.  The absolute seconds say how fast this machine is; the ratio, measured
side by side, says what the code gained on any machine.  (Results differ from that code's: packed
placement has consolidated by default since, so the ``result`` column shows other JCTs.)

**Targets relative to the simulation.**  A case with a target in :data:`RATIO_TARGETS` is judged against
a plain simulation of the same run: ``philly-command``'s seconds are the whole command's (wall time since the
process started, CPU time of the process), and it meets its target when they are at most 1.3 times those of
``Simulator.run`` on the same configuration with nothing sent anywhere (wall by wall, CPU by CPU), whatever the
machine's speed.  That plain run is the command's own configuration (the arguments it gave ``run_config``),
pickled after the command and run in a fresh process of the same checkout (:func:`plain_run`), so it is timed
without the command's progress ticks, the rows it sends its children during the run, or the children beside it.
With ``--repeat``, the plain run's seconds are its fewest over the side's runs, as the command's are (:func:`fastest`).
Its ``result`` gives the plain run's seconds and the two ratios, the CPU time of the command's child processes
(it draws its plots and writes ``series.csv`` and ``jobs.csv`` in children, while it writes the rest): ``cpu`` is
the command's own process's, the one that waits for them, and the CPU ratio with its children's added is the
command's whole cost (on a machine with no core to spare, its wall time); and the seconds of ``Simulator.run``
inside the command (with the sending), for where the time goes.
Each case's process runs with its checkout's bytecode compiled beforehand into a cache outside the checkouts
(:data:`PYCACHE`), as an installed package has it, whatever ``PYTHONDONTWRITEBYTECODE`` says.

Cases (data from ../shared/data or ``$GPULOOM_DATA``):

=================  ================================================================  ========
philly             Philly list (82,247 jobs) on 64 x 8 GPUs, FIFO, packed-sticky,   5 s
                   300 s rounds, invariant checks on (simulation only, not loading)
philly-nocheck     the same with checks off                                           -
philly-command     ``gpuloom simulate`` on the Philly list, 64 x 8 (``philly``'s run   1.3 x the
                   with the command's defaults), from the process's start to the      simulation
                   command's end (the trace read, the simulation, jobs.csv,
                   series.csv, summary.json, the plots, the report), against a
                   plain ``Simulator.run`` of the same configuration, timed in a
                   process of its own after the command
muri-s             Muri-S on Muri's trace3, the flags of docs/muri.md                 3 s
                   (8 x 8, 92 cores, 520 GB; srsf-events + muri, rescheduling on both)
muri-s-trace1      the same on Muri's trace1 (1,494 jobs), trace4 (2,638 jobs)        -
muri-s-trace4
2d-las-muri-trace1 Tiresias' 2D-LAS + muri on trace1, trace4 (the same flags)         -
2d-las-muri-trace4
muri-l-trace1      Muri-L (``las-gpu-events`` + muri) on trace1, trace4 (the same     1x
muri-l-trace4      flags), against 2D-LAS + muri on the same trace
synergy-tune-fifo  bench_synergy's 1,000 jobs on 16 x 8 GPUs, FIFO / SRTF,           3 s
synergy-tune-srtf  Synergy-TUNE
synergy-opt-fifo   the same with Synergy-OPT                                          6 s
synergy-opt-srtf
place-10240        one round on 1,280 x 8 GPUs, every GPU busy (about 3,000 jobs)    0.1 s
                   and about 18,000 waiting, after 64 jobs finished and 64
                   arrived; FIFO, packed-sticky, checks on (median of 5 such
                   rounds; the first round from an empty cluster, placing all
                   of them, is reported beside it)
million            1,000,000 generated jobs on 1,280 x 8 GPUs (built-in mix and         120 s,
                   durations, about 84 % offered load), FIFO, packed-sticky, checks     2 GB
                   on: simulation time and the process's peak memory
philly-20k         Philly's first 20,000 jobs on 64 x 8 GPUs, FIFO, packed-sticky,       -
                   300 s rounds, checks on, no queue tree
queues-tree        the same measured against quotas by demand (per-queue report:        1.5x
                   ``--queues demand --queue-policy none``)
queues-quota       the same under the queue stage quota, drf, fair share (quotas by    1.5x
queues-drf         demand: ``--queues demand --queue-policy quota|drf|fairshare``)
queues-fairshare
=================  ================================================================  ========

The queue cases' target is a ratio to ``philly-20k`` in the same table (:data:`RELATIVE`: each at most
1.5 times the same run with no queue tree); ``met`` then says whether this run's wall and CPU times are.
Muri-L's target is likewise at most the time of 2D-LAS + muri on the same trace (listed before it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def data_dir() -> Path:
    env = os.environ.get("GPULOOM_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


# -- the cases (run in a child process; only APIs both checkouts have) -------------------------
def _timed(fn):  # noqa: ANN001, ANN202
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def _summary_fp(res) -> str:  # noqa: ANN001
    s = res.summary()
    return f"jct {s['mean_jct_s']:.6g} done {s['completed']}"


def case_philly(check: bool) -> dict:
    from gpuloom.core import parse_cluster
    from gpuloom.scheduler import Scheduler
    from gpuloom.sim import SimConfig, Simulator
    from gpuloom.sim.traces import load_trace

    specs = load_trace(data_dir() / "sia" / "philly_jobs.csv", "philly")
    sim = Simulator(parse_cluster("64x8"), specs, Scheduler.from_names("fifo", "none", "proportional", "packed-sticky"),
                    config=SimConfig(round_len=300.0, check=check))
    res, wall, cpu = _timed(sim.run)
    return {"wall": wall, "cpu": cpu, "result": _summary_fp(res) + f" rounds {res.rounds_computed}/{res.rounds}"}


def process_age() -> float:
    """Seconds since this process started. On Linux from the kernel's clock since boot (``/proc/uptime``
    less the start tick in ``/proc/self/stat``: to a tick, 10 ms); psutil's ``create_time`` adds that tick to
    the boot time in whole seconds (``btime``), so its age reads up to a second long, by the same amount in
    every process since boot (0.47 s on the machine of docs/performance.md's last table)."""
    try:
        with open("/proc/self/stat") as f:
            start = int(f.read().rpartition(")")[2].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - start
    except (OSError, ValueError, IndexError):
        import psutil

        return time.time() - psutil.Process().create_time()


def case_philly_command() -> dict:
    """``gpuloom simulate`` on Philly as a user runs it (the ``gpuloom`` program's entry function), timed from the
    process's start to the command's end, against a plain run of the same configuration (:func:`plain_run`).

    The configuration is taken from the command (the arguments it calls ``run_config`` with: the run's
    configuration, cluster, jobs and queue tree), pickled once the command's figures are taken, and run by
    :func:`plain_run` in a fresh process (this file, ``--plain FILE``): there ``Simulator.run`` is timed with
    nothing sent anywhere (no progress ticks, no rows sent to children) and no other process of the run beside it,
    as ``philly`` times it.  ``Simulator.run`` is also timed inside the command (``sim_wall``, ``sim_cpu``: the run
    with the rows' sending and the children's work beside it), for where the time goes; the target is judged
    against the plain run.

    The program may end the process itself once its files are written and its output flushed (it then runs
    the ``atexit`` handlers, not Python's tear-down): the figures are taken in such a handler, printed there
    and the process ends; where it returns instead, they are taken then and returned."""
    import atexit
    import pickle

    # the command line first, as the program has it when gpuloom.cli loads (it may start reading the trace then)
    tmp = tempfile.TemporaryDirectory()
    sys.argv = ["gpuloom", "simulate", "--trace", str(data_dir() / "sia" / "philly_jobs.csv"),
                "--cluster", "64x8", "--out", str(Path(tmp.name) / "run")]
    import gpuloom.cli as cli
    import gpuloom.sim.runconfig as runconfig
    from gpuloom.sim.engine import Simulator

    sim: dict[str, float] = {}
    run = Simulator.run
    configured: list[tuple] = []
    run_config = runconfig.run_config

    def timed_run(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        t, c = time.perf_counter(), time.process_time()
        try:
            return run(self, *args, **kwargs)
        finally:
            sim.update(wall=time.perf_counter() - t, cpu=time.process_time() - c)

    def taken_config(rc, cluster, specs, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        configured.append((rc, cluster, specs, kwargs.get("queues")))
        return run_config(rc, cluster, specs, *args, **kwargs)

    Simulator.run = timed_run  # type: ignore[method-assign]
    runconfig.run_config = taken_config
    out = sys.stdout
    taken: list[dict] = []

    def figures() -> dict:
        if taken:
            return taken[0]
        wall = process_age()
        cpu = time.process_time()
        used = resource.getrusage(resource.RUSAGE_CHILDREN)  # (the command's children, all waited for)
        children = used.ru_utime + used.ru_stime
        s = json.loads((Path(tmp.name) / "run" / "summary.json").read_text())["summary"]
        result = f"jct {s['mean_jct_s']:.6g} done {s['completed']}"
        (rc, cluster, specs, queues), = configured
        config = Path(tmp.name) / "config.pickle"
        config.write_bytes(pickle.dumps((rc, cluster, specs, queues), protocol=pickle.HIGHEST_PROTOCOL))
        got = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--plain", str(config)],
                             capture_output=True, text=True, check=False)
        if got.returncode != 0:
            raise RuntimeError(f"the plain run failed: {(got.stderr.strip().splitlines() or ['?'])[-1]}")
        plain = json.loads(got.stdout.strip().splitlines()[-1])
        if plain["result"] != result:
            raise RuntimeError(f"the plain run computed {plain['result']}, the command {result}")
        taken.append({
            "wall": wall, "cpu": cpu, "plain_wall": plain["wall"], "plain_cpu": plain["cpu"],
            "sim_wall": sim["wall"], "sim_cpu": sim["cpu"], "children_cpu": children,
            "result": f"{result}; plain run {plain['wall']:.3g} s (cpu {plain['cpu']:.3g}), command "
                      f"{wall / plain['wall']:.2f}x (cpu {cpu / plain['cpu']:.2f}x; with its children's "
                      f"{children:.2g} s, {(cpu + children) / plain['cpu']:.2f}x); its own run {sim['wall']:.3g} s "
                      f"(cpu {sim['cpu']:.3g})"})
        return taken[0]

    def at_exit() -> None:  # (the program ended the process: print what the caller would have)
        if not taken:
            sys.stdout = out
            print(json.dumps(figures()), flush=True)
        tmp.cleanup()

    atexit.register(at_exit)
    sys.stdout = open(os.devnull, "w")  # the command's table (printed, not shown)
    try:
        getattr(cli, "entry", cli.main)()
    except SystemExit as e:
        if e.code:
            raise RuntimeError(f"gpuloom simulate exited with {e.code}") from None
    finally:
        sys.stdout.close()
        sys.stdout = out
    return figures()


def plain_run(config: Path) -> dict:
    """``Simulator.run`` of the configuration pickled in ``config`` (``case_philly_command``'s), timed alone: no
    progress callback, nothing sent (``run_config`` with the command's configuration, cluster, jobs and queue tree,
    which builds the scheduler, the model and the simulator as the command does)."""
    import pickle

    from gpuloom.sim.engine import Simulator
    from gpuloom.sim.runconfig import run_config

    rc, cluster, specs, queues = pickle.loads(config.read_bytes())
    sim: dict[str, float] = {}
    run = Simulator.run

    def timed_run(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        (res, sim["wall"], sim["cpu"]) = _timed(lambda: run(self, *args, **kwargs))
        return res

    Simulator.run = timed_run  # type: ignore[method-assign]
    try:
        res = run_config(rc, cluster, specs, queues=queues)
    finally:
        Simulator.run = run  # type: ignore[method-assign]
    s = res.summary()
    return {"wall": sim["wall"], "cpu": sim["cpu"], "result": f"jct {s['mean_jct_s']:.6g} done {s['completed']}"}


def _muri_s_order() -> str:
    """Muri-S's order as the checkout under test defines it (``gpuloom.policies.muri.VARIANTS``)."""
    from gpuloom.policies.muri import VARIANTS

    return VARIANTS["muri-s"][0]


def case_muri_s() -> dict:
    from gpuloom.core.cluster import parse_cluster
    from gpuloom.perf.model import DEFAULT_LOCALITY_PENALTY
    from gpuloom.sim.engine import SimConfig
    from gpuloom.sim.runconfig import RunConfig, run_config
    from gpuloom.sim.traces import load_trace

    # gpuloom simulate --trace trace3.csv --format muri --cluster 8x8 --cpus-per-node 92
    #   --mem-gb-per-node 520 --order srsf-events --group muri --reschedule-on both   (the rest: defaults)
    cl = parse_cluster("8x8", 92, 520)
    specs = load_trace(data_dir() / "muri" / "sim_traces" / "trace3.csv", "muri")
    cfg = SimConfig(round_len=300.0, reschedule_on_arrival=True, reschedule_on_completion=True)
    rc = RunConfig("", _muri_s_order(), "muri", "proportional", "packed-sticky", True, {}, DEFAULT_LOCALITY_PENALTY, cfg)
    rc.validate()  # (imports the policies: not the simulation's time)
    res, wall, cpu = _timed(lambda: run_config(rc, cl, specs))
    return {"wall": wall, "cpu": cpu, "result": _summary_fp(res) + f" rounds {res.rounds_computed}/{res.rounds}"}


def case_muri_trace(trace: str, order: str) -> dict:
    """A whole Muri trace with the flags of docs/muri.md (``case_muri_s``'s) and ``order`` + muri."""
    from gpuloom.core.cluster import parse_cluster
    from gpuloom.perf.model import DEFAULT_LOCALITY_PENALTY
    from gpuloom.sim.engine import SimConfig
    from gpuloom.sim.runconfig import RunConfig, run_config
    from gpuloom.sim.traces import load_trace

    cl = parse_cluster("8x8", 92, 520)
    specs = load_trace(data_dir() / "muri" / "sim_traces" / f"{trace}.csv", "muri")
    cfg = SimConfig(round_len=300.0, reschedule_on_arrival=True, reschedule_on_completion=True)
    rc = RunConfig("", order, "muri", "proportional", "packed-sticky", True, {}, DEFAULT_LOCALITY_PENALTY, cfg)
    rc.validate()
    res, wall, cpu = _timed(lambda: run_config(rc, cl, specs))
    return {"wall": wall, "cpu": cpu, "result": _summary_fp(res) + f" rounds {res.rounds_computed}/{res.rounds}"}


def case_synergy(size: str, order: str) -> dict:
    from gpuloom.core.cluster import Cluster
    from gpuloom.perf.assembly import build_model
    from gpuloom.scheduler import Scheduler
    from gpuloom.sim.engine import SimConfig, Simulator
    from gpuloom.sim.synergy_workload import synergy_workload

    # bench_synergy.py's simulation table (1,000 jobs, 9 jobs/h, split (20, 70, 10), synthetic durations)
    prof = data_dir() / "synergy" / "model_sensitivity_profiles.csv"
    specs = synergy_workload(1000, 9.0, (20, 70, 10), seed=1, durations="synthetic",
                             philly=data_dir() / "sia" / "philly_jobs.csv")
    cl = Cluster.homogeneous(16, 8, 24, 500_000)
    model = build_model(cl, options={"profiles": prof})
    sim = Simulator(cl, specs, Scheduler.from_names(order, "none", size, "packed-sticky"), model,
                    SimConfig(round_len=300))
    res, wall, cpu = _timed(sim.run)
    return {"wall": wall, "cpu": cpu, "result": _summary_fp(res)}


def _loaded(num_jobs: int, rate: float, until: float, seed: int = 0):  # noqa: ANN202
    """A 1,280 x 8 simulator run up to ``until`` on generated jobs (FIFO, packed-sticky, checks on)."""
    from gpuloom.core import parse_cluster
    from gpuloom.scheduler import Scheduler
    from gpuloom.sim import SimConfig, Simulator
    from gpuloom.sim.generator import generate

    specs = generate(num_jobs, rate, seed)
    sim = Simulator(parse_cluster("1280x8"), specs, Scheduler.from_names("fifo", "none", "proportional", "packed-sticky"),
                    config=SimConfig(round_len=300.0, max_time=until))
    return sim, specs


def case_philly_queues(queue: str | None) -> dict:
    """Philly's first 20,000 jobs on 64 x 8 (the issue's runs): no queue tree (None), measured against quotas by
    demand ("tree": no queue stage), or under the queue stage ``queue`` with those quotas."""
    from gpuloom.core import parse_cluster
    from gpuloom.sim.engine import SimConfig
    from gpuloom.sim.quotas import demand_quotas
    from gpuloom.sim.runconfig import RunConfig, run_config
    from gpuloom.sim.traces import load_trace

    specs = sorted(load_trace(data_dir() / "sia" / "philly_jobs.csv", "philly"), key=lambda s: s.arrival)[:20_000]
    cl = parse_cluster("64x8")
    tree = demand_quotas(specs, cl.num_gpus) if queue is not None else None
    stage = "none" if queue in (None, "tree") else queue
    params = {"queue.queues": tree} if stage != "none" else {}
    rc = RunConfig("", "fifo", "none", "proportional", "packed-sticky", True, params,
                   sim=SimConfig(round_len=300.0, restart_overhead=10.0), queue=stage)
    res, wall, cpu = _timed(lambda: run_config(rc, cl, specs, queues=tree))
    return {"wall": wall, "cpu": cpu, "result": _summary_fp(res) + f" rounds {res.rounds_computed}/{res.rounds}"}


def case_place() -> dict:
    import statistics

    from gpuloom.core.job import Job
    from gpuloom.driver import Driver
    from gpuloom.sim.engine import SimBackend

    # 6,000 jobs/h for 6 hours: every GPU busy (about 3,000 jobs) and about 18,000 waiting
    sim, specs = _loaded(40_000, 6_000.0, 6 * 3600.0)
    sim.run()
    d = sim.driver
    now = sim.now
    pending = [j for j in sim.jobs if j.lifecycle is None]
    times = []
    for k in range(5):
        now += 300.0
        for job in list(d.jobs.values()):
            job.advance(now)
        running = [d.jobs[jid] for jid in list(d.current)[k * 64: k * 64 + 64]]
        for job in running:
            d.finish(job, now)
        for job in pending[k * 64: k * 64 + 64]:
            d.admit(job, now)
        t = time.perf_counter()
        d.round(now)
        times.append(time.perf_counter() - t)
    steady = statistics.median(times)
    # the first round from an empty cluster: every active job placed at once
    active = [Job(j.spec, j.index) for j in d.jobs.values()]
    cold = Driver(sim.cluster, sim.scheduler, sim.model, SimBackend(sim.config.times), sim.rng, True)
    for job in active:
        cold.admit(job, now)
    t = time.perf_counter()
    cold.round(now)
    first = time.perf_counter() - t
    return {"wall": steady, "cpu": steady,
            "result": f"active {len(d.jobs)} running {len(d.current)}; first round {first:.3f} s "
                      f"({len(cold.current)} placed)"}


def case_million() -> dict:
    from gpuloom.core import parse_cluster
    from gpuloom.scheduler import Scheduler
    from gpuloom.sim import SimConfig, Simulator
    from gpuloom.sim.generator import PHILLY_DURATIONS, generate

    # the built-in mix with the built-in scenario's durations (builtin_workload: clipped to
    # [60 s, 2.5 h]) offers about 9,150 GPU-seconds per job (mean of these 1,000,000):
    # 3,400 jobs/h is about 84 % of 10,240 GPUs.  (Unclipped, up to 14 days, the mix offers
    # about 173,000 GPU-seconds per job: at 1,300 jobs/h 6 times the cluster, a queue that only grows.)
    mix = PHILLY_DURATIONS.clipped(60.0, 2.5 * 3600.0)
    (specs, gen_s, _) = _timed(lambda: generate(1_000_000, 3_400.0, 0, duration_dist=mix))
    sim = Simulator(parse_cluster("1280x8"), specs, Scheduler.from_names("fifo", "none", "proportional", "packed-sticky"),
                    config=SimConfig(round_len=300.0))
    del specs
    res, wall, cpu = _timed(sim.run)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"wall": wall, "cpu": cpu, "peak_mb": peak,
            "result": _summary_fp(res) + f"; generation {gen_s:.1f} s"}


#: The commit whose figures the targets were set against (see the module notes).
REFERENCE = "f0ff3f3"
#: That code's seconds per case as measured when the targets were set.
REFERENCE_FIGURES = {"philly": 23.5, "muri-s": 12.0}
#: Cases judged against the simulation they ran: at most this many times its wall (CPU) time.
RATIO_TARGETS = {"philly-command": 1.3}

CASES = {
    # name: (target seconds or None, memory target MB or None, runner)
    "philly": (5.0, None, lambda: case_philly(True)),
    "philly-nocheck": (None, None, lambda: case_philly(False)),
    "philly-command": (None, None, case_philly_command),
    "muri-s": (3.0, None, case_muri_s),
    "muri-s-trace1": (None, None, lambda: case_muri_trace("trace1", _muri_s_order())),
    "muri-s-trace4": (None, None, lambda: case_muri_trace("trace4", _muri_s_order())),
    "2d-las-muri-trace1": (None, None, lambda: case_muri_trace("trace1", "2d-las")),
    "muri-l-trace1": (None, None, lambda: case_muri_trace("trace1", "las-gpu-events")),
    "2d-las-muri-trace4": (None, None, lambda: case_muri_trace("trace4", "2d-las")),
    "muri-l-trace4": (None, None, lambda: case_muri_trace("trace4", "las-gpu-events")),
    "synergy-tune-fifo": (3.0, None, lambda: case_synergy("tune", "fifo")),
    "synergy-tune-srtf": (3.0, None, lambda: case_synergy("tune", "srtf")),
    "synergy-opt-fifo": (6.0, None, lambda: case_synergy("opt", "fifo")),
    "synergy-opt-srtf": (6.0, None, lambda: case_synergy("opt", "srtf")),
    "place-10240": (0.1, None, case_place),
    "million": (120.0, 2048.0, case_million),
    "philly-20k": (None, None, lambda: case_philly_queues(None)),
    "queues-tree": (None, None, lambda: case_philly_queues("tree")),
    "queues-quota": (None, None, lambda: case_philly_queues("quota")),
    "queues-drf": (None, None, lambda: case_philly_queues("drf")),
    "queues-fairshare": (None, None, lambda: case_philly_queues("fairshare")),
}
#: cases whose target is a ratio to another case of the same table: name -> (that case, the most it may take)
RELATIVE = {q: ("philly-20k", 1.5) for q in ("queues-tree", "queues-quota", "queues-drf", "queues-fairshare")}
# Muri-L (as Muri ranks: attained GPU-time, re-sorted on events) costs no more than Tiresias' 2D-LAS + muri
RELATIVE.update({f"muri-l-{t}": (f"2d-las-muri-{t}", 1.0) for t in ("trace1", "trace4")})


# -- the parent ------------------------------------------------------------------------------------
#: where the children's bytecode is cached, outside the checkouts (:func:`child_env`)
PYCACHE = Path(tempfile.gettempdir()) / "gpuloom-bench-pycache"
_COMPILED: set[Path] = set()


def child_env(checkout: Path) -> dict[str, str]:
    """The environment of a case's process: ``checkout``'s code, its bytecode compiled once into
    :data:`PYCACHE` (as an installed package has it: a process that times its own start, ``philly-command``,
    would otherwise time the compiling of every module it imports where ``PYTHONDONTWRITEBYTECODE`` is set)."""
    env = dict(os.environ, PYTHONPATH=str(checkout / "src"), PYTHONPYCACHEPREFIX=str(PYCACHE))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if checkout not in _COMPILED:
        _COMPILED.add(checkout)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout / "src")], env=env,
                       capture_output=True, timeout=600, check=False)
    return env


def run_child(checkout: Path, case: str, timeout: float) -> dict:
    env = child_env(checkout)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", case], env=env,
                             capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        # (the killed child was waited for: its CPU time, loading included, is a lower bound)
        now = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
        return {"wall": timeout, "cpu": cpu, "timeout": True, "result": f"timed out after {cpu:.0f} cpu s"}
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": tail, "result": f"failed: {tail}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _secs(r: dict | None) -> str:
    if r is None or "wall" not in r:
        return "-"
    return (">" if r.get("timeout") else "") + f"{r['wall']:.3g}"


def _cpu(r: dict | None) -> str:
    if r is None or "cpu" not in r:
        return "-"
    return (">" if r.get("timeout") else "") + f"{r['cpu']:.3g}"


def fastest(runs: list[dict]) -> dict:
    """The run with the least wall time among those that finished (else the first).  Where the runs timed a
    plain run beside the command (``philly-command``), each of the plain run's figures is its fewest seconds
    over the runs: each run's plain run is a process of its own, disturbed by the load apart from its command."""
    timed = [r for r in runs if "wall" in r and not r.get("timeout")]
    best = min(timed, key=lambda r: r["wall"]) if timed else runs[0]
    plain = [r for r in timed if "plain_wall" in r]
    if len(plain) > 1:
        wall, cpu = min(r["plain_wall"] for r in plain), min(r["plain_cpu"] for r in plain)
        best = {**best, "plain_wall": wall, "plain_cpu": cpu,
                "result": f"{best['result']}; fastest plain run of {len(plain)} {wall:.3g} s (cpu {cpu:.3g}): "
                          f"command {best['wall'] / wall:.2f}x (cpu {best['cpu'] / cpu:.2f}x)"}
    return best


def is_reference(checkout: Path) -> bool:
    """Whether ``checkout`` is a git checkout of :data:`REFERENCE` (its HEAD, unmodified or not)."""
    try:
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip().startswith(REFERENCE)


def needs(name: str) -> float | None:
    """The speed-up over :data:`REFERENCE` that meets case ``name``'s target (None: no figure)."""
    target, fig = CASES[name][0], REFERENCE_FIGURES.get(name)
    return None if target is None or fig is None else fig / target


def table(cases: list[str], base: Path | None, timeout: float, repeat: int = 1,
          reference: bool | None = None) -> None:
    """Print the table; ``reference``: whether ``base`` is :data:`REFERENCE` (None: ask git)."""
    here = REPO
    if base is not None and reference is None:
        reference = is_reference(base)
    print(f"after: {here}" + (f"\nbefore: {base}" + (f" (the targets' reference, {REFERENCE})" if reference else "")
                              if base else "")
          + (f"\neach side's fastest of {repeat} runs, alternating" if repeat > 1 else ""))
    head = f"{'case':18} {'target':>8} " + (f"{'before s':>9} {'cpu s':>7} " if base else "") + \
        f"{'after s':>8} {'cpu s':>7} " + (f"{'ratio':>7} {'cpu':>6} {'needs':>6} " if base else "") + \
        f"{'met':>11}  result (before | after)"
    print(head)
    done: dict[str, dict] = {}  # each case's after-side result, for the relative targets
    for name in cases:
        target, mem, _ = CASES[name]
        befores: list[dict] = []
        afters: list[dict] = []
        for _ in range(repeat):
            if base:
                befores.append(run_child(base, name, timeout))
            afters.append(run_child(here, name, timeout))
        before = fastest(befores) if base else None
        after = fastest(afters)
        # the wall-time ratio, read by the ratio column and the ratio verdict (a lower bound when before timed out)
        wall_ratio = (before["wall"] / after["wall"]
                      if before and "wall" in before and "wall" in after and after["wall"] > 0 else None)
        ratio = "-" if wall_ratio is None else ("≥" if before and before.get("timeout") else "") + f"{wall_ratio:.1f}x"
        cpu_ratio = "-"
        if before and "cpu" in before and "cpu" in after and after["cpu"] > 0:
            cpu_ratio = ("≥" if before.get("timeout") else "") + f"{before['cpu'] / after['cpu']:.1f}x"
        need = needs(name) if reference else None
        met = "-"
        if target is not None and "wall" in after:
            # wall / CPU time: on a loaded machine the wall time says more about the load than the code
            met = "/".join("yes" if after[k] <= target and not after.get("timeout") else "no" for k in ("wall", "cpu"))
            if mem is not None and after.get("peak_mb", 0) > mem:
                met = "no/no"
            if need is not None:  # and by the ratio against the reference, measured side by side
                met += "/yes" if wall_ratio is not None and not after.get("timeout") and wall_ratio >= need else "/no"
        done[name] = after
        rt = RATIO_TARGETS.get(name)
        if rt is not None and "wall" in after:  # against the plain run of the same configuration
            met = "/".join("yes" if f"plain_{k}" in after and after[k] <= rt * after[f"plain_{k}"] else "no"
                           for k in ("wall", "cpu"))
        tgt = "-" if target is None else f"{target:g} s" + (f"/{mem / 1024:g}GB" if mem else "")
        if rt is not None:
            tgt = f"{rt:g}x sim"
        if name in RELATIVE:  # at most that many times another case of this table, by wall and by CPU time
            ref, most = RELATIVE[name]
            tgt = f"{most:g}x"
            other = done.get(ref)
            if other is not None and all(k in other and k in after for k in ("wall", "cpu")):
                met = "/".join("yes" if after[k] <= most * other[k] and not after.get("timeout") else "no"
                               for k in ("wall", "cpu"))
                after = {**after, "result": f"{after['result']}; {after['wall'] / other['wall']:.1f}x {ref}"}
        extra = ""
        for r in (before, after):
            if r and "peak_mb" in r:
                extra += f" [peak {r['peak_mb']:.0f} MB]"
        res = f"{before['result']} | {after['result']}" if before else after["result"]
        cols = f"{name:18} {tgt:>8} "
        if base:
            cols += f"{_secs(before):>9} {_cpu(before):>7} "
        cols += f"{_secs(after):>8} {_cpu(after):>7} "
        if base:
            cols += f"{ratio:>7} {cpu_ratio:>6} {'-' if need is None else f'{need:.1f}x':>6} "
        print(f"{cols}{met:>11}  {res}{extra}", flush=True)


def ratio_stats(ratios: list[float]) -> str:
    """A round-by-round ratio: its median, least and greatest, and in how many rounds it was under 1."""
    if not ratios:
        return "-"
    import statistics

    under = sum(1 for r in ratios if r < 1.0)
    return (f"{statistics.median(ratios):.3f}x  ({min(ratios):.3f}-{max(ratios):.3f}x, "
            f"under 1 in {under}/{len(ratios)})")


def interleave(cases: list[str], base: Path | None, timeout: float, rounds: int) -> dict[tuple[str, str], list[dict]]:
    """Run ``cases`` interleaved (see the module notes: ``--interleave``), print the table; returns the runs
    by (case, side), side ``before`` or ``after``, in round order."""
    import statistics

    sides: list[tuple[str, Path]] = [("before", base), ("after", REPO)] if base is not None else [("after", REPO)]
    seq = [(name, side, path) for name in cases for side, path in sides]
    print(f"after: {REPO}" + (f"\nbefore: {base}" if base is not None else "")
          + f"\ninterleaved: {rounds} rounds of {len(seq)} runs, each in a process of its own, the order of every "
          f"other round reversed", flush=True)
    runs: dict[tuple[str, str], list[dict]] = {(name, side): [] for name, side, _ in seq}
    for i in range(rounds):
        for name, side, path in (seq if i % 2 == 0 else seq[::-1]):
            r = run_child(path, name, timeout)
            runs[name, side].append(r)
            print(f"  round {i + 1}: {name} {side} {_cpu(r)} cpu s", flush=True)  # (what a stopped run leaves)

    def cpu(r: dict) -> float | None:
        return r["cpu"] if "cpu" in r and not r.get("timeout") else None

    print(f"{'case':18} {'side':6} {'runs':>4} {'cpu med':>8} {'cpu min':>8} {'wall med':>8}  result")
    for (name, side), rs in runs.items():
        cpus = [c for r in rs if (c := cpu(r)) is not None]
        walls = [r["wall"] for r in rs if "wall" in r and not r.get("timeout")]
        results = list(dict.fromkeys(r["result"] for r in rs))
        res = results[0] if len(results) == 1 else "differs: " + " / ".join(results)
        med = f"{statistics.median(cpus):.3g}" if cpus else "-"
        least = f"{min(cpus):.3g}" if cpus else "-"
        wall = f"{statistics.median(walls):.3g}" if walls else "-"
        print(f"{name:18} {side:6} {len(cpus):>4} {med:>8} {least:>8} {wall:>8}  {res}")

    def ratios(a: list[dict], b: list[dict]) -> list[float]:
        return [x / y for ra, rb in zip(a, b, strict=True)
                if (x := cpu(ra)) is not None and (y := cpu(rb)) is not None and y > 0]

    print("CPU ratios taken round by round: median (least-greatest, rounds under 1)")
    for name in cases:
        if base is not None:
            print(f"  {name} after / before: {ratio_stats(ratios(runs[name, 'after'], runs[name, 'before']))}")
    for name in cases:
        ref = RELATIVE.get(name)
        if ref is None or ref[0] not in cases:
            continue
        for side, _ in sides:
            got = ratios(runs[name, side], runs[ref[0], side])
            verdict = ""
            if got:
                verdict = f"; target {ref[1]:g}x: median {'met' if statistics.median(got) <= ref[1] else 'not met'}"
            print(f"  {name} / {ref[0]} ({side}): {ratio_stats(got)}{verdict}")
    return runs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="a checkout to compare with (before)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from: {', '.join(CASES)}")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per case and checkout")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case and checkout (the fastest is shown)")
    ap.add_argument("--interleave", type=int, default=0, metavar="N",
                    help="N rounds of every case on each side, interleaved: medians and round-by-round ratios")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--plain", type=Path, help=argparse.SUPPRESS)  # (philly-command's plain run)
    a = ap.parse_args(argv if argv is not None else [])
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    if a.interleave < 0:
        ap.error("--interleave must not be negative")
    if a.child:
        print(json.dumps(CASES[a.child][2]()))
        return
    if a.plain:
        print(json.dumps(plain_run(a.plain)))
        return
    if not data_dir().is_dir():
        print(f"bench_targets: data not found at {data_dir()}; set GPULOOM_DATA")
        return
    cases = [c for c in a.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    if a.interleave:
        interleave(cases, a.base.resolve() if a.base else None, a.timeout, a.interleave)
        return
    table(cases, a.base.resolve() if a.base else None, a.timeout, a.repeat)


if __name__ == "__main__":
    main(sys.argv[1:])
