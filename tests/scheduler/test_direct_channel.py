"""DirectChannel: the channel semantics (FIFO per key, backpressure, timeouts that withdraw,
ChannelClosed) between two processes over a Unix socket, and within one process."""

import dataclasses
import multiprocessing as mp
import pickle
import threading
import time

import numpy as np
import pytest
import torch
from channel_checks import check_first_done

from embodied_async.data import ActionMessage, EnvOutput
from embodied_async.scheduler import ChannelClosed
from embodied_async.scheduler.direct_channel import DirectChannel

KEYS = [(0, 0), (0, 1), (1, 0)]


@pytest.fixture
def channel():
    made = DirectChannel.create("test", KEYS, maxsize=2)
    yield made
    made.destroy()


def _produce(channel, key, count, done, release=None):
    for i in range(count):
        channel.put(EnvOutput.after_reset({"states": np.full((4, 3), i, np.float32)}, 4), key=key)
    done.set()
    if release is not None:  # stay connected until the consumer took (and acknowledged) every item
        release.wait(60)


def _echo(channel, replies, rounds):
    """An env-like process: take an action message, answer with an output (as the env worker)."""
    replies.listen([(0, 0)])
    for i in range(rounds):
        message = replies.get(key=(0, 0), timeout=30)
        channel.put(EnvOutput.after_reset({"states": message.actions[:, 0] + i}, len(message.actions)), key=(0, 0))
    channel.close()
    replies.close()


@pytest.mark.slow  # spawns processes
def test_items_cross_processes_in_order_per_key(channel):
    context = mp.get_context("spawn")
    channel.listen(KEYS[:2])
    done = [context.Event() for _ in range(2)]
    release = context.Event()
    procs = [context.Process(target=_produce, args=(channel, key, 30, event, release))
             for key, event in zip(KEYS[:2], done)]
    for proc in procs:
        proc.start()
    # maxsize 2: each producer gets two items ahead and then waits for us to take one
    deadline = time.monotonic() + 120  # spawned processes import numpy and torch first
    while channel.qsize() < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert channel.qsize(KEYS[0]) == 2 and channel.qsize() == 4 and not any(e.is_set() for e in done)
    for i in range(30):
        for key in KEYS[:2]:
            out = channel.get(key=key, timeout=30)
            assert float(out.obs["states"][0, 0]) == i
            out.obs["states"][0, 0] = -1.0  # arrays arrive writable (the rollout writes into them)
    traffic = channel.pop_traffic()  # this process acknowledged 60 items, one byte each
    release.set()
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert channel.qsize() == 0
    assert traffic == {"messages": 60.0, "bytes": 60.0, "refused_connections": 0.0}


def test_first_done_wakes_on_the_key_whose_item_arrived():
    channel = DirectChannel.create("test", ["a", "b", "c"], maxsize=2)
    try:
        channel.listen(["a", "b", "c"])
        check_first_done(channel, wait_s=20.0)  # one process holding both ends: a thread produces
    finally:
        channel.destroy()


@pytest.mark.slow  # spawns a process
def test_round_trips_with_an_env_like_process():
    outputs = DirectChannel.create("outputs", [(0, 0)], maxsize=2)
    actions = DirectChannel.create("actions", [(0, 0)], maxsize=2)
    outputs.listen([(0, 0)])
    proc = mp.get_context("spawn").Process(target=_echo, args=(outputs, actions, 20))
    proc.start()
    try:
        for i in range(20):
            sent = np.random.default_rng(i).random((8, 1, 3)).astype(np.float32)
            actions.put_async(ActionMessage(sent), key=(0, 0)).result(timeout=30)
            out = outputs.get_async(key=(0, 0)).result(timeout=30)
            np.testing.assert_array_equal(out.obs["states"], sent[:, 0] + i)
        # the peer closed its ends when it finished: we are told, not left waiting
        with pytest.raises(ChannelClosed):
            outputs.get(key=(0, 0), timeout=30)
        proc.join(30)
        assert proc.exitcode == 0
        traffic = actions.pop_traffic()
        assert traffic["messages"] == 20 and traffic["bytes"] > 20 * sent.nbytes
    finally:
        outputs.destroy()
        actions.destroy()


