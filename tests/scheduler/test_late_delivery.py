"""The drill's slow link (cluster.inject_channel_latency_s): an item reaches its consumer the
latency after it arrived, a pending get stays pending, and the producer's bound is the channel's."""

import pickle
import time

import pytest

from embodied_async.scheduler import LocalChannel
from embodied_async.scheduler.futures import first_done
from embodied_async.scheduler.graph_channels import LateDelivery


def test_an_item_arrives_the_latency_late_and_the_channel_bound_still_holds():
    channel = LateDelivery(LocalChannel(maxsize=1), 0.3)
    channel.put("a", key=0)
    with pytest.raises(TimeoutError):  # full: the producer waits, nothing queues past the bound
        channel.put("b", key=0, timeout=0.05)
    assert channel.qsize(0) == 1 and channel.maxsize == 1
    started = time.monotonic()
    assert channel.get(key=0) == "a"
    assert 0.3 <= time.monotonic() - started < 1.0


def test_a_late_get_is_done_only_after_the_latency_and_times_out_while_in_transit():
    channel = LateDelivery(LocalChannel(maxsize=2), 0.3)
    future = channel.get_async(key=0)
    with pytest.raises(TimeoutError):  # nothing sent yet: the get stays armed
        future.result(timeout=0.05)
    channel.put("a", key=0)
    arrived = time.monotonic()
    assert first_done([future], timeout=0.1) is None  # in transit
    with pytest.raises(TimeoutError, match="still in transit"):
        future.result(timeout=0.05)
    assert first_done([future], timeout=1.0) == 0
    assert time.monotonic() - arrived >= 0.3
    assert future.result(timeout=0) == "a"


class Plain:
    """A channel stand-in that pickles (as the Ray and direct channels do)."""

    maxsize = 3


def test_it_travels_to_a_worker_with_its_latency():
    channel = pickle.loads(pickle.dumps(LateDelivery(Plain(), 0.2)))  # unpickling must not recurse
    assert channel.latency_s == 0.2 and channel.maxsize == 3
