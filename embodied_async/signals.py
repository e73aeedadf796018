"""The signals a cluster sends a run, and what each does.

- SIGTERM (SLURM's and Kubernetes' "stop now", often a grace period before SIGKILL), SIGHUP:
  the run saves a checkpoint of its last completed update and ends with exit code 143 (128 +
  SIGTERM, what schedulers read as terminated), within ``runner.preemption_grace_s``.
- SIGINT (Ctrl-C): the same, exit code 130.
- SIGUSR1 (SLURM's ``--signal=USR1@N`` warning): a checkpoint at the next step's end; the run goes on.

A scheduler may signal the job's whole process group, and Ray's daemons (raylet, GCS) are
children of the driver: one SIGTERM to the group would kill them under the driver before it could
save. So the launcher (the ``train`` command, ``cli/train.py``) runs the driver in a process group
of its own (:func:`run_driver_in_own_group`; the same session, so a terminal still owns it) and
forwards each signal to it once; the driver handles them here. Should the launcher itself be
killed outright, the kernel sends the driver SIGTERM.

In the driver the handlers stay installed for the whole run; what they do depends on the moment:
the first stop raises (KeyboardInterrupt, or :class:`Preempted`) unless the run is inside
:func:`deferred` (a checkpoint being written, a call being recorded), where it is held and raised
at the block's end; once the run is stopping, further signals are only recorded, so nothing cuts
the checkpoint of the stop short.
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
    """Whether this process is the driver the launcher started (the mark is taken off at once,
    so that a process the driver starts is not taken for one)."""
    return os.environ.pop(DRIVER_ENV, None) == "1"


def run_driver_in_own_group(argv: Sequence[str]) -> int:
    """Run ``python argv`` (with this interpreter's own options) as the driver in a process group
    of its own, forward SIGINT / SIGTERM / SIGHUP / SIGUSR1 to it, and return its exit code
    (128 + N when a signal N ended it)."""
    started: List[subprocess.Popen] = []

    def forward(signum, _frame):
        if not started:  # before the driver exists: it starts, then is told
            pending.append(signum)
            return
        try:
            started[0].send_signal(signum)
        except ProcessLookupError:  # it ended meanwhile
            pass

    pending: List[int] = []
    for signum in FORWARDED:  # from before the driver starts: no signal falls between
        signal.signal(signum, forward)
    launcher = os.getpid()
    started.append(subprocess.Popen([sys.executable, *argv], env=dict(os.environ, **{DRIVER_ENV: "1"}),
                                    preexec_fn=lambda: _own_group_ended_with_parent(launcher)))
    for signum in pending:
        forward(signum, None)
    code = started[0].wait()
    return 128 - code if code < 0 else code


def _own_group_ended_with_parent(launcher: int) -> None:
    """In the driver, before it runs: a process group of its own (signals to the launcher's group
    reach it only as forwarded), and SIGTERM when the launcher dies (even by SIGKILL), so an
    orphaned run saves and stops instead of going on unseen."""
    os.setpgid(0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0 or os.getppid() != launcher:
        os.kill(os.getpid(), signal.SIGTERM)  # no kernel watch, or the launcher is already gone


# ---- the driver ------------------------------------------------------------------------------------

_installed: List[bool] = []  # whether this process is a driver that took the signals over
_save_requests: List[int] = []
_stop_signals: List[int] = []  # the signals that stopped the run, first first
_held: List[int] = []  # depth of deferred blocks
_pending: List[int] = []  # a stop that came inside a deferred block


def install_driver_handlers() -> None:
    """SIGINT / SIGTERM / SIGHUP stop the run (Ctrl-C a KeyboardInterrupt, the others Preempted),
    SIGUSR1 asks for a checkpoint. Called at the driver's start and again after ``ray.init``, which
    sets handlers of its own (its SIGTERM handler would exit without a save)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, *STOPPING):
        signal.signal(signum, _on_stop_signal)
    signal.signal(signal.SIGUSR1, lambda *_: _save_requests.append(signal.SIGUSR1))
    _installed[:] = [True]


def restore_after_ray_init() -> None:
    """``ray.init`` swaps the process's handlers for its own (its SIGINT handler swallows Ctrl-C
    while we wait on workers, its SIGTERM handler exits): the driver's again, or, in a process that
    is not a driver (a test, a notebook), Python's Ctrl-C."""
    if _installed:
        install_driver_handlers()
    elif threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def reset() -> None:
    """A fresh run in this process: no stop, no checkpoint asked for."""
    for state in (_save_requests, _stop_signals, _held, _pending):
        state.clear()


def _on_stop_signal(signum, _frame=None):
    if signum == signal.SIGHUP:  # the terminal is gone: writing to it would fail the save
        _detach_from_terminal()
    first = not _stop_signals
    _stop_signals.append(signum)
    if not first:  # already stopping: the checkpoint of the first stop goes on
        return
    if _held:
        _pending.append(signum)
        return
    _raise_stop(signum)


def _raise_stop(signum: int):
    raise KeyboardInterrupt if signum == signal.SIGINT else Preempted(signum)


def _detach_from_terminal() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (1, 2):
        os.dup2(devnull, stream)
    os.close(devnull)


def stopping() -> bool:
    """Whether a stop signal came (the run is, or is about to be, stopping)."""
    return bool(_stop_signals)


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


def preempted_during_ray_init(err: SystemExit) -> bool:
    """``ray.init`` answers SIGTERM with its own ``sys.exit(SIGTERM)`` until ours are installed
    again; such an exit is recorded as the stop it is."""
    if err.code != signal.SIGTERM:
        return False
    _stop_signals.append(signal.SIGTERM)
    return True


@contextlib.contextmanager
def deferred():
    """Hold back a stop inside the block: one that comes meanwhile is raised right after the block
    ends normally (when the block raised, its own error goes on, and the stop stays recorded for the
    exit code). Blocks nest; the handlers themselves are never swapped, so no signal falls between."""
    _held.append(1)
    try:
        yield
    finally:
        _held.pop()
    if not _held and _pending:
        _raise_stop(_pending.pop(0))