def test_backpressure_and_timeouts_withdraw(channel):
    key = KEYS[0]
    channel.listen([key])
    channel.put("a", key=key)
    channel.put("b", key=key)
    with pytest.raises(TimeoutError):
        channel.put("dropped", key=key, timeout=0.2)  # two unacknowledged: full
    pending = channel.put_async("c", key=key)
    assert not pending.done()
    assert channel.get(key=key, timeout=5) == "a"  # frees a slot: the waiting put goes in
    assert pending.result(timeout=5) is None
    assert [channel.get(key=key, timeout=5), channel.get(key=key, timeout=5)] == ["b", "c"]
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        channel.get(key=key, timeout=0.2)
    assert 0.15 < time.monotonic() - start < 5
    waiting = channel.get_async(key=key)
    with pytest.raises(TimeoutError):
        waiting.result(timeout=0.1)  # stays pending
    channel.put("late", key=key)
    assert waiting.result(timeout=5) == "late"
    assert channel.qsize() == 0


def test_gets_waiting_together_are_served_oldest_first(channel):
    key = KEYS[1]
    gets = [channel.get_async(key=key) for _ in range(3)]
    thread = threading.Thread(target=lambda: [channel.put(i, key=key) for i in range(3)])
    thread.start()
    assert gets[2].result(timeout=5) == 2  # waiting on the newest reads the older ones' items first
    assert [g.result(timeout=5) for g in gets[:2]] == [0, 1]
    thread.join(5)


def test_a_put_waits_until_its_consumer_listens(channel):
    key = KEYS[2]
    with pytest.raises(TimeoutError):
        channel.put("x", key=key, timeout=0.3)  # nobody listens yet
    thread = threading.Thread(target=lambda: channel.put("y", key=key))
    thread.start()
    time.sleep(0.2)
    channel.listen([key])
    assert channel.get(key=key, timeout=5) == "y"
    thread.join(5)


def test_reopen_takes_in_the_process_that_replaced_a_peer(channel):
    """The runner replaced an env worker: each end the rollout holds forgets the old process. As
    the consumer its get already armed is served by the new producer; as the producer its next put
    reaches the new consumer. (A copy of the channel stands for another process.)"""
    key = KEYS[0]
    old_producer = pickle.loads(pickle.dumps(channel))
    channel.listen([key])
    old_producer.put("before", key=key)
    assert channel.get(key=key, timeout=5) == "before"
    armed = channel.get_async(key=key)
    old_producer.close()  # its process ended
    with pytest.raises(ChannelClosed, match="producer's end is gone"):
        armed.result(timeout=5)
    channel.reopen(key)
    new_producer = pickle.loads(pickle.dumps(channel))
    new_producer.put("after", key=key, timeout=5)
    assert armed.result(timeout=5) == "after" and channel.qsize(key) == 0

    # a blocking get that met the producer's end gone leaves nothing armed behind it
    blocked = pickle.loads(pickle.dumps(channel))
    old_producer = pickle.loads(pickle.dumps(channel))
    key = KEYS[2]
    blocked.listen([key])
    old_producer.put("first", key=key, timeout=5)
    assert blocked.get(key=key, timeout=5) == "first"
    old_producer.close()
    with pytest.raises(ChannelClosed):
        blocked.get(key=key, timeout=5)
    blocked.reopen(key)
    replacing = pickle.loads(pickle.dumps(channel))
    replacing.put("second", key=key, timeout=5)
    assert blocked.get(key=key, timeout=5) == "second"
    replacing.close(), blocked.close()

    key = KEYS[1]
    old_consumer = pickle.loads(pickle.dumps(channel))
    old_consumer.listen([key])
    channel.put("one", key=key, timeout=5)
    assert old_consumer.get(key=key, timeout=5) == "one"
    old_consumer.close()
    with pytest.raises(ChannelClosed, match="consumer"):
        channel.put("lost", key=key, timeout=5)
    channel.reopen(key)
    new_consumer = pickle.loads(pickle.dumps(channel))
    new_consumer.listen([key])
    channel.put("two", key=key, timeout=5)
    assert new_consumer.get(key=key, timeout=5) == "two"
    new_producer.close(), new_consumer.close()


def test_close_fails_waiting_and_later_operations():
    channel = DirectChannel.create("closing", KEYS, maxsize=1)
    errors = []

    def blocked_get():
        try:
            channel.get(key=KEYS[0])
        except ChannelClosed as err:
            errors.append(err)

    thread = threading.Thread(target=blocked_get)
    thread.start()
    time.sleep(0.3)
    channel.destroy()
    thread.join(5)
    assert not thread.is_alive() and len(errors) == 1
    with pytest.raises(ChannelClosed):
        channel.put(1, key=KEYS[0])
    with pytest.raises(ChannelClosed):
        channel.get_async(key=KEYS[0])


