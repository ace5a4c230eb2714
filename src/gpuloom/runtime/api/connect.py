"""How a client finds the server, and makes sure it talks to the server before it sends a token.

Where (:func:`find_server`), first found wins:

1. ``--url`` / ``GPULOOM_URL``: ``unix:///PATH`` (a socket), ``http://`` or ``https://``;
2. ``server.json`` in the state directory, when this account can read it there and
   the directory is safe (below): the server's socket, else its URL;
3. the well-known socket of a root server on the port (``GPULOOM_PORT``, default
   8642): ``/run/gpuloom/PORT.sock``, when it exists;
4. ``http://127.0.0.1:PORT``.

Who (:class:`PeerCheck`, on every new connection, before a byte is sent): the
account at the other end must be root, the client's own account, or the account
``server.json`` (read from a safe directory) says the server runs as.  The kernel
says who that is: ``SO_PEERCRED`` on a Unix socket, the owner of the accepting
socket in ``/proc/net/tcp`` for plain HTTP to this machine.  A socket's
directory, and every one above it, must belong to root or the client and be
writable by no one else (``/tmp``'s sticky bit is fine above it).  Beyond this
machine there is no such check: use HTTPS (``GPULOOM_CA_BUNDLE`` for a private CA).
"""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpcore
import httpx

from .peers import (
    ROOT_SOCKET_DIR,
    SERVER_INFO,
    UnsafeDirectory,
    account,
    account_name,
    check_dir_chain,
    tcp_peer_uid,
    unix_peer_uid,
)

DEFAULT_PORT = 8642
#: the base URL requests over a Unix socket carry (the Host header; the socket decides where they go)
UNIX_BASE = "http://gpuloom"


class ServerNotTrusted(ValueError):
    """Where the client was told to look for the server is not safe to use."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the server is and which accounts may answer there."""

    url: str  # as shown in messages: unix:///PATH or http(s)://HOST:PORT
    socket: str | None  # the Unix socket's path, or None for TCP
    trusted: frozenset[int]  # uids the server may run as
    port: int  # the port its well-known socket is named after (for hints)

    @property
    def base_url(self) -> str:
        return UNIX_BASE if self.socket is not None else self.url


def default_port() -> int:
    """``GPULOOM_PORT`` (the port ``serve`` uses), else 8642; 0 (any port) names no port: 8642."""
    try:
        p = int(os.environ.get("GPULOOM_PORT", DEFAULT_PORT))
    except ValueError:
        return DEFAULT_PORT
    return p if 0 < p < 65536 else DEFAULT_PORT


def _unix_endpoint(path: str, trusted: set[int], port: int) -> Endpoint:
    if not os.path.isabs(path):
        raise ServerNotTrusted(f"unix:{path}: give the socket's absolute path, as unix:///run/gpuloom/8642.sock")
    try:
        check_dir_chain(Path(path), trusted)
    except UnsafeDirectory as e:
        raise ServerNotTrusted(f"not using the socket {path}: {e}") from None
    return Endpoint(f"unix://{path}", os.path.realpath(path), frozenset(trusted), port)


def read_server_info(state_dir: Path) -> dict[str, Any] | None:
    """``server.json`` of ``state_dir`` when this account can read it, else None; ServerNotTrusted when it
    is in a directory another account could write (whoever wrote it could point anywhere)."""
    f = state_dir / SERVER_INFO
    try:
        text = f.read_text()
    except OSError:
        return None
    me = os.geteuid()
    try:
        check_dir_chain(f, {me})
        owner = os.stat(f).st_uid
    except (UnsafeDirectory, OSError) as e:
        raise ServerNotTrusted(f"not using {f}: {e}; give the server's address with --url") from None
    if owner not in (0, me):
        raise ServerNotTrusted(f"not using {f}: it belongs to {account(owner)}; give the server's address with --url")
    try:
        info = json.loads(text)
    except ValueError:
        return None
    return info if isinstance(info, dict) and isinstance(info.get("url"), str) else None


