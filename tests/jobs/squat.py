"""A hostile job for the service tests: it takes the server's port as soon as it is free.

``squat.py HOST PORT OUT``: tries to bind HOST:PORT (with ``SO_REUSEADDR``, as a
server would) every 20 ms until it gets it, then writes its pid to ``OUT.bound``
and appends whatever each connection sends (up to 64 KiB, 2 s) to ``OUT``.
Standard library only: it runs as an unprivileged account with the system's Python.
"""

import os
import socket
import sys
import time

host, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
while True:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        s.listen(16)
        break
    except OSError:
        s.close()
        time.sleep(0.02)
with open(out, "ab"):
    pass
with open(out + ".bound", "w") as f:
    f.write(str(os.getpid()))
while True:
    c, _ = s.accept()
    c.settimeout(2)
    data = b""
    try:
        while len(data) < 65536:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    c.close()
    with open(out, "ab") as f:
        f.write(repr(data).encode() + b"\n")
