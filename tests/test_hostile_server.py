"""A hostile but authenticated user against the server's trust boundary (issue 34): one regression test or
more per weakness, numbered as in the issue.  Tests that switch OS accounts need root (they create and
delete their own accounts) and are skipped otherwise.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpcore
import httpx
import psutil
import pytest
from typer.testing import CliRunner

from gpuloom.cli import app
from gpuloom.cli.service import Client
from gpuloom.runtime.api.connect import Endpoint, PeerCheck, ServerNotTrusted, find_server
from gpuloom.runtime.api.listen import ROOT_SOCKET_DIR
from gpuloom.runtime.state.store import Store
from service_util import JOB_PY, REPO, Server, job_writable, kill_jobs, shared_copy, submit, wait_for

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="switching OS accounts needs root")
SQUAT = shared_copy(Path(__file__).resolve().parent / "jobs" / "squat.py")
runner = CliRunner()


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    r = runner.invoke(app, list(args), env=env)
    return r.exit_code, r.output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_cmd(state: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpuloom", "serve", "--state-dir", str(state), "--log-level", "warning", *args]


def serve_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO / "src"))


def squatter(account: str, host: str, port: int, out: Path) -> subprocess.Popen:
    """``squat.py`` as ``account``, outside any server (as a leftover process of a user would be)."""
    return subprocess.Popen(["setpriv", f"--reuid={account}", f"--regid={account}", "--clear-groups", JOB_PY,
                             str(SQUAT), host, str(port), str(out)], start_new_session=True)


def received(out: Path) -> bytes:
    return out.read_bytes() if out.exists() else b""


# -- 5. a job holding the server's port collects tokens ---------------------------------------------------------
@needs_root
def test_5_a_job_holding_the_port_stops_the_restart_and_is_sent_no_token(tmp_path: Path,
                                                                        os_users: list[str]) -> None:
    alice_acc = os_users[0]
    port = free_port()
    (tmp_path / "users.yaml").write_text(f"alice: {alice_acc}\n")
    state = tmp_path / "state"
    state.mkdir()
    args = ("--cluster", "1x1", "--round", "0.2", "--port", str(port), "--users", str(tmp_path / "users.yaml"))
    s = Server(state, *args).start()
    out = job_writable(tmp_path) / "squat.out"
    squat_pid = None
    try:
        with s.client() as c:
            alice = c.post("/tokens", json={"user": "alice"}).json()["token"]
        with s.client(alice) as c:  # the job waits for the server's port to be free, then takes it
            jid = submit(c, name="squat", command=f"{JOB_PY} {SQUAT} 127.0.0.1 {port} {out}", gpus=1)
            wait_for(lambda: c.get(f"/jobs/{jid}").json()["state"] == "launching", what="the squatter to launch")
        s.stop()  # jobs outlive the server
        bound = Path(f"{out}.bound")
        wait_for(bound.exists, 10, "the job to take the port")
        squat_pid = int(bound.read_text())
        # the restart fails at once, naming the holder, before it adopts any job; no server.json is left
        r = subprocess.run(serve_cmd(state, *args), capture_output=True, text=True, timeout=120, env=serve_env())
        assert r.returncode == 2, r.stderr
        err = " ".join(r.stderr.split())
        assert f"cannot listen on 127.0.0.1:{port}: it is held by pid {squat_pid} of {alice_acc}" in err, err
        assert str(SQUAT) in err  # its command line
        assert not (state / "server.json").exists()
        st = Store(f"sqlite:///{state / 'gpuloom.db'}")
        try:
            assert "adopt" not in [e["kind"] for e in st.events(jid)]
        finally:
            st.close()
        # a client with a token refuses to send it there: by URL, and by default (no server.json, no socket)
        code, text = cli("queue", "--token", alice, env={"GPULOOM_URL": f"http://127.0.0.1:{port}"})
        assert code == 1 and f"refusing to send a token to 127.0.0.1:{port}: it is held by {alice_acc}" in text, text
        code, text = cli("queue", "--token", alice, "--state-dir", str(state),
                         env={"GPULOOM_PORT": str(port), "GPULOOM_URL": None})  # type: ignore[dict-item]
        assert code == 1 and "refusing to send a token" in text, text
        # (the job appends a connection's line once it has read to its end: after the client has gone on)
        wait_for(lambda: received(out).count(b"\n") >= 2, 10, "the job to record both connections")
        got = received(out)
        assert got.count(b"\n") >= 2  # it was connected to, twice ...
        assert b"authorization" not in got.lower() and alice.encode() not in got  # ... and sent nothing
        # once the holder is gone the server starts, and clients reach it through its socket
        os.kill(squat_pid, signal.SIGKILL)
        s = Server(state, *args).start()
        sock = ROOT_SOCKET_DIR / f"{port}.sock"
        assert s.socket == str(sock)
        code, text = cli("queue", "--all", "--json", "--token", alice, env={"GPULOOM_URL": f"unix://{sock}"})
        assert code == 0 and [j["id"] for j in json.loads(text)] == [jid], text
        assert Client(None, alice, state).url == f"unix://{sock}"  # found through server.json
    finally:
        s.stop()
        if squat_pid is not None:
            try:
                os.kill(squat_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        kill_jobs(state)


@needs_root
def test_5_a_listener_beside_the_server_is_sent_no_token(tmp_path: Path, os_users: list[str]) -> None:
    """While the server holds 127.0.0.1:PORT, another account listens on [::1]:PORT, where ``localhost``
    may lead first: the client checks who accepted each connection, so the token goes to the server only."""
    port = free_port()
    s = Server(tmp_path, "--cluster", "1x1", "--port", str(port)).start()
    out = job_writable(tmp_path) / "squat.out"
    p = squatter(os_users[1], "::1", port, out)
    try:
        wait_for(Path(f"{out}.bound").exists, 10, "the squatter to listen")
        code, text = cli("nodes", "--token", s.token, env={"GPULOOM_URL": f"http://[::1]:{port}"})
        assert code == 1 and f"refusing to send a token to ::1:{port}: it is held by {os_users[1]}" in text, text
        code, text = cli("nodes", "--json", "--token", s.token, env={"GPULOOM_URL": f"http://127.0.0.1:{port}"})
        assert code == 0 and json.loads(text)[0]["name"] == "node-0", text
        got = received(out)
        assert got.count(b"\n") == 1 and s.token.encode() not in got and b"authorization" not in got.lower()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        s.stop()


def test_5_the_client_checks_who_listens_before_it_sends_anything(tmp_path: Path) -> None:
    """The peer checks alone, against listeners of this process (an account the endpoint does not trust,
    since 'trusted' is given here): TCP through /proc/net/tcp, Unix sockets through SO_PEERCRED."""
    me = os.geteuid()
    stranger = frozenset({me + 4242})
    tcp = socket.create_server(("127.0.0.1", 0))
    port = tcp.getsockname()[1]
    path = tmp_path / "s.sock"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(path))
    unix.listen()
    try:
        for trusted, ok in ((stranger, False), (frozenset({me}), True)):
            ep = Endpoint(f"http://127.0.0.1:{port}", None, trusted, port)
            check = PeerCheck(ep, check_tcp=True)
            if ok:
                check.connect_tcp("127.0.0.1", port).close()
                check.connect_unix_socket(str(path)).close()
                assert check.refusal is None
                continue
            with pytest.raises(httpcore.ConnectError, match=f"refusing to send a token to 127.0.0.1:{port}"):
                check.connect_tcp("127.0.0.1", port)
            with pytest.raises(httpcore.ConnectError, match=f"refusing to send a token to {path}"):
                check.connect_unix_socket(str(path))
        # HTTPS is not checked this way: its certificate says who the server is
        PeerCheck(Endpoint(f"https://127.0.0.1:{port}", None, stranger, port), check_tcp=False).connect_tcp(
            "127.0.0.1", port).close()
    finally:
        tcp.close()
        unix.close()


def test_5_a_socket_or_server_json_others_can_write_is_not_used(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(ServerNotTrusted, match=f"{open_dir} is writable by other accounts"):
        find_server(f"unix://{open_dir}/s.sock", tmp_path)
    code, text = cli("nodes", "--url", f"unix://{open_dir}/s.sock")
    assert code == 2 and "writable by other accounts" in text
    (open_dir / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:1", "socket": None, "uid": 4242}))
    with pytest.raises(ServerNotTrusted, match="server.json"):
        find_server(None, open_dir)
    os.chmod(open_dir, 0o700)  # the same file where only its owner writes: used, and its account trusted
    ep = find_server(None, open_dir)
    assert (ep.url, ep.socket, ep.trusted) == ("http://127.0.0.1:1", None, frozenset({0, os.geteuid(), 4242}))
    with pytest.raises(ServerNotTrusted, match="absolute path"):
        find_server("unix:relative.sock", tmp_path)


def test_5_clients_find_the_server_by_its_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    state = tmp_path / "state"
    state.mkdir()
    s = Server(state, "--cluster", "1x1", "--port", str(port)).start()
    expected = ROOT_SOCKET_DIR / f"{port}.sock" if ROOT else state / "gpuloom.sock"
    try:
        assert s.socket == str(expected)
        info = json.loads((state / "server.json").read_text())
        assert info == {"url": f"http://127.0.0.1:{port}", "socket": str(expected), "pid": s.proc.pid,  # type: ignore[union-attr]
                        "uid": os.geteuid()}
        c = Client(None, None, state)  # server.json: the socket, and the admin token beside it
        assert c.url == f"unix://{expected}"
        assert c.call("GET", "/nodes")[0]["name"] == "node-0"
        if ROOT:  # any account finds a root server's socket by the port alone
            monkeypatch.setenv("GPULOOM_PORT", str(port))
            assert Client(None, s.token, tmp_path / "elsewhere").url == f"unix://{expected}"
            code, text = cli("nodes", "--json", "--token", s.token, "--state-dir", str(tmp_path / "elsewhere"),
                             env={"GPULOOM_PORT": str(port), "GPULOOM_URL": None})  # type: ignore[dict-item]
            assert code == 0 and json.loads(text)[0]["name"] == "node-0", text
            assert stat.S_IMODE(expected.stat().st_mode) == 0o666
            assert (ROOT_SOCKET_DIR.stat().st_uid, stat.S_IMODE(ROOT_SOCKET_DIR.stat().st_mode)) == (0, 0o755)
        s.kill()  # a killed server leaves its socket and server.json: the next one replaces both
        s = Server(state, "--cluster", "1x1", "--port", str(port)).start()
        assert Client(None, None, state).call("GET", "/health")["status"] == "ok"
    finally:
        s.stop()
    assert not expected.exists() and not (state / "server.json").exists()  # a clean stop removes both


# -- 8. idle connections exhaust the server's descriptors --------------------------------------------------------
PARTIAL = b"GET /health HTTP/1.1\r\nHost: x\r\n"  # request headers that never end


def idle_connections(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(PARTIAL)
        out.append(c)
    return out


def closed_by_server(c: socket.socket) -> bool:
    c.setblocking(False)
    try:
        return c.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def metrics(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if ln.startswith("gpuloom_conn"))}


def server_fds(s: Server) -> int:
    return psutil.Process(s.proc.pid).num_fds()  # type: ignore[union-attr]


def test_8_idle_connections_beyond_the_limit_do_not_keep_health_out(tmp_path: Path) -> None:
    # the eviction, on a server whose header deadline no step of the test can reach however loaded the machine
    # (with a deadline of 3 s the 200 left could all be cut before /metrics counted them)
    state = tmp_path / "evict"
    state.mkdir()
    s = Server(state, "--cluster", "1x1", "--max-connections", "200", "--header-timeout", "600",
               "--keep-alive-timeout", "1").start()
    conns: list[socket.socket] = []
    try:
        base = server_fds(s)
        port = int(s.url.rsplit(":", 1)[1])
        silent = socket.create_connection(("127.0.0.1", port))  # sends nothing at all
        conns = idle_connections(port, 1000)
        # the oldest connections waiting for headers made room for the newest: exactly the last 200 remain
        wait_for(lambda: sum(not closed_by_server(c) for c in conns) == 200, 10, "the server to drop the oldest")
        assert closed_by_server(silent)
        assert [closed_by_server(c) for c in conns] == [True] * 800 + [False] * 200
        assert server_fds(s) <= base + 200
        with s.client() as c:  # (a new connection: it drops the oldest idle one)
            m = metrics(c.get("/metrics").text)
        assert m['gpuloom_connections_cut_total{reason="evicted"}'] == 802
        assert (m['gpuloom_connections{state="open"}'], m['gpuloom_connections{state="sending"}']) == (200, 199)
        r = httpx.get(s.url + "/health", timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "ok"
        # a keep-alive connection that finished its request counts as waiting; it closes after --keep-alive-timeout
        with httpx.Client(base_url=s.url) as h:
            assert h.get("/health").status_code == 200
            time.sleep(1.5)
            assert h.get("/health").status_code == 200  # httpx reconnects: the idle one was closed
    finally:
        for c in conns:
            c.close()
        s.stop()
    # the header deadline, on a server of its own
    state = tmp_path / "deadline"
    state.mkdir()
    s = Server(state, "--cluster", "1x1", "--header-timeout", "3").start()
    conns = []
    try:
        base = server_fds(s)
        port = int(s.url.rsplit(":", 1)[1])
        t0 = time.monotonic()
        conns = idle_connections(port, 200)
        # sending a byte now and then does not extend the header deadline (were it extended, the trickle would
        # never be closed; the default deadline is 10 s)
        trickle = socket.create_connection(("127.0.0.1", port))
        t1 = time.monotonic()
        while not closed_by_server(trickle) and time.monotonic() - t1 < 30:
            trickle.sendall(b"G")
            time.sleep(0.25)
        assert 3.0 <= time.monotonic() - t1 < 9.0
        # the idle ones are closed once they have taken --header-timeout to send their headers
        wait_for(lambda: all(closed_by_server(c) for c in conns), 30, "the header timeout")
        assert time.monotonic() - t0 >= 3.0
        assert server_fds(s) <= base + 1
        with s.client() as c:
            m = metrics(c.get("/metrics").text)
        assert m['gpuloom_connections_cut_total{reason="request_timeout"}'] == 200 + 1  # the idle ones, the trickle
        assert m['gpuloom_connections_cut_total{reason="refused"}'] == 0
    finally:
        for c in conns:
            c.close()
        s.stop()


def eof_after(c: socket.socket, limit: float) -> float | None:
    """Seconds until the server closed ``c`` (reading whatever it sent first), None if it did not in ``limit``."""
    t0 = time.monotonic()
    c.setblocking(True)
    c.settimeout(limit)
    try:
        while c.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def test_8_a_stalled_request_body_or_an_unread_response_is_cut(tmp_path: Path) -> None:
    s = Server(tmp_path, "--cluster", "1x1", "--header-timeout", "2", "--send-timeout", "2",
               "--keep-alive-timeout", "30", "--max-connections", "2").start()
    port = int(s.url.rsplit(":", 1)[1])
    big = "/docs-assets/swagger-ui-bundle.js"  # 1.5 MB, no token needed
    try:
        size = len(httpx.get(s.url + big).content)
        assert size > 1 << 20
        base = server_fds(s)
        # headers complete, the body never: closed at the same deadline as headers that never end
        body = socket.create_connection(("127.0.0.1", port))
        body.sendall(b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        took = eof_after(body, 10)
        assert took is not None and 1.5 <= took < 5.0
        # responses the client does not read (8 pipelined: more than the kernel's buffers hold) ...
        slow = []
        for _ in range(2):
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.connect(("127.0.0.1", port))
            c.sendall(f"GET {big} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * 8)
            slow.append(c)
        t0 = time.monotonic()
        wait_for(lambda: server_fds(s) >= base + 2, 10, "the server to accept")
        # ... keep both connections busy: none is sending a request, so a third one is refused
        third = socket.create_connection(("127.0.0.1", port))
        third.settimeout(5)
        assert third.recv(100).startswith(b"HTTP/1.1 503 ")
        # ... until they are cut, once the server's buffers stay full for --send-timeout
        wait_for(lambda: server_fds(s) <= base, 10, "the unread responses to be cut")
        assert 2.0 <= time.monotonic() - t0 < 6.0
        got = 0
        slow[0].settimeout(5)
        try:
            while chunk := slow[0].recv(65536):
                got += len(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
        assert got < 8 * size  # what the server still held was dropped
        with s.client() as c:
            m = metrics(c.get("/metrics").text)
        assert (m['gpuloom_connections_cut_total{reason="send_timeout"}'],
                m['gpuloom_connections_cut_total{reason="refused"}']) == (2, 1)
    finally:
        s.stop()


def _nofile_1024() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def test_8_the_default_limit_follows_the_descriptor_limit(tmp_path: Path) -> None:
    """With 1,024 descriptors, 1,500 idle connections used to leave none for ``/health`` (the server could
    not accept until they closed, and they never did)."""
    s = Server(tmp_path, "--cluster", "1x1", "--header-timeout", "600")  # (no idle one is cut while it counts)
    s.popen_kw = {"preexec_fn": _nofile_1024}
    s.start()
    conns: list[socket.socket] = []
    try:
        conns = idle_connections(int(s.url.rsplit(":", 1)[1]), 1500)
        # 1,024 - 512 reserved - 128 backlog: 384 connections at most
        wait_for(lambda: sum(not closed_by_server(c) for c in conns) == 384, 10, "the oldest to be dropped")
        r = httpx.get(s.url + "/health", timeout=10)
        assert r.status_code == 200
        assert sum(not closed_by_server(c) for c in conns) == 383  # /health's connection dropped one more
    finally:
        for c in conns:
            c.close()
        s.stop()


def test_8_with_tls_a_stalled_handshake_times_out_and_the_socket_stays_plain(tmp_path: Path) -> None:
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    state = tmp_path / "st"
    state.mkdir()
    s = Server(state, "--cluster", "1x1", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert),
               "--header-timeout", "2")
    s.verify = ssl.create_default_context(cafile=str(cert))
    s.start()
    try:
        assert s.url.startswith("https://")
        c = Client(None, None, state)  # the local socket: trusted by where it is, no certificate needed
        assert c.url.startswith("unix://") and c.call("GET", "/health")["status"] == "ok"
        stalled = socket.create_connection(("127.0.0.1", int(s.url.rsplit(":", 1)[1])))  # no ClientHello
        t0 = time.monotonic()
        wait_for(lambda: closed_by_server(stalled), 10, "the handshake timeout")
        assert 2.0 <= time.monotonic() - t0 < 5.0
    finally:
        s.stop()
