"""One registry pattern for policies, trace formats and executors: built-ins register themselves,
outside code comes by entry points (a package's metadata) or as module:attr.

The entry-point tests write a real installed distribution (a ``*.dist-info`` with
``entry_points.txt``, what pip writes) into a folder and run a fresh interpreter with that folder on
``PYTHONPATH``: ``importlib.metadata`` finds it as it finds any installed package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuloom.core.registry import Registry, RegistryError
from gpuloom.policies import base as pb
from gpuloom.sim.traces import FORMATS

SRC = Path(__file__).resolve().parents[1] / "src"

PLUGIN = '''
from gpuloom.policies.order import KeyOrder


class FewestGpus(KeyOrder):
    dynamic = False

    def key(self, job, view):
        return float(job.spec.gpus)


class NotAPolicy:
    pass


def read_lines(path):
    from gpuloom.core.job import JobSpec

    rows = [line.split() for line in open(path) if line.strip()]
    return [JobSpec(r[0], float(r[1]), int(r[2]), float(r[3])) for r in rows]


def broken():
    raise RuntimeError("never called")
'''


def _install(site: Path, entry_points: str, module: str = PLUGIN) -> None:
    """A distribution ``mylab`` 1.0 with module ``mylab_plugin`` and ``entry_points`` in ``site``."""
    (site / "mylab_plugin.py").write_text(module)
    dist = site / "mylab-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def _run(site: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(SRC)])}
    return subprocess.run([sys.executable, "-W", "always", "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_entry_points_plug_in_policies_and_trace_formats(tmp_path: Path) -> None:
    _install(tmp_path, """
        [gpuloom.policies]
        fewest-gpus = mylab_plugin:FewestGpus
        [gpuloom.traces]
        lines = mylab_plugin:read_lines
    """)
    (tmp_path / "jobs.txt").write_text("b 5 2 100\na 0 1 50\n")
    r = _run(tmp_path, f"""
        from gpuloom.policies import base as pb
        from gpuloom.sim.traces import load_trace
        from gpuloom.scheduler import Scheduler
        print(pb.names("order"))
        cls = pb.lookup("order", "fewest-gpus")
        print(cls.__name__, cls.name, "fewest-gpus" in pb.names("place"))
        print(Scheduler.from_names("fewest-gpus").label)
        print([(j.id, j.arrival) for j in load_trace({str(tmp_path / "jobs.txt")!r}, "lines")])
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "'fewest-gpus'" in lines[0] and "'fifo'" in lines[0]
    assert lines[1:] == ["FewestGpus fewest-gpus False", "fewest-gpus/none/proportional/packed-sticky",
                         "[('a', 0.0), ('b', 5.0)]"]


