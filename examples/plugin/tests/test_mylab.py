"""gpuloom's contract checks, run on this package's policy and trace format."""

from pathlib import Path

from gpuloom.sim.contract import check_policy, check_trace_reader

HERE = Path(__file__).parent


def test_fewest_gpus_keeps_the_order_contract() -> None:
    check_policy("order", "fewest-gpus")


def test_the_mylab_format_keeps_the_reader_contract() -> None:
    jobs = check_trace_reader("mylab", HERE / "jobs.txt")
    assert [(j.id, j.gpus) for j in jobs[:3]] == [("a", 4), ("b", 1), ("c", 2)]