def find_server(url: str | None, state_dir: Path, port: int | None = None) -> Endpoint:
    """Where the server is (see the module notes); ServerNotTrusted when a named place is unsafe."""
    port = default_port() if port is None else port
    trusted = {0, os.geteuid()}
    if url is not None:
        if url.startswith("unix:"):
            path = url[len("unix:"):]
            return _unix_endpoint(path[2:] if path.startswith("//") else path, trusted, port)
        return Endpoint(url.rstrip("/"), None, frozenset(trusted), port)
    info = read_server_info(state_dir)
    if info is not None:
        if isinstance(info.get("uid"), int):
            trusted.add(info["uid"])
        sock = info.get("socket")
        if isinstance(sock, str) and os.path.exists(sock):
            return _unix_endpoint(sock, trusted, port)
        return Endpoint(info["url"].rstrip("/"), None, frozenset(trusted), port)
    well_known = ROOT_SOCKET_DIR / f"{port}.sock"
    if well_known.exists():
        return _unix_endpoint(str(well_known), trusted, port)
    return Endpoint(f"http://127.0.0.1:{port}", None, frozenset(trusted), port)


class PeerCheck(httpcore.SyncBackend):
    """Connects as httpcore does, then refuses (before anything is sent) a peer of an untrusted account:
    on Unix sockets always, on TCP for plain HTTP (HTTPS: the certificate says who the server is)."""

    def __init__(self, endpoint: Endpoint, check_tcp: bool) -> None:
        self.endpoint = endpoint
        self.check_tcp = check_tcp
        self.refusal: str | None = None  # the last refusal, for the client's message

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        stream = super().connect_tcp(host, port, timeout, local_address, socket_options)
        if self.check_tcp:
            try:
                uid = tcp_peer_uid(stream.get_extra_info("socket"))
            except (LookupError, OSError) as e:
                self._refuse(stream, f"refusing to send a token to {host}:{port}: cannot tell which account "
                                     f"holds that port ({e})")
            if uid is not None and uid not in self.endpoint.trusted:
                self._refuse(stream, self._impostor(f"{host}:{port}", uid, port))
        return stream

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        stream = super().connect_unix_socket(path, timeout, socket_options)
        uid = unix_peer_uid(stream.get_extra_info("socket"))
        if uid not in self.endpoint.trusted:
            self._refuse(stream, self._impostor(path, uid, None))
        return stream

    def _impostor(self, where: str, uid: int, port: int | None) -> str:
        ok = ", ".join(account_name(u) for u in sorted(self.endpoint.trusted))
        hint = "stop that process"
        sock = ROOT_SOCKET_DIR / f"{port}.sock" if port is not None else None
        if sock is not None:
            hint += (f"; reach the server through its socket: --url unix://{sock}" if sock.exists() else
                     "; while it holds the port the server cannot start there")
        return (f"refusing to send a token to {where}: it is held by {account(uid)}, not by an account the "
                f"server may run as: {ok}. If the server is down, a job or another user may be holding its "
                f"port: {hint}")

    def _refuse(self, stream: httpcore.NetworkStream, msg: str) -> None:
        stream.close()
        self.refusal = msg
        raise httpcore.ConnectError(msg)


def transport(endpoint: Endpoint, verify: Any = True) -> tuple[httpx.BaseTransport | None, PeerCheck | None]:
    """The transport for ``endpoint`` (None: httpx's default, for HTTPS, which the client gives ``verify``)
    and its peer check."""
    if endpoint.socket is None and not endpoint.url.startswith("http://"):
        return None, None
    # plain HTTP (over TCP or the socket): a TLS context that trusts no certificate, so that nothing here
    # could ever speak TLS unverified, and no certificate store is loaded for nothing (~0.1 s a command)
    t = httpx.HTTPTransport(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), uds=endpoint.socket)
    check = PeerCheck(endpoint, check_tcp=endpoint.socket is None)
    # httpx takes no network backend: its pool (httpcore's) does, and makes each connection with it
    t._pool._network_backend = check
    return t, check

