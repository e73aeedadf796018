"""Checks every channel kind must pass (``tests/scheduler``: local, Ray and direct channels)."""

import threading
import time

from embodied_async.scheduler.futures import first_done


def check_first_done(channel, wait_s: float) -> None:
    """``first_done`` reports the get whose item arrived, in whatever order the keys' items come,
    and leaves the other gets armed: each still delivers its own item later."""
    gets = [channel.get_async(key=k) for k in ("a", "b", "c")]
    assert first_done(gets, timeout=0.2) is None  # nothing yet: None after the timeout
    producer = threading.Timer(0.3, lambda: channel.put("item of b", key="b"))
    producer.start()
    start = time.monotonic()
    assert first_done(gets, timeout=wait_s) == 1
    assert time.monotonic() - start < wait_s / 2  # woken by the item, not by the timeout
    assert gets[1].result(timeout=5) == "item of b"
    # the other gets stayed armed; producers put from threads (a direct channel's consumer
    # accepts its producer's connection inside the get)
    feeder = threading.Thread(target=lambda: [channel.put(f"item of {k}", key=k) for k in ("c", "a")])
    feeder.start()
    assert [gets[0].result(timeout=wait_s), gets[2].result(timeout=wait_s)] == ["item of a", "item of c"]
    assert first_done(gets, timeout=0.0) == 0  # all done: the first in order
    producer.join()
    feeder.join()
