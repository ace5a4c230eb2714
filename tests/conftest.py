"""Shared fixtures.  Real data is found as the commands find it (``$GPULOOM_DATA``, else
``../shared/data`` beside the checkout: :mod:`gpuloom.perf.datadir`); tests that need it are
skipped where it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuloom.perf.datadir import data_dir as find_data
from gpuloom.perf.datadir import describe_search

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    p = find_data()
    if p is None:
        pytest.skip(f"real data not found: looked in {describe_search()}")
    return p


# ---------------------------------------------------------------------------------------------
# make_view: a tiny, complete round input for testing a policy as a pure function
@pytest.fixture
def make_view():  # noqa: ANN201
    """``make_view(jobs=..., current=..., cluster=..., model=..., now=...)`` -> a policy ``View``.

    Defaults: a 2x4 cluster (12 cores, 64 GB per node), the model ``simulate``
    builds (plus an empty sensitivity catalogue), and six arrived jobs of 1-4 GPUs whose specs carry what every
    registered policy may read (Muri stage times, a scaling curve, a model name).
    ``current`` maps job id -> Allocation; those jobs hold them.
    """
    import numpy as np

    from gpuloom.core.cluster import Cluster
    from gpuloom.core.job import Job, JobSpec
    from gpuloom.perf.assembly import build_model
    from gpuloom.perf.sensitivity import add_sensitivity
    from gpuloom.policies.base import FreeState, View

    def _jobs() -> list[Job]:
        shapes = [(1, 300.0, [0.0, 0.1, 0.3, 0.0]), (2, 200.0, [0.0, 0.3, 0.1, 0.0]), (4, 500.0, [0.0, 0.2, 0.2, 0.1]),
                  (1, 100.0, [0.1, 0.3, 0.1, 0.0]), (2, 50.0, [0.0, 0.1, 0.4, 0.0]), (3, 400.0, [0.0, 0.2, 0.2, 0.0])]
        out = []
        for i, (g, d, rt) in enumerate(shapes):
            spec = JobSpec(f"j{i}", float(i), g, d, model="resnet50",
                           attrs={"resource_times": rt, "throughput": {1: 1.0, 2: 1.8, 4: 3.2, 8: 5.0}})
            j = Job(spec, i)
            j.arrive(spec.arrival)
            out.append(j)
        return out

    def make(jobs=None, current=None, cluster=None, model=None, now: float = 10.0, seed: int = 0):  # noqa: ANN001, ANN202
        cl = cluster or Cluster.homogeneous(2, 4, 12, 64_000)
        js = list(jobs) if jobs is not None else _jobs()
        by_id = {j.id: j for j in js}
        cur = dict(current or {})
        for jid, a in cur.items():
            by_id[jid].alloc = a
        # the model `simulate` builds, with an (empty) profile catalogue the Synergy sizers can read
        m = model if model is not None else add_sensitivity(build_model(cl))
        m.bind(by_id)
        return View(now, cl, js, cur, m, np.random.default_rng(seed), 1, free=FreeState.of(cl, cur))

    return make


@pytest.fixture(scope="session", autouse=True)
def _remove_job_dirs():  # noqa: ANN202
    """The services tests start (as root) put default checkpoint directories in
    ``$GPULOOM_JOB_DIR_BASE/gpuloom-ID`` (see ``runtime/service/security.py``): this session's go in a base
    of its own (servers the tests start inherit the variable), removed after the session, so two
    test sessions on one machine never remove each other's."""
    import os
    import shutil
    import tempfile

    from gpuloom.runtime.service.security import JOB_DIR_BASE, JOB_DIR_BASE_ENV

    # (not named gpuloom-*: sessions of an older checkout remove every new /var/tmp/gpuloom-* when they end)
    base = tempfile.mkdtemp(prefix="tests-gpuloom-", dir=JOB_DIR_BASE)
    os.chmod(base, 0o711)  # job accounts pass through to their own directories
    old = os.environ.get(JOB_DIR_BASE_ENV)
    os.environ[JOB_DIR_BASE_ENV] = base
    yield
    if old is None:
        os.environ.pop(JOB_DIR_BASE_ENV, None)
    else:
        os.environ[JOB_DIR_BASE_ENV] = old
    shutil.rmtree(base, ignore_errors=True)
