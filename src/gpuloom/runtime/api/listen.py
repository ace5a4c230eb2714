"""Where ``gpuloom serve`` listens, and how many connections it keeps.

**Sockets.**  The server binds its TCP port and a Unix socket right after taking
its locks, before it adopts any job (:class:`Listeners`).  A port someone else
holds stops it at once (:class:`ListenError` names the holder: pid, account,
command line where this account may see them).  The Unix socket is where local
clients can trust they reach the server: for a server running as root it is
``/run/gpuloom/PORT.sock`` (a root-owned 0755 directory, so only root makes
entries there; one socket per port, since several servers may share a machine),
for any other account ``STATE_DIR/gpuloom.sock``.  ``server.json`` in the
state directory records the URL, the socket and the server's account
(:func:`write_server_info`); it is removed at shutdown and on a failed start.

**Connections.**  Every connection costs a descriptor, and a server out of
descriptors cannot accept even ``/health``.  So (:class:`ConnectionLimits`):

* at most ``max_connections`` connections are open; when a new one arrives at
  the limit, the oldest connection still sending its request (headers, then
  body) is dropped to admit it (none: the newcomer gets a 503 and is closed);
* a connection that has not sent a complete request within
  ``header_timeout_s`` of opening (or of its previous response) is closed,
  however it trickles bytes; with TLS, so is one whose handshake takes longer;
* a connection that reads nothing of its response for ``send_timeout_s``
  (its buffers stay full) is closed: a response nobody reads holds no
  descriptor for long;
* idle keep-alive connections close after ``keep_alive_s``;
* the default limit comes from ``RLIMIT_NOFILE``, whose soft limit the server
  raises towards its hard limit, less descriptors reserved for the database,
  logs and job launches and for a burst of accepts (the listen backlog).

uvicorn's own ``limit_concurrency`` is not used: it counts idle connections
too, and answers 503 to every request once enough of them are open.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import resource
import socket
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import h11
import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from uvicorn.protocols.http.h11_impl import H11Protocol

from .peers import ROOT_SOCKET_DIR, SERVER_INFO, port_holder

log = logging.getLogger("gpuloom.service")

#: descriptors kept for everything but connections: database, logs, job launches, pipes
RESERVED_FDS = 512
#: the most connections by default, however high the descriptor limit (each costs memory too)
DEFAULT_MAX_CONNECTIONS = 8192
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_KEEP_ALIVE_S = 5.0
DEFAULT_SEND_TIMEOUT_S = 60.0
MAX_BACKLOG = 2048
#: the longest Unix socket path (sun_path holds 108 bytes with its NUL)
MAX_SOCKET_PATH = 107

_BUSY_BODY = b"the server is at its limit of connections\n"
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


class ListenError(RuntimeError):
    """The server cannot listen where it was told to."""


# -- connection limits -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    backlog: int = MAX_BACKLOG
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S

    @classmethod
    def for_process(cls, max_connections: int | None = None, header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
                    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
                    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S) -> ConnectionLimits:
        """Limits this process can keep: raises the soft ``RLIMIT_NOFILE`` as far as they need (at most to
        the hard limit); ``max_connections`` None: as many as the descriptors allow, up to
        :data:`DEFAULT_MAX_CONNECTIONS`.  ListenError when the descriptors cannot cover them."""
        if not header_timeout_s > 0:
            raise ListenError(f"--header-timeout must be > 0 seconds, got {header_timeout_s}")
        for v, opt in ((keep_alive_s, "--keep-alive-timeout"), (send_timeout_s, "--send-timeout")):
            if not v > 0:
                raise ListenError(f"{opt} must be > 0 seconds, got {v}")
        if max_connections is not None and max_connections < 1:
            raise ListenError(f"--max-connections must be >= 1, got {max_connections}")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = hard if hard != resource.RLIM_INFINITY else 1 << 20
        spare = cap - RESERVED_FDS
        backlog = max(16, min(MAX_BACKLOG, spare // 4))
        most = spare - backlog
        if max_connections is None:
            max_connections = min(DEFAULT_MAX_CONNECTIONS, most)
            if max_connections < 16:
                raise ListenError(f"the descriptor limit (RLIMIT_NOFILE, hard {cap}) leaves room for "
                                  f"{max(most, 0)} connections: raise it (ulimit -Hn) above {RESERVED_FDS + 64}")
        elif max_connections > most:
            raise ListenError(f"--max-connections {max_connections} needs {max_connections + backlog + RESERVED_FDS} "
                              f"descriptors; the hard limit (RLIMIT_NOFILE) is {cap}: give at most {max(most, 0)}, "
                              "or raise the limit (ulimit -Hn)")
        need = max_connections + backlog + RESERVED_FDS
        if soft != resource.RLIM_INFINITY and soft < need:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, cap), hard))
        return cls(max_connections, header_timeout_s, keep_alive_s, backlog, send_timeout_s)


class Registry:
    """The connections of one server still sending a request, oldest first, and what was cut."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.waiting: dict[GuardedH11Protocol, None] = {}  # insertion order = waiting since
        self.open = 0
        self.evicted = 0
        self.refused = 0
        self.timed_out = 0
        self.send_timed_out = 0

    def collect(self) -> Iterator[Metric]:
        """Prometheus metrics (a collector for the service's registry)."""
        g = GaugeMetricFamily("gpuloom_connections", "Open HTTP connections, and those still sending a request.",
                              labels=["state"])
        g.add_metric(["open"], self.open)
        g.add_metric(["sending"], len(self.waiting))
        yield g
        c = CounterMetricFamily("gpuloom_connections_cut", "Connections the server closed to stay within its "
                                "limits, by reason.", labels=["reason"])
        for reason, n in (("evicted", self.evicted), ("refused", self.refused), ("request_timeout", self.timed_out),
                          ("send_timeout", self.send_timed_out)):
            c.add_metric([reason], n)
        yield c


