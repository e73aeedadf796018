"""algorithm.staleness_control=kl: the staleness bound that follows the measured behaviour KL,
alone and in closed loop with the rollout throttle and the store, against a synthetic workload
whose behaviour KL grows with the trained data's lag."""

import itertools
import math

import pytest

from embodied_async.algorithms.rollout_store import RolloutStore
from embodied_async.algorithms.version_gate import StalenessController, VersionGate
from embodied_async.checkpoint_io import load_tree, save_tree


def controller(threshold=1, minimum=0, maximum=4, low=0.01, high=0.03, patience=2):
    return StalenessController(threshold, minimum, maximum, low, high, patience)


def test_raised_after_patience_under_the_band_held_inside_lowered_after_patience_over():
    c = controller(threshold=1)
    assert [c.observe(0.001) for _ in range(3)] == [1, 2, 2]  # two in a row under 0.01: raised once
    assert c.observe(0.02) == 2 and c.observe(0.005) == 2  # the band resets the count under it
    assert [c.observe(0.02) for _ in range(10)] == [2] * 10  # inside the band: held
    assert [c.observe(0.05) for _ in range(2)] == [2, 1]  # two in a row over 0.03: lowered
    assert c.observe(0.05) == 1  # after a change it waits the patience again
    assert c.observe(0.05) == 0
    assert [c.observe(0.05) for _ in range(5)] == [0] * 5  # never below the minimum


def test_the_bound_never_leaves_its_range_and_ignores_missing_measurements():
    c = controller(threshold=3, minimum=1, maximum=3, patience=1)
    assert [c.observe(0.0) for _ in range(5)] == [3] * 5  # at the maximum already
    assert c.observe(None) == 3 and c.observe(math.nan) == 3 and c.observe(math.inf) == 3
    assert [c.observe(1.0) for _ in range(5)] == [2, 1, 1, 1, 1]


def test_a_bound_that_had_to_be_lowered_is_retried_after_ever_longer_waits():
    c = controller(threshold=1, patience=2)
    c.observe(0.05), c.observe(0.05)  # lowered from 1
    assert c.threshold == 0 and c.raise_patience() == 4
    assert [c.observe(0.0) for _ in range(4)] == [0, 0, 0, 1]
    c.observe(0.05), c.observe(0.05)  # lowered from 1 again
    assert c.raise_patience() == 8
    for _ in range(10):
        c.lowered_from[1] += 1
    assert c.raise_patience() == 2 * StalenessController.MAX_BACKOFF  # capped


def test_the_state_survives_a_checkpoint(tmp_path):
    c = controller(threshold=2, patience=3)
    for kl in (0.05, 0.05, 0.05, 0.0, 0.0):  # lowered from 2, then two updates under the band
        c.observe(kl)
    save_tree(c.state(), str(tmp_path), "actor_state")
    resumed = controller(threshold=0, patience=3)
    resumed.restore(load_tree(str(tmp_path), "actor_state"))
    assert (resumed.threshold, resumed.below, resumed.above, resumed.lowered_from) == (1, 2, 0, {2: 1})
    assert resumed.observe(0.0) == c.observe(0.0)
    fixed_run = controller(threshold=3)
    fixed_run.restore({"version": 7})  # a checkpoint of a fixed-bound run: the configured start
    assert fixed_run.threshold == 3


def test_the_gate_follows_the_bound_within_the_queues_it_was_sized_for():
    gate = VersionGate(size_per_stream=2, staleness_threshold=1, on_policy_min_ratio=0.0, max_threshold=3)
    assert (gate.capacity, gate.max_capacity) == (4, 8)
    raised = gate.with_threshold(3)
    assert raised.capacity == raised.max_capacity == 8 and raised.accepts(10, 7) and not gate.accepts(10, 7)
    with pytest.raises(ValueError, match="outside"):
        gate.with_threshold(4)
    fixed = VersionGate(2, 1, 0.0)
    assert fixed.max_capacity == fixed.capacity == 4


