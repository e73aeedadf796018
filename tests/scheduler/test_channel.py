"""Both channel implementations must behave the same: every test runs on "local" and "ray"."""

import dataclasses
import sys
import threading
import time
import uuid

import numpy as np
import pytest
import ray
import torch
from channel_checks import check_first_done

from embodied_async.scheduler import (
    ChannelClosed,
    ChannelFuture,
    LocalChannel,
    RayChannel,
    create_channel,
)

pytestmark = pytest.mark.slow  # starts Ray


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    # pytest imports this file under a name Ray workers cannot import: ship its classes by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(params=["local", "ray"])
def make_channel(request):
    def make(maxsize=0):
        return create_channel(request.param, f"test-{uuid.uuid4().hex[:8]}", maxsize)

    return make


@dataclasses.dataclass
class Rollout:
    step: int
    obs: np.ndarray


def test_factory_types():
    assert isinstance(create_channel("local", "a"), LocalChannel)
    assert isinstance(create_channel("ray", f"b-{uuid.uuid4().hex[:8]}"), RayChannel)
    with pytest.raises(ValueError, match="unknown channel backend"):
        create_channel("zmq", "c")


def test_fifo_per_key_and_keys_independent(make_channel):
    channel = make_channel()
    for i in range(5):
        channel.put(i, key=("env", 0))
        channel.put(f"s{i}", key=7)
    channel.put("plain")
    assert channel.qsize() == 11
    assert channel.qsize(("env", 0)) == 5
    assert [channel.get(key=7) for _ in range(5)] == [f"s{i}" for i in range(5)]
    assert channel.get() == "plain"
    assert [channel.get(key=("env", 0)) for _ in range(5)] == list(range(5))
    assert channel.qsize() == 0 and channel.qsize("never-used") == 0


def test_backpressure_put_waits_for_a_free_slot(make_channel):
    channel = make_channel(maxsize=2)
    channel.put("a", key="k")
    channel.put("b", key="k")
    channel.put("other", key="j")  # another key is not held back by a full "k"
    pending = channel.put_async("c", key="k")
    time.sleep(0.3)
    assert not pending.done()
    assert channel.qsize("k") == 2
    assert channel.get(key="k") == "a"  # frees a slot: the waiting put goes in
    assert pending.result(timeout=5) is None and pending.done()
    assert [channel.get(key="k"), channel.get(key="k")] == ["b", "c"]


def test_blocking_put_in_a_thread_is_released_by_get(make_channel):
    channel = make_channel(maxsize=1)
    channel.put(0)
    finished = threading.Event()
    thread = threading.Thread(target=lambda: (channel.put(1), finished.set()))
    thread.start()
    assert not finished.wait(0.3)
    assert channel.get(timeout=5) == 0
    assert finished.wait(5)
    thread.join(5)
    assert channel.get(timeout=5) == 1


def test_timeouts_do_not_consume_or_add_items(make_channel):
    channel = make_channel(maxsize=1)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        channel.get(key="k", timeout=0.2)
    assert 0.15 < time.monotonic() - start < 5
    channel.put("late", key="k")  # arrives after the timed-out get: it must still be there
    assert channel.qsize("k") == 1
    assert channel.get(key="k", timeout=5) == "late"

    channel.put("first", key="k")
    with pytest.raises(TimeoutError):
        channel.put("dropped", key="k", timeout=0.2)  # full: the item is not added later
    assert channel.get(key="k", timeout=5) == "first"
    with pytest.raises(TimeoutError):
        channel.get(key="k", timeout=0.1)

    waiting = channel.get_async(key="k")
    with pytest.raises(TimeoutError):
        waiting.result(timeout=0.1)  # the future timing out leaves the get pending
    channel.put("for-future", key="k")
    assert waiting.result(timeout=5) == "for-future"


def test_async_put_get_preserve_order(make_channel):
    channel = make_channel(maxsize=3)
    gets = [channel.get_async(key="k") for _ in range(4)]  # waiting before any item exists
    assert isinstance(gets[0], ChannelFuture) and not gets[0].done()
    big = np.arange(100_000, dtype=np.float64)  # > Ray's inline limit: goes via object store
    puts = [channel.put_async(big * i if i % 3 == 0 else i, key="k") for i in range(40)]
    results = [g.result(timeout=10) for g in gets]
    results += [channel.get(key="k", timeout=10) for _ in range(36)]
    for p in puts:
        assert p.result(timeout=10) is None
    for i, value in enumerate(results):
        if i % 3 == 0:
            np.testing.assert_array_equal(value, big * i)
        else:
            assert value == i


