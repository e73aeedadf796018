"""Running tests/support/intruder.py as a local user would: as this uid, or as another one (root
only), with an interpreter that user may run."""

import json
import os
import subprocess
import sys

NOBODY = 65534
INTRUDER = open(os.path.join(os.path.dirname(__file__), "intruder.py")).read()


def python_for(uid: int) -> str:
    """An interpreter that ``uid`` may run (the venv's may sit under a home folder it cannot enter)."""
    candidates = (sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3", "/usr/local/bin/python3")
    for candidate in candidates:
        try:
            if candidate and subprocess.run([candidate, "-c", "pass"], user=uid, group=uid, extra_groups=[], cwd="/",
                                            capture_output=True).returncode == 0:
                return candidate
        except OSError:  # not executable by that user
            continue
    raise AssertionError(f"no Python interpreter that uid {uid} may run")


def start_intruder(marker, mode: str, seconds: float, within: str, uid=None) -> subprocess.Popen:
    """The intruder in the background, trying the sockets under the folder ``within`` (``uid``:
    another user's; None: ours)."""
    as_user = {} if uid is None else dict(user=uid, group=uid, extra_groups=[])
    python = sys.executable if uid is None else python_for(uid)
    return subprocess.Popen([python, "-c", INTRUDER, str(marker), mode, str(seconds), str(within)], cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **as_user)


def outcomes(proc: subprocess.Popen, timeout: float = 60) -> dict:
    """{socket path: [outcome of each attempt]} once the intruder has finished."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.splitlines()[-1])


def intrude(marker, mode: str, within: str, uid=None) -> dict:
    """One pass of the intruder over the sockets it finds under ``within``."""
    return outcomes(start_intruder(marker, mode, 0, within, uid))