#: the client's side of h11 while its request is not complete: before the headers, then the body
SENDING = (h11.IDLE, h11.SEND_BODY)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a connection limit, oldest-waiting eviction, a timeout for the
    request (headers and body) and one for a response nobody reads."""

    registry: ClassVar[Registry]
    _header_timer: asyncio.TimerHandle | None = None
    _send_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        reg = self.registry
        full = len(self.connections) >= reg.limits.max_connections
        if full and reg.waiting:
            oldest = next(iter(reg.waiting))
            oldest._cut()
            reg.evicted += 1
            full = False
        super().connection_made(transport)
        reg.open += 1
        if full:  # every connection is busy with a request: this one waits for none of them
            reg.refused += 1
            transport.write(BUSY)
            transport.close()
            return
        self._note()

    def handle_events(self) -> None:
        super().handle_events()
        self._note()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        self._resumed()
        self.registry.open -= 1
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.registry.limits.send_timeout_s, self._send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._resumed()

    def _resumed(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timed_out(self) -> None:
        self._send_timer = None
        self.registry.send_timed_out += 1
        self.transport.abort()

    def _note(self) -> None:
        """Track whether the connection is still sending its request (h11: the client's side is idle, or in
        the body)."""
        if self.conn.their_state in SENDING and not self.transport.is_closing():
            if self._header_timer is None:
                self.registry.waiting[self] = None
                self._header_timer = self.loop.call_later(self.registry.limits.header_timeout_s, self._timed_out)
        else:
            self._stop_waiting()

    def _stop_waiting(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self.registry.waiting.pop(self, None)

    def _timed_out(self) -> None:
        self._header_timer = None
        self.registry.timed_out += 1
        self._cut()

    def _cut(self) -> None:
        """Close now (abort: a client that reads nothing must not keep the descriptor through a flush)."""
        self._stop_waiting()
        self.transport.abort()


def protocol_for(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A protocol class with its own registry (one per server)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"registry": Registry(limits)})


# -- sockets -----------------------------------------------------------------------------------------------
def default_socket_path(port: int, state_dir: Path) -> Path | None:
    """Where a server on ``port`` with ``state_dir`` puts its socket: ``/run/gpuloom/PORT.sock`` as root,
    else ``STATE_DIR/gpuloom.sock`` (None when that path is too long for a Unix socket)."""
    if os.geteuid() == 0:
        return ROOT_SOCKET_DIR / f"{port}.sock"
    p = Path(os.path.abspath(state_dir)) / "gpuloom.sock"
    return p if len(os.fsencode(p)) <= MAX_SOCKET_PATH else None


def bind_tcp(host: str, port: int, backlog: int = MAX_BACKLOG) -> socket.socket:
    """A socket listening on ``host:port``; ListenError naming the holder when it is taken.  It listens at
    once: a socket only bound lets another account's socket with ``SO_REUSEADDR`` bind and listen first."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: without it Nagle + delayed ACK add ~40 ms per request
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ListenError(f"cannot listen on {host}:{port}: it is held by {port_holder(port, host)}; "
                              "stop that process (or choose another --port)") from None
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(backlog)
    return sock


def bind_unix(path: Path, shared: bool, backlog: int = MAX_BACKLOG) -> socket.socket:
    """A Unix socket at ``path``: its directory must be this account's, writable by no one else (a root
    server makes ``/run/gpuloom`` 0755).  A leftover socket nobody answers on is replaced; a live one
    means another server uses this path.  ``shared``: any account may connect (mode 0666), else 0600."""
    from ..exec.identity import IdentityError, private_dir

    d = path.parent
    try:
        if d == ROOT_SOCKET_DIR:
            private_dir(d, 0o755)
        else:
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.lstat(d)
    except (IdentityError, OSError) as e:
        raise ListenError(f"cannot make the socket directory {d}: {e}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ListenError(f"the socket directory {d} must be a directory of the server's account (uid {os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ListenError(f"the socket directory {d} is writable by other accounts: clients would not trust it")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ListenError(f"the socket path {path} is longer than {MAX_SOCKET_PATH} bytes")
    try:
        pst = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(pst.st_mode):
            raise ListenError(f"{path} exists and is not a socket: remove it, or give --socket elsewhere")
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(path))
            raise ListenError(f"another server listens on {path}: stop it, or give this one --socket elsewhere")
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # a dead server's socket
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o666 if shared else 0o600)
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        raise ListenError(f"cannot listen on {path}: {e.strerror}") from None
    return sock


