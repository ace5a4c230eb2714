"""The LPs of Gavel's policies (:mod:`.gavel`) go to HiGHS here: one solver object kept per setting, and
:class:`GavelError` when it finds no optimum."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import PolicyError


class GavelError(PolicyError):
    """A Gavel stage that cannot run as configured."""


def solve_lp(c: np.ndarray, lb: np.ndarray, ub: np.ndarray, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray,
             row_lo: np.ndarray, row_hi: np.ndarray, what: str, solver: str = "ipm",
             time_limit: float = 60.0) -> tuple[np.ndarray, float]:
    """min c.x, row_lo <= A x <= row_hi, lb <= x <= ub, A given as (row, column, value) triplets; HiGHS's
    interior point without crossover (``solver="ipm"``) or its simplex.  Raises :class:`GavelError`
    when HiGHS finds no optimum."""
    import highspy

    n = len(c)
    m = len(row_lo)
    order = np.lexsort((rows, cols))
    start = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(cols, minlength=n), out=start[1:])
    h = _highs(solver, time_limit)
    h.clearModel()
    status = h.passModel(n, m, len(vals), 1, 1, 0.0, np.asarray(c, dtype=float), np.asarray(lb, dtype=float),
                         np.asarray(ub, dtype=float), np.asarray(row_lo, dtype=float), np.asarray(row_hi, dtype=float),
                         start, rows[order].astype(np.int32), np.asarray(vals, dtype=float)[order],
                         np.zeros(n, dtype=np.int32))
    if status == highspy.HighsStatus.kError:
        raise GavelError(f"{what} LP: HiGHS refused the model")
    h.run()
    ms = h.getModelStatus()
    if ms != highspy.HighsModelStatus.kOptimal:
        raise GavelError(f"{what} LP: {h.modelStatusToString(ms)}")
    return np.array(h.getSolution().col_value), float(h.getObjectiveValue())


_SOLVERS: dict[tuple[str, float], Any] = {}


def _highs(solver: str, time_limit: float) -> Any:
    h = _SOLVERS.get((solver, time_limit))
    if h is None:
        import highspy

        from .synergy_opt import _stdout_muted

        with _stdout_muted():  # HiGHS prints a banner when the object is made
            h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", time_limit)
        if solver == "ipm":
            h.setOptionValue("solver", "ipm")
            h.setOptionValue("run_crossover", "off")
        else:
            h.setOptionValue("solver", "simplex")
        _SOLVERS[(solver, time_limit)] = h
    return h