def test_first_done_names_the_get_whose_item_arrived(make_channel):
    check_first_done(make_channel(), wait_s=20.0)


def test_concurrent_producers_and_consumers(make_channel):
    channel = make_channel(maxsize=3)
    received = []
    lock = threading.Lock()

    def produce(rank):
        for i in range(40):
            channel.put((rank, i), key="k", timeout=20)

    def consume():
        for _ in range(80):
            item = channel.get(key="k", timeout=20)
            with lock:
                received.append(item)

    threads = [threading.Thread(target=produce, args=(r,)) for r in range(4)]
    threads += [threading.Thread(target=consume) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(received) == [(r, i) for r in range(4) for i in range(40)]  # each exactly once
    assert channel.qsize() == 0


def test_close_wakes_blocked_getter_and_fails_later_calls(make_channel):
    channel = make_channel(maxsize=1)
    errors = []

    def blocked_get():
        try:
            channel.get(key="k")
        except ChannelClosed as err:
            errors.append(err)

    thread = threading.Thread(target=blocked_get)
    thread.start()
    channel.put("x", key="full")
    blocked_put = channel.put_async("y", key="full")
    time.sleep(0.3)
    channel.close()
    thread.join(5)
    assert not thread.is_alive() and len(errors) == 1
    with pytest.raises(ChannelClosed):
        blocked_put.result(timeout=5)
    with pytest.raises(ChannelClosed):
        channel.put(1)
    with pytest.raises(ChannelClosed):
        channel.get(timeout=1)
    with pytest.raises(ChannelClosed):
        channel.get_async().result(timeout=5)


def test_numpy_torch_and_dataclass_items_round_trip(make_channel):
    channel = make_channel()
    array = np.random.default_rng(0).random((4, 3)).astype(np.float32)
    tensor = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    rollout = Rollout(step=3, obs=np.ones((2, 2), dtype=np.uint8))
    for item in (array, tensor, rollout, {"nested": [tensor, array]}):
        channel.put(item)
    np.testing.assert_array_equal(channel.get(timeout=5), array)
    assert torch.equal(channel.get(timeout=5), tensor)
    got = channel.get(timeout=5)
    assert got.step == 3 and got.obs.dtype == np.uint8
    nested = channel.get(timeout=5)
    assert torch.equal(nested["nested"][0], tensor)


@ray.remote(num_cpus=0)
class Producer:
    """A worker that only knows the channel it was handed."""

    def produce(self, channel, n, key):
        for i in range(n):
            channel.put(i, key=key)
        return channel.get(key="reply", timeout=10)


def test_ray_channel_used_inside_another_actor():
    channel = RayChannel.create(f"actor-{uuid.uuid4().hex[:8]}", maxsize=2)
    producer = Producer.remote()
    done = producer.produce.remote(channel, 6, ("rank", 0))
    # maxsize=2 holds the producer back until the driver drains the key
    assert [channel.get(key=("rank", 0), timeout=20) for _ in range(6)] == list(range(6))
    channel.put("thanks", key="reply")
    assert ray.get(done, timeout=20) == "thanks"
    assert RayChannel.connect(channel.name).maxsize == 2


def test_a_consumer_that_takes_over_fails_the_gets_its_killed_predecessor_left_waiting():
    """A killed consumer's armed get stays queued in the channel's actor: without the take-over
    it would take the next item to nobody (the replaced rollout worker then never got its weights)."""
    name = f"takeover-{uuid.uuid4().hex[:8]}"
    predecessor, producer = RayChannel.create(name, maxsize=2), RayChannel.connect(name)
    armed = predecessor.get_async(key=0)  # never read again: its process is gone
    successor = RayChannel.connect(name)
    successor.listen([0, 1], take_over=True)
    with pytest.raises(ChannelClosed):  # answered at once: nothing is left for it
        armed.result(timeout=5)
    producer.put("weights", key=0)
    assert successor.get(key=0, timeout=5) == "weights"
    waiting = successor.get_async(key=0)
    RayChannel.connect(name).listen([0])  # a first start leaves the waiting gets alone
    producer.put("next", key=0)
    assert waiting.result(timeout=5) == "next"