class Listeners:
    """The server's TCP socket and Unix socket, bound before anything else starts."""

    def __init__(self, host: str, port: int, unix: Path | Callable[[int], Path | None] | None, tls: bool,
                 backlog: int = MAX_BACKLOG) -> None:
        """``unix``: the socket's path, or a function of the bound port giving it (None: no socket)."""
        self.host = host
        self.tcp = bind_tcp(host, port, backlog)
        self.port = int(self.tcp.getsockname()[1])
        self.unix: socket.socket | None = None
        self.unix_path: Path | None = None
        self._unix_id: tuple[int, int] | None = None
        unix_path = unix(self.port) if callable(unix) else unix
        if unix_path is not None:
            try:
                self.unix = bind_unix(unix_path, os.geteuid() == 0, backlog)
            except BaseException:
                self.tcp.close()
                raise
            self.unix_path = unix_path
            st = os.lstat(unix_path)
            self._unix_id = (st.st_dev, st.st_ino)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{self.port}"

    @property
    def sockets(self) -> list[socket.socket]:
        return [self.tcp] + ([self.unix] if self.unix is not None else [])

    def close(self) -> None:
        """Close both; remove the socket file if it is still the one this server made."""
        for s in self.sockets:
            s.close()
        if self.unix_path is not None and self._unix_id is not None:
            try:
                st = os.lstat(self.unix_path)
                if (st.st_dev, st.st_ino) == self._unix_id:
                    os.unlink(self.unix_path)
            except OSError:
                pass
            self.unix_path = None


def write_server_info(state_dir: Path, listeners: Listeners) -> None:
    """``server.json``: URL, socket, pid and account of this server (atomically: clients may be polling)."""
    info = {"url": listeners.url, "socket": str(listeners.unix_path) if listeners.unix_path else None,
            "pid": os.getpid(), "uid": os.geteuid()}
    tmp = state_dir / f"{SERVER_INFO}.tmp"
    tmp.write_text(json.dumps(info))
    os.replace(tmp, state_dir / SERVER_INFO)


def remove_server_info(state_dir: Path) -> None:
    """Remove ``server.json``: the caller holds the state's lock, so the file is its own or a dead server's."""
    (state_dir / SERVER_INFO).unlink(missing_ok=True)


# -- serving -----------------------------------------------------------------------------------------------
def serve_http(app: Any, listeners: Listeners, limits: ConnectionLimits, ssl_keyfile: str | None = None,
               ssl_certfile: str | None = None, metrics: CollectorRegistry | None = None,
               stop_when: Callable[[], bool] | None = None) -> None:
    """Run uvicorn on ``listeners`` with ``limits`` until a signal stops it, or ``stop_when()`` (asked every
    0.1 s) says to; the connection counts go to ``metrics``."""
    protocol = protocol_for(limits)
    if metrics is not None:
        metrics.register(protocol.registry)
    config = uvicorn.Config(app, log_level="warning", access_log=False, ssl_keyfile=ssl_keyfile,
                            ssl_certfile=ssl_certfile, http=protocol, ws="none",
                            timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]
                            backlog=limits.backlog)
    _Server(config, limits, stop_when).run(sockets=listeners.sockets)


class _Server(uvicorn.Server):
    """uvicorn's server, serving TLS on TCP sockets only (a local socket is trusted by its place), with the
    header timeout bounding TLS handshakes too."""

    def __init__(self, config: Any, limits: ConnectionLimits, stop_when: Callable[[], bool] | None = None) -> None:
        super().__init__(config)
        self.limits = limits
        self.stop_when = stop_when

    async def on_tick(self, counter: int) -> bool:
        if self.stop_when is not None and self.stop_when():
            return True  # a graceful shutdown, as after SIGTERM, without a signal to re-raise at its end
        return await super().on_tick(counter)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        from uvicorn.config import STARTUP_FAILURE

        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)
        config = self.config
        protocol: Any = config.http_protocol_class

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return protocol(config=config, server_state=self.server_state, app_state=self.lifespan.state, _loop=_loop)

        loop = asyncio.get_running_loop()
        self.servers = []
        for sock in sockets or []:
            tls = config.ssl if sock.family != socket.AF_UNIX else None
            self.servers.append(await loop.create_server(
                create_protocol, sock=sock, ssl=tls, backlog=config.backlog,
                ssl_handshake_timeout=self.limits.header_timeout_s if tls is not None else None))
        self.started = True
