"""The signals a cluster sends a run, and what each does.

- SIGTERM (SLURM's and Kubernetes' "stop now", often a grace period before SIGKILL), SIGHUP:
  the run saves a checkpoint of its last completed update and ends with exit code 143 (128 +
  SIGTERM, what schedulers read as terminated), within ``runner.preemption_grace_s``.
- SIGINT (Ctrl-C): the same, exit code 130.
- SIGUSR1 (SLURM's ``--signal=USR1@N`` warning): a checkpoint at the next step's end; the run goes on.

A scheduler may signal the job's whole process group, and Ray's daemons (raylet, GCS) are
children of the driver: one SIGTERM to the group would kill them under the driver before it could
save. So the launcher (``examples/embodiment/train_async.py``) runs the driver in a process group
of its own (:func:`run_driver_in_own_group`; the same session, so a terminal still owns it) and
forwards each signal to it once; the driver handles them here. Should the launcher itself be
killed outright, the kernel sends the driver SIGTERM.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import List, Optional, Sequence

DRIVER_ENV = "EMBODIED_ASYNC_DRIVER"  # set in the driver's environment: it is the supervised child
STOPPING = (signal.SIGTERM, signal.SIGHUP)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
TERMINATED_EXIT_CODE = 128 + signal.SIGTERM
PR_SET_PDEATHSIG = 1


class Preempted(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) reached the driver: save and stop, as Ctrl-C does, but within the
    scheduler's grace period. A KeyboardInterrupt: Ray's waits let only that kind of exception out
    of a signal handler (any other surfaces as a SystemError; a Preempted raised inside one comes
    out as a plain KeyboardInterrupt, so :func:`stop_signal` says which signal it was)."""

    def __init__(self, signum: int):
        super().__init__(f"{signal.Signals(signum).name} received")
        self.signum = signum


# ---- the launcher ----------------------------------------------------------------------------------

def is_driver() -> bool:
    return os.environ.get(DRIVER_ENV) == "1"


def run_driver_in_own_group(argv: Sequence[str]) -> int:
    """Run ``python argv`` as the driver in a process group of its own, forward SIGINT / SIGTERM /
    SIGHUP / SIGUSR1 to it, and return its exit code (128 + N when a signal N ended it)."""
    driver = subprocess.Popen([sys.executable, *argv], env=dict(os.environ, **{DRIVER_ENV: "1"}),
                              preexec_fn=_own_group_ended_with_parent)

    def forward(signum, _frame):
        try:
            driver.send_signal(signum)
        except ProcessLookupError:  # it ended meanwhile
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    code = driver.wait()
    return 128 - code if code < 0 else code


def _own_group_ended_with_parent() -> None:
    """In the driver, before it runs: a process group of its own (signals to the launcher's group
    reach it only as forwarded), and SIGTERM when the launcher dies (even by SIGKILL), so an
    orphaned run saves and stops instead of going on unseen."""
    os.setpgid(0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


# ---- the driver ------------------------------------------------------------------------------------

_save_requests: List[int] = []
_stop_signals: List[int] = []  # the signals that stopped the run, first first


def install_driver_handlers() -> None:
    """SIGINT raises KeyboardInterrupt, SIGTERM / SIGHUP raise Preempted, SIGUSR1 asks for a
    checkpoint. Called at the driver's start and again after ``ray.init``, which sets handlers of
    its own (its SIGTERM handler would exit without a save)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, *STOPPING):
        signal.signal(signum, _raise_stop)
    signal.signal(signal.SIGUSR1, lambda *_: _save_requests.append(signal.SIGUSR1))


def _raise_stop(signum, _frame=None):
    _stop_signals.append(signum)
    raise KeyboardInterrupt if signum == signal.SIGINT else Preempted(signum)


def stop_signal() -> Optional[int]:
    """The signal that stopped the run (SIGINT, SIGTERM, SIGHUP), None when none did."""
    return _stop_signals[0] if _stop_signals else None


def preempted() -> bool:
    """Whether a scheduler's SIGTERM (or SIGHUP), not Ctrl-C, stopped the run."""
    return stop_signal() in STOPPING


def exit_code() -> int:
    """The exit code of a stopped run: 143 for a scheduler's stop, 130 for Ctrl-C."""
    return TERMINATED_EXIT_CODE if preempted() else 128 + signal.SIGINT


def take_save_request() -> bool:
    """Whether SIGUSR1 asked for a checkpoint since the last call."""
    asked = bool(_save_requests)
    _save_requests.clear()
    return asked


@contextlib.contextmanager
def deferred():
    """Hold back Ctrl-C and SIGTERM inside the block; the first one that came meanwhile is raised
    right after it (a second signal while a checkpoint is written must not cut it short).

    (Masking the signals would not do: any of Ray's threads may receive them, and Python still
    runs the handler in the main thread. A handler that only records them does.)
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: List[int] = []
    held = (signal.SIGINT, *STOPPING)
    previous = {signum: signal.signal(signum, lambda signum, _: received.append(signum)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if received:
            _raise_stop(received[0])