def closed_loop(kl_per_lag, start, maximum=4, updates=80, weight_delay=1, patience=2):
    """The rollout throttle, the store and the controller, round by round (as
    ``test_rollout_store.simulate``): the rollout is faster than the actor, so it runs as far ahead
    as the bound it last received allows; each update's behaviour KL is ``kl_per_lag`` x the mean
    lag of its batch. Returns per update (bound in force, lags trained on, the bounds those
    trajectories were started under, measured KL)."""
    ctl = controller(threshold=start, maximum=maximum, patience=patience)
    gate = VersionGate(1, start, 0.0, maximum)
    store = RolloutStore([0], gate)
    known = {"version": 0, "acks": 0, "bound": start}
    published = {0: start}  # the actor's bound per version it published (ActorWorker.bound_of_version)
    started, in_transit, version, history = 0, [], 0, []
    for round_ in itertools.count():
        assert round_ < 10_000, "no progress"
        for message in [m for m in in_transit if m[0] <= round_]:
            known = message[1]
        in_transit = [m for m in in_transit if m[0] > round_]
        if store.stream_to_wait_for(version) is None:
            lags = [version - v for v in store.take(version)]
            store.pop_metrics()
            kl = kl_per_lag * sum(lags) / len(lags)
            bound = store.gate.staleness_threshold
            started_under = [published[version - lag] for lag in lags]
            history.append((bound, lags, started_under, kl))
            settled = all(b == bound for b in started_under)
            store.gate = store.gate.with_threshold(ctl.observe(kl, settled))
            version += 1
            published[version] = store.gate.staleness_threshold
            sent = {"version": version, "acks": store.acknowledged[0], "bound": store.gate.staleness_threshold}
            in_transit.append((round_ + weight_delay, sent))
            if len(history) == updates:
                return history
        throttle = gate.with_threshold(known["bound"])  # the rollout's copy of the gate
        while throttle.may_start(started, known["acks"]):  # as many as the throttle lets it
            store.add(0, known["version"], known["version"], published[known["version"]])
            started += 1


@pytest.mark.parametrize("kl_per_lag, start, settles_at", [
    (0.012, 0, 1),  # lag 1 reads 0.012, inside the band: raised from 0 to it, held
    (0.012, 4, 2),  # from above: 0.048, 0.036 over the band, lowered until lag 2's 0.024
    (0.004, 0, 3),  # lag 3 reads 0.012
    (0.001, 0, 4),  # never over 0.01: up to the maximum, no further
])
def test_the_closed_loop_settles_where_the_kl_enters_the_band(kl_per_lag, start, settles_at):
    history = closed_loop(kl_per_lag, start)
    for _, lags, started_under, _ in history:  # never a lag over its own bound, nor over the maximum
        assert all(lag <= bound <= 4 for lag, bound in zip(lags, started_under))
    late = history[-30:]
    assert {bound for bound, _, _, _ in late} == {settles_at}
    if settles_at < 4:
        assert all(0.01 <= kl <= 0.03 for _, _, _, kl in late)


def test_where_no_bound_reads_inside_the_band_the_loop_dwells_ever_longer_at_the_lower_one():
    history = closed_loop(0.05, start=2, updates=120)  # lag 0 reads 0.0, lag 1 already 0.05
    bounds = [bound for bound, _, _, _ in history]
    assert max(bounds[10:]) <= 1
    runs = "".join(map(str, bounds)).split("1")
    dwells_at_zero = [len(run) for run in runs[:-1] if run]  # the last one may be cut short
    assert len(dwells_at_zero) >= 3 and dwells_at_zero == sorted(dwells_at_zero)
    assert dwells_at_zero[2] >= 2 * dwells_at_zero[0]  # each retry of lag 1 comes later
    assert sum(b == 0 for b in bounds[60:]) >= 0.8 * len(bounds[60:])
