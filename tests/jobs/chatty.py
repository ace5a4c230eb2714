"""A job that prints a lot, for the log cap tests.

``chatty.py ITERS LINES DT``: prints ``chatty start``, then ITERS times LINES junk lines of 100 bytes
and a progress line (one write each, DT seconds apart), then ``chatty done``.  The output is
:func:`output` exactly, so a test knows every byte the job wrote.
"""

import os
import sys
import time


def output(iters: int, lines: int) -> list[bytes]:
    """The job's writes, in order."""
    out = [b"chatty start\n"]
    for i in range(iters):
        junk = b"".join(b"junk %05d %03d " % (i, k) + b"x" * 84 + b"\n" for k in range(lines))
        out.append(junk + b"GPULOOM_PROGRESS iter=%d\n" % (i + 1))
    out.append(b"chatty done\n")
    return out


if __name__ == "__main__":
    iters, lines, dt = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    for k, chunk in enumerate(output(iters, lines)):
        if k:
            time.sleep(dt)
        os.write(1, chunk)
