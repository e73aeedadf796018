"""The rollout store's batch rule, and the acknowledgement throttle simulated against it."""

import itertools

import pytest
import torch

from embodied_async.algorithms.rollout_store import RolloutStore
from embodied_async.algorithms.version_gate import VersionGate, mean_staleness, staleness

P = "train/rollout_store/"


def fill(store, stream, versions):
    for i, v in enumerate(versions):
        store.add(stream, f"{stream}:{i}@v{v}", v)


def test_default_store_takes_one_trajectory_per_stream_in_order():
    store = RolloutStore([(0, 0), (0, 1)], VersionGate(1, 1, 0.0))
    assert store.stream_to_wait_for(0) == (0, 0)
    fill(store, (0, 0), [0])
    assert store.stream_to_wait_for(0) == (0, 1)
    fill(store, (0, 1), [0])
    assert store.take(0) == ["(0, 0):0@v0", "(0, 1):0@v0"]
    assert store.acknowledged == {(0, 0): 1, (0, 1): 1}
    metrics = store.pop_metrics()
    assert metrics[P + "trajectories_lag_0"] == 2 and metrics[P + "trajectories_lag_1"] == 0
    assert metrics[P + "max_lag"] == 0 and metrics[P + "dropped_trajectories"] == 0
    assert metrics[P + "fewest_from_one_stream"] == 1


def test_stale_trajectories_are_dropped_and_acknowledged():
    store = RolloutStore(["s"], VersionGate(2, 1, 0.0))
    fill(store, "s", [3, 4, 5, 5])
    assert store.stream_to_wait_for(5) is None  # v3 (lag 2) dropped; v4, v5 remain
    assert store.take(5) == ["s:1@v4", "s:2@v5"]
    assert store.acknowledged["s"] == 3  # two consumed + one dropped
    metrics = store.pop_metrics()
    assert metrics[P + "dropped_trajectories"] == 1
    assert (metrics[P + "trajectories_lag_0"], metrics[P + "trajectories_lag_1"], metrics[P + "max_lag"]) == (1, 1, 1)
    assert metrics[P + "held_trajectories"] == 1


def test_on_policy_ratio_waits_for_fresh_trajectories():
    store = RolloutStore(["s"], VersionGate(2, 1, 0.5))
    fill(store, "s", [4, 4])
    assert store.stream_to_wait_for(5) == "s"  # two held, none of version 5
    assert store.metrics.waited_for_fresh == 1
    store.add("s", "fresh", 5)
    assert store.stream_to_wait_for(5) is None
    assert store.take(5) == ["s:0@v4", "fresh"]  # the oldest stale one, then the fresh one
    left = store.pop_metrics()
    assert left[P + "held_trajectories"] == 1 and left[P + "waited_for_fresh"] == 1
    # the leftover v4 trajectory is too old for version 6: dropped
    store.add("s", "a", 6)
    store.add("s", "b", 6)
    assert store.take(6) == ["a", "b"]
    assert store.pop_metrics()[P + "dropped_trajectories"] == 1


def test_ratio_one_needs_every_trajectory_fresh():
    store = RolloutStore(["s"], VersionGate(2, 2, 1.0))
    fill(store, "s", [1, 2, 2])
    assert store.take(2) == ["s:1@v2", "s:2@v2"]


def test_the_actor_staleness_metric_is_the_gates_lag_averaged_over_the_trained_trajectories():
    """``train/actor/staleness`` (``mean_staleness``) is the lag the gate judged each trajectory by
    (actor version - its oldest step's version), as the store recorded it: not the lag per step."""
    gate = VersionGate(2, 2, 0.0)
    store = RolloutStore(["a", "b"], gate)
    trajectories = {"a": [torch.tensor([[0, 0], [1, 1]]),  # lag 3 at version 3: dropped
                          torch.tensor([[1, 1], [2, 2]]),  # lag 2 (its steps' mean lag is 1.5)
                          torch.tensor([[3, 3], [3, 3]])],  # lag 0
                    "b": [torch.tensor([[2, 2], [3, 3]]),  # lag 1 (steps' mean 0.5)
                          torch.tensor([[3, 3], [3, 3]])]}  # lag 0
    for stream, versions in trajectories.items():
        for v in versions:
            store.add(stream, v, int(v.min()))  # as the actor adds a shard: its oldest step's version
    batch = store.take(3)
    assert [staleness(v, 3) for v in batch] == [2, 0, 1, 0]
    assert all(gate.accepts(3, int(v.min())) for v in batch)
    metrics = store.pop_metrics()
    recorded = sum(lag * metrics[P + f"trajectories_lag_{lag}"] for lag in range(3)) / len(batch)
    assert mean_staleness(batch, 3) == recorded == 0.75
    assert metrics[P + "dropped_trajectories"] == 1 and metrics[P + "max_lag"] == 2
    per_step = float(3 - torch.cat([v.flatten() for v in batch]).float().mean())
    assert per_step == 0.5  # what the metric measured before: the steps' lag, not the gate's
    assert mean_staleness([], 3) == 0.0