def test_a_broken_or_wrong_plugin_is_reported_and_the_builtins_stay(tmp_path: Path) -> None:
    _install(tmp_path, """
        [gpuloom.policies]
        missing = mylab_plugin:Nowhere
        not-a-policy = mylab_plugin:NotAPolicy
        fifo = mylab_plugin:FewestGpus
    """)
    r = _run(tmp_path, """
        from gpuloom.policies import base as pb
        print(pb.names("order"))
        print(pb.lookup("order", "fifo").__name__)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1] == "FIFO"  # a plugin never replaces a built-in
    assert "fewest" not in r.stdout.splitlines()[0]
    assert "entry point missing = mylab_plugin:Nowhere (group gpuloom.policies) failed to load: AttributeError" \
        in r.stderr
    assert "entry point fifo = mylab_plugin:FewestGpus (group gpuloom.policies): order policy 'fifo' is already " \
        "registered; ignored" in r.stderr
    assert "entry point not-a-policy = mylab_plugin:NotAPolicy (group gpuloom.policies) is not a policy class " \
        "(one derived from OrderPolicy, GroupPolicy, SizePolicy, PlacePolicy or QueuePolicy); ignored" in r.stderr
    assert "not-a-policy" not in r.stdout


def test_module_class_on_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "mylab_plugin.py").write_text(PLUGIN)
    (tmp_path / "jobs.txt").write_text("a 0 1 50\nb 5 2 100\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)])}
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "gpuloom", "simulate", "--trace", str(tmp_path / "jobs.txt"),
                        "--format", "mylab_plugin:read_lines", "--order", "mylab_plugin:FewestGpus",
                        "--cluster", "1x2", "--no-plots", "-o", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    rows = (out / "jobs.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[1].startswith("a,") and rows[2].startswith("b,")


def test_outside_names_are_checked() -> None:
    with pytest.raises(pb.PolicyError, match=r"order policy 'nosuch_module_x:A': cannot import 'nosuch_module_x'"):
        pb.lookup("order", "nosuch_module_x:A")
    with pytest.raises(pb.PolicyError, match=r"module 'gpuloom.policies.order' has no 'Nope'"):
        pb.lookup("order", "gpuloom.policies.order:Nope")
    with pytest.raises(pb.PolicyError, match="gpuloom.policies.place:PackedSticky is registered as a order policy "
                                             "but does not derive from OrderPolicy"):
        pb.lookup("order", "gpuloom.policies.place:PackedSticky")
    with pytest.raises(pb.PolicyError, match=r"unknown order policy 'fifoo'; did you mean 'fifo'\? \(choose from: "
                                             r"2d-las, .*; or module:Class\)"):
        pb.lookup("order", "fifoo")
    with pytest.raises(ValueError, match=r"trace format 'x:read_y': cannot import 'x'"):
        FORMATS.lookup("x:read_y")
    with pytest.raises(ValueError, match="a trace reader is a function"):
        FORMATS.lookup("gpuloom.sim.traces:Trace")


def test_builtins_register_themselves_without_an_import_list() -> None:
    # every module of the home package is imported on first use: no list to forget
    assert set(FORMATS) == {"alibaba", "blox", "csv", "gavel", "jsonl", "muri", "pal", "philly", "sia", "synergy",
                            "tiresias"}
    assert pb.names("group") == ["muri", "none"]
    reg: Registry[int] = Registry("number", check=lambda obj, where: obj if isinstance(obj, int) else
                                  _refuse(f"{where}: not a number"))
    reg.add(1, "one")
    with pytest.raises(RegistryError, match="'a b': a name is non-empty, without ':' or spaces"):
        reg.add(2, "a b")
    with pytest.raises(RegistryError, match="x: not a number"):
        reg.add("1", "one-text", where="x")
    assert dict(reg) == {"one": 1}


def _refuse(msg: str) -> int:
    raise RegistryError(msg)


def test_executors_by_name_entry_point_or_module_function(tmp_path: Path) -> None:
    _install(tmp_path, """
        [gpuloom.executors]
        mine = mylab_plugin:broken
    """)
    r = _run(tmp_path, """
        from gpuloom.cli.executors import EXECUTORS
        from gpuloom.cli.executor.local import local
        print(sorted(EXECUTORS), EXECUTORS.lookup("local") is local)
        print([EXECUTORS[n].__module__ for n in ("local", "ray", "slurm")])
        print(EXECUTORS.lookup("mine").__name__, EXECUTORS.lookup("mylab_plugin:broken").__name__)
    """)
    assert r.returncode == 0, r.stderr
    # each built-in registers itself in its own module: adding one is adding a file
    assert r.stdout.splitlines() == ["['local', 'mine', 'ray', 'slurm', 'slurm-srun', 'slurm-steps'] True",
                                     "['gpuloom.cli.executor.local', 'gpuloom.cli.executor.ray', "
                                     "'gpuloom.cli.executor.slurm']", "broken broken"]
    env = {**os.environ, "GPULOOM_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(SRC)}
    r = subprocess.run([sys.executable, "-m", "gpuloom", "serve", "--executor", "lcoal", "--port", "0"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stderr.strip()) == (
        2, "error: unknown executor 'lcoal'; did you mean 'local'? (choose from: local, ray, slurm, slurm-srun, slurm-steps; or module:function)")


def test_the_extending_guide_shows_the_example_plugin_as_it_is() -> None:
    # docs/extending.md's Python blocks are the example package's two modules, verbatim
    repo = SRC.parent
    doc = (repo / "docs" / "extending.md").read_text()
    blocks = [b.split("\n", 1)[1] for b in doc.split("```python")[1:]]
    blocks = [b[: b.index("```")] for b in blocks]
    plugin = repo / "examples" / "plugin"
    assert blocks == [(plugin / "mylab" / "orders.py").read_text(), (plugin / "mylab" / "traces.py").read_text()]
    toml = (plugin / "pyproject.toml").read_text()
    assert 'fewest-gpus = "mylab.orders:FewestGpus"' in toml and 'mylab = "mylab.traces:read_mylab"' in toml


def test_serve_runs_jobs_through_a_plugin_executor(tmp_path: Path) -> None:
    # an executor factory from outside gpuloom (module:function), wrapping the local one: serve builds
    # the executor through it, and a job runs to completion
    import httpx

    from gpuloom.cli.testbed import wait_for_serve
    from service_util import kill_jobs, stepper_cmd, wait_for

    (tmp_path / "lab_exec.py").write_text(textwrap.dedent("""
        from gpuloom.cli.executor.local import local

        def make(ctx):
            (ctx.state_dir / "made-by-plugin").write_text(str(ctx.inventory.num_gpus))
            return local(ctx)
    """))
    sd = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)])}
    with open(tmp_path / "serve.out", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpuloom", "serve", "--port", "0", "--state-dir", str(sd),
                                 "--cluster", "1x2", "--round", "0.2", "--log-level", "warning",
                                 "--executor", "lab_exec:make"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        up = wait_for_serve(sd, proc, 120.0, poll_s=0.05)
        assert up is not None, (tmp_path / "serve.out").read_text()
        url, token = up
        assert (sd / "made-by-plugin").read_text() == "2"
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
            r = c.post("/jobs", json={"command": stepper_cmd(2, 0.05), "gpus": 1})
            assert r.status_code == 201, r.text
            jid = int(r.json()["id"])
            done = wait_for(lambda: (j := c.get(f"/jobs/{jid}").json())["state"] == "finished" and j, 60, "the job")
            assert done["exit_code"] == 0, done
    finally:
        proc.terminate()
        proc.wait(30)
        kill_jobs(sd)


FACTOR_PLUGIN = '''
from gpuloom.perf.assembly import FactorDecl, ModelOption


class Slowdown:
    name = "slowdown"

    def __init__(self, f):
        self.f = f

    def __call__(self, job, alloc):
        return self.f


def build(cluster, options, specs):
    return Slowdown(options["slowdown_factor"])


SLOWDOWN = FactorDecl("slowdown", (ModelOption("slowdown_factor", float, None, "Every job's speed times X.",
                                               metavar="X", cli_type=float),), build)
CLASH = FactorDecl("clash", (ModelOption("topology", str, None, "Another topology."),), build)
'''


def test_model_factors_plug_in_by_entry_points(tmp_path: Path) -> None:
    # a factor from outside: built when its option is given, its option a -P name and a command-line flag;
    # one that takes a built-in's option is reported and left out
    _install(tmp_path, """
        [gpuloom.factors]
        slowdown = mylab_plugin:SLOWDOWN
        clash = mylab_plugin:CLASH
    """, FACTOR_PLUGIN)
    r = _run(tmp_path, """
        from gpuloom.core.cluster import Cluster
        from gpuloom.core.job import Job, JobSpec
        from gpuloom.core.plan import Allocation, Part
        from gpuloom.perf.assembly import FACTORS, FLAG_OPTIONS, MODEL_OPTIONS, build_model, split_params
        print(list(FACTORS))
        print("slowdown_factor" in MODEL_OPTIONS, FLAG_OPTIONS[-1].cli, split_params({"slowdown_factor": 1, "x": 2}))
        cl = Cluster.homogeneous(1, 2)
        job = Job(JobSpec("a", 0.0, 1, 10.0))
        alloc = Allocation("a", (Part(0, (0,), 6, 1000),))
        print(build_model(cl).speed(job, alloc), build_model(cl, {"slowdown_factor": "0.5"}).speed(job, alloc))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "['locality', 'scaling', 'interleave', 'variability', 'topology', 'sensitivity', 'gpu_type', 'storage', "
        "'slowdown']",
        "True --slowdown-factor ({'x': 2}, {'slowdown_factor': 1})",
        "1.0 0.5"]
    assert "entry point clash = mylab_plugin:CLASH (group gpuloom.factors): option 'topology' of factor 'clash' " \
        "is already factor 'topology''s; ignored" in r.stderr


def test_builtin_factors_are_registered_in_model_order() -> None:
    from gpuloom.perf.assembly import FACTORS, FactorDecl

    assert list(FACTORS) == ["locality", "scaling", "interleave", "variability", "topology", "sensitivity",
                             "gpu_type", "storage"]
    with pytest.raises(RegistryError, match="a model factor is a FactorDecl"):
        FACTORS.lookup("gpuloom.perf.assembly:build_model")
    with pytest.raises(RegistryError, match="option 'profiles' of factor 'mine' is already factor 'sensitivity''s"):
        FACTORS.add(FactorDecl("mine", FACTORS["sensitivity"].options, lambda c, o, s: None), "mine")