def test_unknown_key_and_second_consumer_are_refused(channel):
    with pytest.raises(KeyError, match="carries the keys"):
        channel.put(1, key=(9, 9))
    channel.listen([KEYS[0]])
    other = pickle.loads(pickle.dumps(channel))  # another copy = another "process"
    with pytest.raises(RuntimeError, match="one consumer per key"):
        other.listen([KEYS[0]])
    other.close()


def test_a_consumer_that_replaces_another_takes_its_socket_over(channel):
    """The runner killed a consumer that listened (a stopped process may still hold its socket
    while it dies): the process replacing it listens there all the same (``take_over``); without
    it, a second consumer of a key is refused (the test above)."""
    key = KEYS[1]
    replaced = pickle.loads(pickle.dumps(channel))
    replaced.listen([key])  # still listening: stopped, not yet gone
    replacing = pickle.loads(pickle.dumps(channel))
    with pytest.raises(RuntimeError, match="one consumer per key"):
        replacing.listen([key])
    replacing.listen([key], take_over=True)
    channel.put("to the new consumer", key=key, timeout=5)
    assert replacing.get(key=key, timeout=5) == "to the new consumer"
    replacing.close(), replaced.close()


def test_message_items_round_trip(channel):
    """What the graph sends: its message dataclasses, arrays of every plain dtype and layout
    (non-contiguous, 0-d, empty, text, dates), numpy scalars and plain containers."""
    key = KEYS[0]
    channel.listen([key])
    obs = {"states": np.arange(12, dtype=np.float32).reshape(4, 3), "main_images": np.zeros((4, 2, 2, 3), np.uint8),
           "task_descriptions": ["push the cube"] * 4}
    item = {
        "output": EnvOutput.after_reset(obs, 4),
        "action": ActionMessage(np.arange(24, dtype=np.float32).reshape(4, 2, 3)[:, :, ::2]),
        "arrays": [np.array(["a", "bc"]), np.array(3.5), np.zeros((0, 3), np.int64), np.array([True, False]),
                   np.array(["2020-01-01"], dtype="datetime64[D]"), np.arange(6, dtype=">i4").reshape(2, 3).T],
        "scalars": [np.float32(2.5), np.bool_(True), np.str_("text"), np.int64(-7)],
        "plain": (1, 2.0, b"raw", None, {1, 2}, frozenset([3]), complex(1, 2), slice(1, 5)),
    }
    channel.put(item, key=key)
    got = channel.get(key=key, timeout=5)
    np.testing.assert_array_equal(got["output"].obs["states"], obs["states"])
    assert got["output"].obs["task_descriptions"] == obs["task_descriptions"]
    np.testing.assert_array_equal(got["action"].actions, item["action"].actions)
    for sent, received in zip(item["arrays"], got["arrays"]):
        assert received.dtype == sent.dtype and received.shape == sent.shape
        np.testing.assert_array_equal(received, sent)
    assert got["scalars"] == item["scalars"] and [type(v) for v in got["scalars"]] == [type(v) for v in item["scalars"]]
    assert got["plain"] == item["plain"]
    got["arrays"][0][0] = "z"  # arrays arrive writable


def test_arrays_of_objects_or_records_are_refused_when_put(channel):
    key = KEYS[0]
    channel.listen([key])
    for item in (np.array([1, "x", None], dtype=object), np.zeros(2, dtype=[("a", "f4"), ("b", "i8")])):
        with pytest.raises(TypeError, match="plain dtypes"):
            channel.put({"rows": item}, key=key)
    channel.put(np.ones(2), key=key)  # nothing half-sent: the link goes on
    np.testing.assert_array_equal(channel.get(key=key, timeout=5), np.ones(2))


@dataclasses.dataclass
class Shard:
    name: str


class NumpysOwnPickle:
    """An array pickled by numpy's own reduction, as any sender could write it."""

    def __reduce__(self):
        return np.arange(3).__reduce_ex__(5)


@pytest.mark.parametrize("item, named", [
    (torch.arange(3), "torch"),  # a tensor's pickle calls torch's loaders: not a message type here
    (Shard("s"), "test_direct_channel.Shard"),  # a class outside embodied_async.data
    (NumpysOwnPickle(), "numpy"),  # numpy's rebuilders trust the dtype state a frame gives them
])
def test_items_of_other_types_are_refused_by_name(channel, item, named):
    key = KEYS[0]
    channel.listen([key])
    channel.put(item, key=key)
    with pytest.raises(pickle.UnpicklingError, match=f"names .*{named}.*refused"):
        channel.get(key=key, timeout=5)
    channel.put(ActionMessage(np.ones((1, 1, 1), np.float32)), key=key)  # the frame was read whole: the link goes on
    assert float(channel.get(key=key, timeout=5).actions.sum()) == 1.0