def simulate(size, threshold, ratio, num_streams=1, updates=40, weight_delay=0):
    """The rollout throttle against the store, step by step.

    Each stream may begin a trajectory while fewer than ``capacity`` are unacknowledged; it is
    stamped with the newest weights the rollout has seen. Weights and acknowledgements reach the
    rollout ``weight_delay`` rounds after an update. Returns per-update lags and drop counts; fails
    on a deadlock (neither side can move).
    """
    gate = VersionGate(size, threshold, ratio)
    streams = list(range(num_streams))
    store = RolloutStore(streams, gate)
    started = {s: 0 for s in streams}
    known = {"version": 0, "acks": {s: 0 for s in streams}}
    in_transit = []  # (arrival round, version, acks)
    actor_version, history = 0, []
    for round_ in itertools.count():
        assert round_ < 10_000, "no progress"
        for arrival, version, acks in [m for m in in_transit if m[0] <= round_]:
            known = {"version": version, "acks": acks}
        in_transit = [m for m in in_transit if m[0] > round_]
        moved = False
        if store.stream_to_wait_for(actor_version) is None:
            batch = store.take(actor_version)
            lags = [actor_version - v for v in batch]
            history.append((lags, store.pop_metrics()))
            actor_version += 1
            in_transit.append((round_ + weight_delay, actor_version, dict(store.acknowledged)))
            moved = True
            if len(history) == updates:
                return history
        for s in streams:
            if gate.may_start(started[s], known["acks"][s]):  # the rollout's own rule
                store.add(s, known["version"], known["version"])  # the item is its version
                started[s] += 1
                moved = True
        assert moved or in_transit, f"deadlock at version {actor_version}"


