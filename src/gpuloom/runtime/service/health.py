"""Liveness and readiness: what ``/health`` and ``/ready`` say about the service.

* **Liveness** (``/health``): the process answers.  It reads only what the
  service keeps in memory (no store access, no lock of the loop's), so it
  answers 200 while the database is down or the loop is busy; a load balancer
  or watchdog that restarts processes uses it.
* **Readiness** (``/ready``): the service can do its work now.  200 when every
  check passes, else 503 naming the checks that fail:

  ``store``   the database answers a query, its disk is not nearly full
              (:mod:`..state.disk`), and it takes the loop's records (none waits
              in the outbox, :mod:`.outbox`);
  ``lock``    this server holds its database (a PostgreSQL advisory lock is
              checked every :data:`LOCK_CHECK_S` and before every round that
              acts; :mod:`..state.locks`);
  ``rounds``  a round completed within :func:`stale_after` seconds.

:class:`Health` is what the loop notes as it goes; :func:`readiness` turns it
into the answer.

* **systemd's watchdog** (``Type=notify``, ``WatchdogSec=``): under systemd
  (``$NOTIFY_SOCKET``), ``gpuloom serve`` says ``READY=1`` once it serves, and
  the loop says ``WATCHDOG=1`` as it goes, at half the interval systemd asks
  (:class:`Watchdog`), whatever the store's state: a loop that stops going
  round (stuck, not merely failing its rounds) is what a restart can cure.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..state.store import StoreFull

if TYPE_CHECKING:
    from ...core.cluster import Cluster
    from ...driver import Driver
    from ...scheduler import Scheduler
    from ..exec.clock import Clock
    from ..state.disk import DiskGuard
    from ..state.store import Store
    from .outbox import Outbox

LOCK_CHECK_S = 1.0  # the loop confirms its lock at least this often (and before every round that acts)
STORE_RETRY_S = 1.0  # a round that failed on the store's state is retried after at most this long


def stale_after(round_s: float) -> float:
    """Seconds without a completed round after which the loop counts as not running."""
    return max(3.0 * round_s, 10.0)


class Observed(Protocol):
    """What ``/health`` and ``/ready`` read of the service."""

    @property
    def health(self) -> Health: ...
    @property
    def rounds(self) -> int: ...
    @property
    def driver(self) -> Driver: ...
    @property
    def gate(self) -> Sized: ...
    @property
    def outbox(self) -> Outbox: ...
    @property
    def cluster(self) -> Cluster: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def store(self) -> Store: ...
    @property
    def disk(self) -> DiskGuard: ...
    @property
    def gave_up(self) -> str | None: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def round_s(self) -> float: ...


@dataclass(slots=True)
class Health:
    """What the loop has noted (monotonic times)."""

    lock: str = "held"  # held, unknown: ..., lost: ...
    lock_checked: float = float("-inf")
    last_round: float | None = None  # when the last round completed
    started: float | None = None  # when the loop started (a round is due from then on)
    error: str | None = None  # the last failed round's error, until a round completes
    failures: int = 0

    def round_done(self, t: float) -> None:
        self.last_round = t
        self.error = None
        self.failures = 0

    def failed(self, e: BaseException, t: float) -> None:
        self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self.failures += 1


def liveness(svc: Observed) -> dict[str, Any]:
    """``/health``: from memory only (sizes, read atomically: the loop may be mid-round)."""
    return {
        "status": "ok",
        "rounds": svc.rounds,
        "active_jobs": len(svc.driver.jobs) + len(svc.gate),
        "unrecorded": len(svc.outbox),
        "gpus": svc.cluster.num_gpus,
        "nodes": svc.cluster.num_nodes,
        "scheduler": svc.scheduler.names,
    }


def readiness(svc: Observed) -> tuple[bool, dict[str, Any]]:
    """(ready, ``/ready``'s body): each check ``ok`` or what is wrong."""
    h = svc.health
    checks: dict[str, str] = {}
    try:
        svc.store.ping()
        svc.disk.check_submit()  # a nearly full state disk: no submission, no start
        waiting = len(svc.outbox)
        checks["store"] = "ok" if not waiting else (
            f"{waiting} record(s) wait: the store refuses them ({svc.outbox.error})")
    except StoreFull as e:
        checks["store"] = f"full: {e}"
    except Exception as e:
        checks["store"] = f"unreachable: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if svc.gave_up is not None:
        checks["lock"] = f"lost: {svc.gave_up}"
    else:
        checks["lock"] = "ok" if h.lock == "held" else h.lock
    now = svc.clock.monotonic()
    limit = stale_after(svc.round_s)
    since = h.last_round if h.last_round is not None else h.started
    if svc.gave_up is not None:
        checks["rounds"] = "stopped: this server gave up its database"
    elif since is None:
        checks["rounds"] = "not started"
    elif now - since > limit:
        what = "no round completed" if h.last_round is not None else "no round yet"
        checks["rounds"] = f"{what} for {now - since:.0f} s" + (f" (last error: {h.error})" if h.error else "")
    else:
        checks["rounds"] = "ok"
    ready = all(v == "ok" for v in checks.values())
    return ready, {"status": "ready" if ready else "not ready", "checks": checks, "rounds": svc.rounds,
                   "unrecorded": len(svc.outbox)}


class Watchdog:
    """systemd's notification socket (``sd_notify``): ``READY=1``, and ``WATCHDOG=1`` every half interval.
    Does nothing outside systemd (no ``$NOTIFY_SOCKET``)."""

    def __init__(self, address: str | None, interval_s: float | None) -> None:
        self.address = "\0" + address[1:] if address and address.startswith("@") else address  # abstract socket
        self.every = interval_s / 2 if interval_s else None
        self.next = float("-inf")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Watchdog:
        env = dict(os.environ) if env is None else env
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())  # (a watchdog set for another process of the unit)
        return cls(env.get("NOTIFY_SOCKET") or None, int(usec) / 1e6 if usec.isdigit() and mine else None)

    def notify(self, msg: str) -> None:
        if not self.address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sk:
                sk.sendto(msg.encode(), self.address)
        except OSError:  # systemd gone or the socket not ours to write: nothing to tell
            pass

    def tick(self, now: float) -> None:
        """From the loop, every time round (``now``: monotonic)."""
        if self.every is not None and now >= self.next:
            self.next = now + self.every
            self.notify("WATCHDOG=1")
