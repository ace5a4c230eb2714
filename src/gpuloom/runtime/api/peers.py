"""Who is at the other end: the owners of local TCP sockets and Unix sockets, and safe socket directories.

A bearer token must only reach the server.  On one machine the kernel knows who
holds every socket, and any account may ask:

* ``/proc/net/tcp`` and ``/proc/net/tcp6`` list each TCP socket of this network
  namespace with its owner's uid and inode (a connection accepted by a listener
  keeps the listener's owner), so :func:`tcp_peer_uid` tells who accepted a
  connection this process made, and :func:`tcp_listeners` who listens on a port;
* ``SO_PEERCRED`` gives the account that listens on a Unix socket
  (:func:`unix_peer_uid`);
* a directory only trusted accounts can write holds only sockets they made
  (:func:`check_dir_chain`).

:func:`port_holder` names a listener for a message: pid, account and command
line where this account may see its process (root sees all).
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
import stat
import struct
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# where clients look for a server, defined here (not in .listen, which loads the server's HTTP stack)
# so that a client command starts without it
#: where a root server's socket goes (one per port)
ROOT_SOCKET_DIR = Path("/run/gpuloom")
SERVER_INFO = "server.json"  # in the state directory: the server's URL, socket, pid and account

LISTEN = "0A"
TIME_WAIT = "06"


@dataclass(frozen=True, slots=True)
class TcpEntry:
    """One row of ``/proc/net/tcp{,6}``."""

    local: IPAddress
    local_port: int
    remote: IPAddress
    remote_port: int
    state: str  # hex code: 0A listen, 01 established, 03 syn-recv
    uid: int
    inode: int


def _addr(hexaddr: str) -> IPAddress:
    """An address as /proc prints it: 32-bit words in host byte order; v4-mapped v6 as v4."""
    words = [bytes.fromhex(hexaddr[i:i + 8]) for i in range(0, len(hexaddr), 8)]
    raw = b"".join(w[::-1] if sys.byteorder == "little" else w for w in words)
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _norm(host: str) -> IPAddress:
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def tcp_entries(proc: Path = Path("/proc/net")) -> Iterator[TcpEntry]:
    """Every TCP socket of this network namespace (IPv4 and IPv6)."""
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10:
                continue
            (la, lp), (ra, rp) = f[1].split(":"), f[2].split(":")
            yield TcpEntry(_addr(la), int(lp, 16), _addr(ra), int(rp, 16), f[3], int(f[7]), int(f[9]))


def tcp_listeners(port: int, host: str | None = None) -> list[TcpEntry]:
    """The listening sockets on ``port`` that a connection to (or a bind of) ``host`` meets: those on that
    address and on the wildcard addresses (all of them when ``host`` is None or a wildcard)."""
    try:
        want = None if host is None else _norm(host)
    except ValueError:  # a name (localhost): every address on the port
        want = None
    out = []
    for e in tcp_entries():
        if e.state != LISTEN or e.local_port != port:
            continue
        if want is None or want.is_unspecified or e.local == want or e.local.is_unspecified:
            out.append(e)
    return out


def tcp_peer_uid(sock: socket.socket, wait_s: float = 0.2) -> int | None:
    """The uid owning the other end of connected TCP socket ``sock``: None for a peer on another machine;
    for a peer here, the owner of the socket that accepted the connection (or of its half-open one, or
    failing both, of the listener on that port); LookupError when no socket here matches.  An accepted
    socket is listed once the handshake's last packet is processed: it is looked for up to ``wait_s`` s."""
    ours = sock.getsockname()
    theirs = sock.getpeername()
    me, me_port = _norm(ours[0]), ours[1]
    peer, peer_port = _norm(theirs[0]), theirs[1]
    if not _is_local(peer):
        return None
    end = time.monotonic() + wait_s
    while True:
        listener = None
        for e in tcp_entries():
            if e.local_port != peer_port:
                continue
            if e.local == peer and e.remote == me and e.remote_port == me_port and e.state != TIME_WAIT:
                return e.uid  # (a time-wait entry shows uid 0, and nobody reads from it)
            if e.state == LISTEN and (e.local == peer or e.local.is_unspecified):
                listener = e.uid
        if time.monotonic() >= end:
            if listener is None:
                raise LookupError(f"no socket of this machine listens on {theirs[0]}:{peer_port}")
            return listener
        time.sleep(0.01)


def _is_local(ip: IPAddress) -> bool:
    """Loopback, or an address of one of this machine's interfaces."""
    if ip.is_loopback:
        return True
    import psutil

    return any(_same(a.address, ip) for addrs in psutil.net_if_addrs().values() for a in addrs
               if a.family in (socket.AF_INET, socket.AF_INET6))


def _same(text: str, ip: IPAddress) -> bool:
    try:
        return _norm(text) == ip
    except ValueError:
        return False


def unix_peer_uid(sock: socket.socket) -> int:
    """The uid of the process that listens on the Unix socket ``sock`` is connected to (``SO_PEERCRED``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def account(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for an account without a name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def account_name(uid: int) -> str:
    """The account's name, or ``uid N``."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def socket_pids(inodes: Iterable[int]) -> dict[int, int]:
    """inode -> pid of a process holding that socket, for the processes this account may inspect."""
    want = {f"socket:[{i}]": i for i in inodes}
    found: dict[int, int] = {}
    if not want:
        return found
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if link in want:
                found.setdefault(want[link], int(pid))
        if len(found) == len(want):
            break
    return found


def port_holder(port: int, host: str | None = None) -> str:
    """Who listens on ``port`` (where a bind of ``host`` would collide): each holder as ``pid N (account):
    command line``, or the account alone when its process is out of sight."""
    entries = tcp_listeners(port, host)
    if not entries:
        return "a process this server cannot identify (another network namespace, or not yet listening)"
    pids = socket_pids(e.inode for e in entries)
    out = []
    for e in entries:
        addr = f"[{e.local}]" if e.local.version == 6 else str(e.local)
        pid = pids.get(e.inode)
        if pid is None:
            out.append(f"a process of {account(e.uid)} on {addr}:{port} (its pid is not visible to this "
                       f"account: run `ss -ltnp` as root)")
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = " ".join(f.read(4096).replace(b"\0", b" ").decode(errors="replace").split())
        except OSError:
            cmd = "?"
        out.append(f"pid {pid} of {account(e.uid)} on {addr}:{port}: {cmd or '?'}")
    return "; ".join(dict.fromkeys(out))


class UnsafeDirectory(ValueError):
    """A socket's directory that an untrusted account could write."""


def check_dir_chain(path: Path, trusted: set[int]) -> None:
    """Refuse unless ``path``'s directory and every one above it is owned by a ``trusted`` uid (or root) and
    writable by no one else; a sticky directory above (``/tmp``) is allowed, since others cannot rename
    what a trusted account made there.  ``path`` is resolved first: the chain checked is the real one."""
    real = Path(os.path.realpath(path))
    first = True
    for d in real.parents:
        try:
            st = os.stat(d)
        except OSError as e:
            raise UnsafeDirectory(f"{d}: {e.strerror}") from None
        if st.st_uid != 0 and st.st_uid not in trusted:
            raise UnsafeDirectory(f"{d} belongs to {account(st.st_uid)}, not to root or a trusted account")
        open_w = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if open_w and (first or not st.st_mode & stat.S_ISVTX):
            raise UnsafeDirectory(f"{d} is writable by other accounts (mode {stat.S_IMODE(st.st_mode):o})")
        first = False