@pytest.mark.parametrize("size, threshold, ratio, streams, delay", [
    (1, 0, 0.0, 1, 0), (1, 0, 0.0, 2, 3), (2, 0, 0.0, 1, 1), (1, 1, 0.0, 1, 2), (2, 1, 0.5, 1, 0),
    (2, 1, 0.5, 2, 4), (3, 2, 0.34, 1, 1), (2, 1, 1.0, 1, 2), (4, 1, 0.75, 3, 1), (2, 3, 0.0, 1, 5),
])
def test_throttle_never_deadlocks_and_bounds_the_lag(size, threshold, ratio, streams, delay):
    history = simulate(size, threshold, ratio, num_streams=streams, weight_delay=delay)
    fresh_needed = -(-ratio * size // 1)
    for lags, metrics in history:
        assert len(lags) == size * streams
        assert max(lags) <= threshold
        assert sum(lag == 0 for lag in lags) >= fresh_needed * streams
        assert metrics[P + "max_lag"] == max(lags)
    if threshold == 0:  # synchronous: every trajectory comes from the current version, none wasted
        assert all(max(lags) == 0 and m[P + "dropped_trajectories"] == 0 for lags, m in history)


def test_drops_happen_and_training_goes_on():
    # wanting every trajectory fresh while the rollout runs a version ahead leaves stale leftovers
    history = simulate(size=2, threshold=1, ratio=1.0, weight_delay=2)
    assert sum(m[P + "dropped_trajectories"] for _, m in history) > 0
    assert len(history) == 40


def test_first_arrived_fills_the_batch_from_any_streams_in_arrival_order():
    store = RolloutStore(["fast", "slow"], VersionGate(1, 1, 0.0), batch_from="first_arrived")
    assert store.stream_to_wait_for(0) == RolloutStore.ANY_STREAM
    store.add("fast", "f0", 0)
    assert store.stream_to_wait_for(0) == RolloutStore.ANY_STREAM  # two a batch: one per stream's share
    store.add("fast", "f1", 0)
    assert store.take(0) == ["f0", "f1"] and store.acknowledged == {"fast": 2, "slow": 0}
    assert store.pop_metrics()[P + "fewest_from_one_stream"] == 0
    # older trajectories first, whichever stream they came from; the batch in arrival order
    store.add("fast", "f2", 1)
    store.add("slow", "s0", 0)
    store.add("fast", "f3", 1)
    assert store.take(1) == ["f2", "s0"]
    assert store.pop_metrics()[P + "trajectories_lag_1"] == 1
    # a trajectory left beyond the bound by the updates made meanwhile is dropped when it arrives
    store.add("slow", "s1", 0)
    store.add("fast", "f4", 2)
    assert store.take(2) == ["f3", "f4"] and store.acknowledged == {"fast": 5, "slow": 2}
    assert store.pop_metrics()[P + "dropped_trajectories"] == 1


def test_first_arrived_waits_for_the_fresh_share_of_every_stream():
    store = RolloutStore(["a", "b"], VersionGate(2, 1, 0.5), batch_from="first_arrived")  # 4 a batch, 2 fresh
    fill(store, "a", [4, 4, 5])
    store.add("b", "b0@v4", 4)
    assert store.stream_to_wait_for(5) == RolloutStore.ANY_STREAM and store.metrics.waited_for_fresh == 1
    store.add("b", "b1@v5", 5)
    assert store.take(5) == ["a:0@v4", "a:1@v4", "a:2@v5", "b1@v5"]
    with pytest.raises(ValueError, match="not one of"):
        RolloutStore(["a"], VersionGate(1, 1, 0.0), batch_from="fastest")


def simulate_speeds(batch_from, threshold, periods, rounds=600):
    """Env workers of different speeds (stream s finishes a trajectory ``periods[s]`` rounds after
    it began it) against the store; the rollout begins one whenever the throttle allows, and under
    every_stream only in step with the other streams (``RolloutWorker._may_act``). Updates are
    instant. Returns the updates' lags and the trajectories dropped."""
    gate = VersionGate(1, threshold, 0.0)
    streams = list(range(len(periods)))
    store = RolloutStore(streams, gate, batch_from=batch_from)
    started, finished = [0] * len(periods), [0] * len(periods)
    under_way = {}  # stream: (round it finishes, version it began with)
    version, lags, dropped = 0, [], 0
    for round_ in range(rounds):
        for s, (done_at, began) in list(under_way.items()):
            if done_at <= round_:
                store.add(s, began, began)
                finished[s] += 1
                del under_way[s]
        while store.stream_to_wait_for(version) is None:
            lags.append([version - v for v in store.take(version)])
            dropped += store.pop_metrics()[P + "dropped_trajectories"]
            version += 1
        for s in streams:
            in_step = batch_from == "first_arrived" or all(f >= started[s] for f in finished)
            if s not in under_way and in_step and gate.may_start(started[s], store.acknowledged[s]):
                under_way[s] = (round_ + periods[s], version)
                started[s] += 1
    return lags, dropped


@pytest.mark.parametrize("threshold", [1, 2])
def test_first_arrived_keeps_the_pace_of_the_fast_workers_within_the_bound(threshold):
    balanced, _ = simulate_speeds("first_arrived", threshold, [1, 1, 1, 1])
    every, _ = simulate_speeds("every_stream", threshold, [3, 1, 1, 1])
    first, dropped = simulate_speeds("first_arrived", threshold, [3, 1, 1, 1])
    # four streams, one 3x slower: its share waits for it (every_stream), or the others fill it
    assert len(every) <= 0.34 * len(balanced) + 1
    assert len(first) >= 0.74 * len(balanced)  # the work of 3 1/3 workers of 4
    assert all(len(batch) == 4 and max(batch) <= threshold for batch in first)
    # under bound 1 the slow worker's trajectories (3 rounds, ~2.4 updates) mostly arrive too late
    # and are dropped; under bound 2 every one trains
    assert (dropped > 0) == (threshold == 1)
    # a synchronous store waits for every stream's trajectory of the current version either way
    sync, _ = simulate_speeds("first_arrived", 0, [3, 1, 1, 1])
    assert len(sync) <= 0.34 * len(balanced) + 1
