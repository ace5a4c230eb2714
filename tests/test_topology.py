"""nvidia-smi topo -m parser, cost tables, PACK/SPREAD choice, the topology factor and policies, the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.core.cluster import Cluster
from gpuloom.core.job import Job, JobSpec
from gpuloom.core.plan import Allocation, Part
from gpuloom.perf.model import ThroughputModel
from gpuloom.perf.topology import (
    LINK_COST,
    TopologyError,
    TopologyFactor,
    add_topology,
    link_cost,
    load_topology,
    parse_topology,
)
from gpuloom.policies import PolicyError, make
from gpuloom.policies.base import FreeState, Request, View
from gpuloom.sim import simulate

V100 = "v100_dgx1class_8gpu_oneflow_dlperf.txt"
EXPECTED = {
    # file: (GPUs, NICs, link tokens seen among GPUs)
    "a100_aws_p4d_24xlarge_8gpu.txt": (8, 0, {"NV12"}),
    "a100_dgx_8gpu_11nic_nolegend.txt": (8, 11, {"NV12"}),
    "a100_hgx_8gpu_epyc7763_mlx5.txt": (8, 1, {"NV12"}),
    "h100_sxm_8gpu_12nic_dgxclass.txt": (8, 12, {"NV18"}),
    "h100_sxm_8gpu_6nic_princeton_della_quirky_affinity.txt": (8, 6, {"NV18"}),
    "hadoop_yarn_test_fixture_4gpu_pcie_soc.txt": (4, 0, {"PHB", "SOC"}),
    "hadoop_yarn_test_fixture_8gpu_nvlink.txt": (8, 0, {"NV1", "NV2", "PHB"}),
    "v100_dgx1class_8gpu_nersc_cgpu_nolegend.txt": (8, 9, {"NV1", "NV2", "SYS"}),
    V100: (8, 1, {"NV1", "NV2", "SYS"}),
}


def test_every_shared_file_is_covered(data_dir):
    assert sorted(p.name for p in (data_dir / "topology").iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parse_real_outputs(data_dir, name):
    t = load_topology(data_dir / "topology" / name)
    gpus, nics, kinds = EXPECTED[name]
    assert t.gpus == tuple(f"GPU{i}" for i in range(gpus))
    assert len(t.nics) == nics
    seen = {t.links[i][j] for i in range(gpus) for j in range(gpus) if i != j}
    assert seen == kinds
    assert np.allclose(t.cost, t.cost.T) and np.all(np.diag(t.cost) == 0)
    # NIC rows stay out of the GPU matrix; each GPU has one link per NIC
    assert all(len(r) == nics for r in t.nic_links) if nics else t.nic_links == ()


def test_nic_details(data_dir):
    h = load_topology(data_dir / "topology/h100_sxm_8gpu_12nic_dgxclass.txt")
    assert h.nics[0] == "mlx5_0" and h.nics[11] == "mlx5_11"  # from the NIC legend
    assert h.nic_links[0][:4] == ("PIX", "PXB", "NODE", "NODE")
    q = load_topology(data_dir / "topology/h100_sxm_8gpu_6nic_princeton_della_quirky_affinity.txt")
    assert q.nic_links[3][2] == "PIX"  # empty CPU-affinity cells do not shift the row
    n = load_topology(data_dir / "topology/v100_dgx1class_8gpu_nersc_cgpu_nolegend.txt")
    assert n.nics[0] == "mlx4_0" and n.nic_links[4][0] == "NODE"


def test_link_costs():
    assert [link_cost(f"NV{n}") for n in (1, 2, 12, 18)] == [100.0, 50.0, 100.0 / 12, 100.0 / 18]
    order = ["NV18", "NV12", "NV4", "NV2", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert [LINK_COST[x] for x in order] == sorted(LINK_COST[x] for x in order)
    assert LINK_COST["SOC"] == LINK_COST["SYS"]


def test_v100_cube_mesh_pack_by_hand(data_dir):
    t = load_topology(data_dir / "topology" / V100)
    # 2 GPUs: the cheapest pairs are the double NVLinks (NV2, cost 50); the first is GPU0-GPU3
    assert t.best_set(2) == ((0, 3), 50.0)
    # 4 GPUs: a fully NVLinked quad: 0-1 NV1, 0-2 NV1, 0-3 NV2, 1-2 NV2, 1-3 NV1, 2-3 NV2
    assert t.best_set(4) == ((0, 1, 2, 3), 100 + 100 + 50 + 50 + 100 + 50)
    assert t.set_cost([4, 5, 6, 7]) == 450.0
    # SPREAD for 2: a cross-socket pair (SYS, 600)
    assert t.best_set(2, "spread") == ((0, 5), 600.0)
    # with GPU 3 busy the best pair left is another NV2 pair
    assert t.choose([0, 1, 2, 4, 5, 6, 7], 2) == (0, 4)
    # with GPUs 0-2 busy, a 4-GPU job gets the other quad
    assert t.choose([3, 4, 5, 6, 7], 4) == (4, 5, 6, 7)
    masks, costs = t.cost_table(4)
    assert len(masks) == 70 and np.all(np.diff(costs) >= 0)
    assert t.cost_table(4)[0] is masks  # cached


def test_yarn_fallbacks(data_dir):
    t = load_topology(data_dir / "topology" / V100)
    assert t.choose([5, 2, 7], 1) == (2,)  # one GPU: first free
    assert t.choose([6, 1, 4], 3) == (1, 4, 6)  # all free GPUs
    assert t.choose([6, 1], 2) == (1, 6)  # fewer than three free
    assert t.choose([6, 1], 3) is None
    with pytest.raises(TopologyError, match="pack' or 'spread"):
        t.choose([0, 1, 2, 3], 2, "tight")


def test_yarn_fixture_4gpu(data_dir):
    t = load_topology(data_dir / "topology/hadoop_yarn_test_fixture_4gpu_pcie_soc.txt")
    assert t.choose([0, 1, 2, 3], 2, "pack") == (0, 1)  # PHB pair
    assert t.choose([0, 1, 2, 3], 2, "spread") == (0, 2)  # SOC pair


# `nvidia-smi topo -m | tee topo.txt` on a lent one-GPU H200 machine (driver 580): its matrix byte for
# byte (the legend cut short), the header underlined with terminal escapes although it went to a pipe
H200_ONE_GPU = (
    "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \t0-15\t0\t\tN/A\n"
    "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n"
)


def test_escape_codes_and_a_single_gpu():
    t = parse_topology(H200_ONE_GPU, "h200")
    assert t.gpus == ("GPU0",) and t.links == (("X",),) and t.nics == ()
    assert t.choose([0], 1, "pack") == (0,)
    underlined = "\x1b[4m\tGPU0\tGPU1\tCPU Affinity\x1b[0m\nGPU0\t X \tNV4\t0-7\nGPU1\tNV4\t X \t0-7\n"
    assert parse_topology(underlined, "u").links == (("X", "NV4"), ("NV4", "X"))


@pytest.mark.parametrize(
    "text,msg",
    [
        ("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNVL\t X \n", r"t:3: unknown link type 'NVL' in row GPU1, column GPU0"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tFOO\t0-3\nGPU1\tFOO\t X \t0-3\n", r"t:2: unknown link type 'FOO'"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV1\t X \n", "asymmetric link GPU0-GPU1"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV2\n", "no row for GPU1"),
        ("\tGPU0\tGPU1\nGPU0\t X\n", "t:2: row GPU0 has 1 link cells, the header 2"),
        ("hello\n", "no matrix header"),
        ("\tGPU0\tGPU1\nGPU0\tNV2\t X \nGPU1\tNV2\t X \n", "'X' \\(self\\) in row GPU0, column GPU1"),
    ],
)
def test_bad_input_names_token_and_line(text, msg):
    with pytest.raises(TopologyError, match=msg):
        parse_topology(text, "t")


def _job(model: str, gpus: int, jid: str = "j", **attrs: object) -> Job:
    return Job(JobSpec(jid, 0.0, gpus, 100.0, model=model, attrs=attrs))


def test_topology_factor(data_dir):
    t = load_topology(data_dir / "topology" / V100)
    cl = Cluster.homogeneous(2, 8)
    f = TopologyFactor(cl, t)
    best = Allocation("j", (Part(0, (0, 3), 0, 0),))
    worst = Allocation("j", (Part(1, (8, 13), 0, 0),))  # local 0,5: SYS
    assert f(_job("vgg19", 2), best) == 1.0
    assert f(_job("vgg19", 2), worst) == pytest.approx(1 / 1.3)
    mid = Allocation("j", (Part(0, (0, 1), 0, 0),))  # NV1: (100-50)/(600-50)
    assert f(_job("bert", 2), mid) == pytest.approx(1 / (1 + 0.25 * 50 / 550))
    assert f(_job("pointnet", 2), worst) == 1.0  # insensitive
    assert f(_job("pointnet", 2, topology_sensitivity=0.5), worst) == pytest.approx(1 / 1.5)
    m = add_topology(ThroughputModel.default(cl), t)
    assert m.speed(_job("vgg19", 2), worst) == pytest.approx(1 / 1.3)


def _view(cl: Cluster, model: ThroughputModel) -> View:
    return View(0.0, cl, [], {}, model, np.random.default_rng(0))


def test_topology_policies(data_dir):
    t = load_topology(data_dir / "topology" / V100)
    cl = Cluster.homogeneous(2, 8)
    view = _view(cl, add_topology(ThroughputModel.default(cl), t))
    free = FreeState(cl)
    # node 0 has GPUs 0 and 3 busy (its NV2 pair 1-2 is left), node 1 is empty
    for g in (0, 3):
        free.gpu_free[g] = False
    free.gpu_counts[0] -= 2
    req = Request((_job("vgg19", 2),), 2)
    parts = make("place", "topo-pack").choose(req, free, view)
    assert parts[0].node == 0 and parts[0].gpus == (1, 2)  # NV2 (cost 50), best fit on the fuller node
    parts = make("place", "topo-spread").choose(req, free, view)
    assert parts[0].node == 0 and parts[0].gpus == (1, 4)  # SYS (600)
    req2 = Request((_job("vgg19", 2, topology="spread"),), 2)
    assert make("place", "topo-pack").choose(req2, free, view)[0].gpus == (1, 4)
    with pytest.raises(PolicyError, match="topology must be 'pack' or 'spread'"):
        make("place", "topo-pack").choose(Request((_job("x", 2, topology="tight"),), 2), free, view)
    with pytest.raises(PolicyError, match="needs node topologies"):
        make("place", "topo-pack").choose(req, free, _view(cl, ThroughputModel.default(cl)))


def test_topology_simulation(data_dir):
    t = load_topology(data_dir / "topology" / V100)
    cl = Cluster.homogeneous(2, 8)
    specs = [JobSpec(f"j{i}", 10.0 * i, g, 1000.0, model="vgg19") for i, g in enumerate([2, 2, 4, 1, 3, 2, 8, 2])]
    res = {}
    for p in ("topo-pack", "topo-spread"):
        m = add_topology(ThroughputModel.default(cl), t)
        res[p] = simulate(cl, specs, place=p, model=m, round_len=60.0).summary()
        assert res[p]["completed"] == len(specs)
    assert res["topo-pack"]["mean_jct"] < res["topo-spread"]["mean_jct"]


def test_cli_topo(data_dir):
    r = CliRunner().invoke(app, ["topo", str(data_dir / "topology" / V100)])
    assert r.exit_code == 0, r.output
    assert "GPU7" in r.output and "mlx5_0" in r.output
    assert "   2  0,3" in r.output and "   4  0,1,2,3" in r.output


def test_cli_topo_error(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tQQQ\t X \n")
    r = CliRunner().invoke(app, ["topo", str(p)])
    assert r.exit_code == 1
    assert "unknown link type 'QQQ'" in r.output
