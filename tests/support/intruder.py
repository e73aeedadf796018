"""A local intruder, as any user of the machine could run it: it finds the run's channel sockets
in /proc/net/unix (which lists every bound Unix socket's name to every user), connects to each,
and sends what a channel frame looks like, carrying a pickle that would create ``marker`` if
anything unpickled it. Standard library only: the tests run it as another user with the system's
Python, from its source (``python -c``), so it needs no access to the checkout.

    python -c "$(cat intruder.py)" MARKER MODE SECONDS PREFIX
MODE: ``frame`` (a frame straight away), ``forged`` (a proof made with a guessed secret, then a
frame), ``silent`` (connects, says so on a line, and sends nothing for 2 s). SECONDS: how long to keep trying (0:
one pass), or until it is sent SIGTERM. PREFIX: only sockets whose path starts with it (the test's
own, not other runs on the machine). Prints, on its last line, JSON: for each socket, every
attempt's outcome ("sent", or the error's name).
"""

import json
import os
import pickle
import signal
import socket
import struct
import sys
import time

marker, mode, seconds, prefix = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))


body = pickle.dumps(Payload(), protocol=5)
frame = struct.pack("<II", len(body), 0) + body


def channel_sockets():
    with open("/proc/net/unix") as table:
        next(table)
        for line in table:
            fields = line.split()
            if len(fields) >= 8 and "embodied_async" in fields[7] and fields[7].startswith(prefix):
                yield fields[7]


attempts = {}
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
deadline = time.monotonic() + seconds
while True:
    for path in sorted(set(channel_sockets())):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(5)
            sock.connect(path)
            if mode == "silent":
                print(f"connected {path}", flush=True)
                time.sleep(2)
            else:
                if mode == "forged":
                    sock.sendall(b"EAC1" + os.urandom(48))
                sock.sendall(frame)
            outcome = "sent"
        except OSError as err:
            outcome = type(err).__name__
        finally:
            sock.close()
        attempts.setdefault(path, []).append(outcome)
    if time.monotonic() >= deadline or stopped:
        break
    time.sleep(0.02)
print(json.dumps(attempts))
