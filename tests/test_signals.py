"""The driver's signal handling (embodied_async.signals): a stop raises once, is held back inside a
block that writes a checkpoint, and later signals never cut that short; SIGUSR1 asks for a save."""

import os
import signal

import pytest

from embodied_async import signals


@pytest.fixture
def driver_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)}
    signals.reset()
    signals.install_driver_handlers()
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    signals.reset()


def send(signum):
    os.kill(os.getpid(), signum)  # the handler runs in this (the main) thread before kill returns


def test_sigterm_raises_a_stop_that_reads_as_terminated(driver_handlers):
    with pytest.raises(KeyboardInterrupt):
        send(signal.SIGTERM)
    assert signals.preempted() and signals.stop_signal() == signal.SIGTERM and signals.exit_code() == 143
    send(signal.SIGTERM)  # already stopping: recorded, not raised again
    send(signal.SIGINT)
    assert signals.stop_signal() == signal.SIGTERM


def test_a_stop_inside_nested_blocks_waits_for_the_outermost_to_end(driver_handlers):
    reached = []
    with pytest.raises(signals.Preempted):
        with signals.deferred():
            with signals.deferred():
                send(signal.SIGTERM)
                reached.append("inner")
            send(signal.SIGTERM)  # a second one while the first is held: recorded only
            reached.append("outer")
    assert reached == ["inner", "outer"]


def test_an_error_inside_the_block_is_not_replaced_by_the_stop(driver_handlers):
    with pytest.raises(ValueError, match="disk"):
        with signals.deferred():
            send(signal.SIGTERM)
            raise ValueError("disk full")
    assert signals.exit_code() == 143  # the stop is still known


def test_ctrl_c_reads_as_interrupted_and_sigusr1_asks_for_one_save(driver_handlers):
    send(signal.SIGUSR1)
    assert signals.take_save_request() and not signals.take_save_request()
    with pytest.raises(KeyboardInterrupt) as stop:
        send(signal.SIGINT)
    assert not isinstance(stop.value, signals.Preempted) and signals.exit_code() == 130


def test_rays_own_exit_during_its_start_is_taken_for_the_stop_it_is(driver_handlers):
    assert signals.preempted_during_ray_init(SystemExit(signal.SIGTERM)) and signals.exit_code() == 143
    assert not signals.preempted_during_ray_init(SystemExit(1))
