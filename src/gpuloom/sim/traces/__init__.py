"""Trace readers: the real traces of published GPU-cluster schedulers -> :class:`JobSpec` lists.

``load_trace(path, fmt="auto", **opts)`` returns the jobs of one file sorted by
arrival (stable: ties keep file order); ``read_trace`` returns a :class:`Trace`
that also says how many rows were read and which were skipped and why.  Each
format has one reader function (``read_<format>``) that registers itself in
:data:`FORMATS` (``formats``); ``"auto"`` picks one from the extension and the header.

Common rules (every reader):

* the csv module does the splitting (quoting, ``\\r\\n``), numbers are checked
  field by field: a malformed row raises :class:`TraceError` naming the file,
  the 1-based line and the field (``trace.csv:17: field 'num_gpus': expected a
  positive integer, got 'x'``);
* blank lines are ignored (the Philly list ends with one); a file with no jobs
  is an error, and so is a job id seen twice (the message names both lines);
* times become seconds since the trace's origin; work is measured in reference
  seconds (``JobSpec.duration``), from ``iterations * iter_time`` where a trace
  gives both;
* model names are matched (duration, throughput and profile tables) through
  :func:`gpuloom.core.parse.normalise_model`.

The modules (each format's decisions are in its module docstring; the data
README in ``shared/data`` lists the files):

=================  ====================================================
``fields``         the field toolkit: :class:`TraceError`, :class:`Trace`,
                   ``Where``, ``read_rows``, ``Header``, ``int_field``,
                   ``float_field``, ``str_field``, ``Builder``, ...
``philly``         Sia's processed Philly job list
``sia``            Sia's sampled workloads, durations from PAL's conversion
``pal``            PAL / Blox traces (``pal`` and ``blox``)
``muri``           Muri's traces (milliseconds, per-resource iteration times)
``gavel``          Gavel's ``.trace`` files (assumed throughputs)
``synergy``        Synergy's traces, iteration times from its profile file
``tiresias``       Tiresias' trace
``alibaba``        Alibaba cluster-trace-gpu-v2023 pod list
``own``            gpuloom's own ``csv`` / ``jsonl`` format and :func:`save_trace`
``formats``        :data:`FORMATS`, the registry (entry points ``gpuloom.traces``)
``detect``         :func:`detect_format`, :func:`read_trace`, :func:`load_trace`
=================  ====================================================
"""

from .alibaba import ALIBABA_COLUMNS, read_alibaba
from .detect import FORMATS, detect_format, load_trace, read_trace
from .fields import Trace, TraceError
from .gavel import GAVEL_SAMPLES_PER_SECOND, GAVEL_STEPS_PER_SECOND, read_gavel
from .muri import MURI_COLUMNS, read_muri
from .own import OWN_FIELDS, read_csv, read_jsonl, save_trace
from .pal import read_pal
from .philly import read_philly
from .sia import SIA_DURATIONS, read_sia
from .sia import _power_law as _power_law  # for the tests of the fit
from .synergy import find_profiles, read_synergy, read_synergy_profiles, safe_arith
from .tiresias import read_tiresias

__all__ = [
    "ALIBABA_COLUMNS",
    "FORMATS",
    "GAVEL_SAMPLES_PER_SECOND",
    "GAVEL_STEPS_PER_SECOND",
    "MURI_COLUMNS",
    "OWN_FIELDS",
    "SIA_DURATIONS",
    "Trace",
    "TraceError",
    "detect_format",
    "find_profiles",
    "load_trace",
    "read_alibaba",
    "read_csv",
    "read_gavel",
    "read_jsonl",
    "read_muri",
    "read_pal",
    "read_philly",
    "read_sia",
    "read_synergy",
    "read_synergy_profiles",
    "read_tiresias",
    "read_trace",
    "safe_arith",
    "save_trace",
]
