"""The async core in one process (fake envs, no simulator): termination semantics, the rollout
store's lag histogram and drops, the run's one observation normaliser, pickle-free checkpoints."""

import json
import os
import pickle
import time

import fake_envs  # noqa: F401  (registers the test envs)
import numpy as np
import pytest
import torch

from embodied_async.checkpoint_io import CheckpointError, load_tree, verify_checkpoint
from embodied_async.runner import Runner
from embodied_async.workers import actor_worker

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess

LOCAL = ["cluster.backend=local", "cluster.component_placement.env=0", "cluster.component_placement.rollout=0",
         "cluster.component_placement.actor=0", "runner.val_check_interval=0"]
# the point env that gives a NaN, an inf and a 1e30 now and then: these tests want its samples
# dropped (env.on_nonfinite=drop), not the run ended
FAULTY = ["env.name=faulty_point", "env.on_nonfinite=drop"]


def train_records(cfg):
    with open(os.path.join(cfg.runner.logger.log_path, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "train/actor/current_version" in r]


@pytest.mark.parametrize("terminal_on_success", [False, True])
def test_failure_is_terminal_success_follows_the_setting_time_limit_bootstraps(make_config, monkeypatch,
                                                                               terminal_on_success):
    seen = []
    original = actor_worker.compute_gae

    def spy(rewards, values, dones, next_values, bootstrap_values, *args):
        seen.append((dones.clone(), bootstrap_values.clone()))
        return original(rewards, values, dones, next_values, bootstrap_values, *args)

    monkeypatch.setattr(actor_worker, "compute_gae", spy)
    cfg = make_config(*LOCAL, "env.name=outcome_point", f"env.terminal_on_success={terminal_on_success}",
                      "runner.max_steps=2", "runner.save_interval=0")
    Runner(cfg).run()
    # sub-env i of the single stage: outcome OUTCOMES[i % 4]; every one ended at least once in 16 steps
    dones = torch.cat([d for d, _ in seen])
    bootstrapped = torch.cat([b for _, b in seen]) != 0
    for env_index, outcome in enumerate(fake_envs.OutcomeEnv.OUTCOMES):
        ends = dones[:, env_index]
        assert ends.any(), outcome
        flags = bootstrapped[:, env_index][ends]
        expected = {"fail": False, "timeout": True, "success": not terminal_on_success}[outcome]
        assert flags.tolist() == [expected] * len(flags), outcome
    assert not bootstrapped[~dones].any()  # only finished episodes bootstrap from a final observation


def test_rollout_store_lag_histogram_and_drops(make_config):
    """Two trajectories per update, all of them from the current version: the rollout's leftovers
    of the previous version go stale and are dropped, and training goes on."""
    cfg = make_config(*LOCAL, *FAULTY, "algorithm.rollout_store_size_per_rank=2",
                      "algorithm.on_policy_min_ratio=1.0", "algorithm.staleness_threshold=1",
                      "runner.max_steps=6", "runner.save_interval=0")
    assert Runner(cfg).run()["step"] == 6
    records = train_records(cfg)
    for r in records:
        assert r["train/rollout_store/trajectories_lag_0"] == 2.0  # the ratio demands both fresh
        assert r["train/rollout_store/trajectories_lag_1"] == 0.0
        assert r["train/rollout_store/max_lag"] == 0.0
        assert r["train/actor/num_samples"] > 4 * 8  # two trajectories' worth (less the dropped faults)
    assert sum(r["train/rollout_store/dropped_trajectories"] for r in records) > 0
    assert sum(r["train/rollout_store/waited_for_fresh"] for r in records) > 0


@pytest.mark.parametrize("staleness, ratio", [(0, 0.0), (1, 0.5), (2, 0.0)])
def test_store_sizes_train_without_deadlock_within_the_staleness_bound(make_config, staleness, ratio):
    cfg = make_config(*LOCAL, *FAULTY, "env.pipeline_stage_num=2",
                      "algorithm.rollout_store_size_per_rank=2", f"algorithm.on_policy_min_ratio={ratio}",
                      f"algorithm.staleness_threshold={staleness}", "runner.max_steps=4", "runner.save_interval=0")
    assert Runner(cfg).run()["step"] == 4
    for r in train_records(cfg):
        lags = [r[f"train/rollout_store/trajectories_lag_{k}"] for k in range(staleness + 1)]
        assert sum(lags) == 2 * 2  # two per stream, two streams (pipeline stages)
        assert lags[0] >= ratio * 4
        assert r["train/rollout_store/max_lag"] <= staleness
        assert r["train/actor/staleness"] <= staleness


@pytest.mark.parametrize("start, kl_band, moves", [
    (0, ("10.0", "20.0"), "up"),  # every KL reads under the band: raised to the maximum, no further
    # lagged updates read over the band (lag-0 ones, ~0 either side, may read under it and retry 1)
    (2, ("0.0", "1e-12"), "down"),
])
def test_the_kl_controlled_bound_moves_through_the_graph_within_its_range(make_config, start, kl_band, moves):
    """algorithm.staleness_control=kl through the real actor, store and rollout throttle: the logged
    bound moves as the controller says, one step at a time, the rollout follows it without a
    deadlock, every trained trajectory's lag is within the bound of the version that started it,
    and the checkpoint keeps the bound."""
    cfg = make_config(*LOCAL, "algorithm.staleness_control=kl", f"algorithm.staleness_threshold={start}",
                      "algorithm.staleness_max=2", f"algorithm.staleness_kl_low={kl_band[0]}",
                      f"algorithm.staleness_kl_high={kl_band[1]}", "algorithm.staleness_kl_patience=1",
                      "runner.max_steps=16", "runner.save_interval=16")
    assert Runner(cfg).run()["step"] == 16
    records = train_records(cfg)
    bounds = [r["train/staleness_threshold"] for r in records]  # record k: the bound of version k
    assert bounds[0] == start and set(bounds) == {0.0, 1.0, 2.0}
    assert all(abs(b - a) <= 1 for a, b in zip(bounds, bounds[1:]))  # one step at a time
    for version, record in enumerate(records):
        lag = int(record["train/rollout_store/max_lag"])
        assert lag <= bounds[version - lag] <= 2  # the throttle followed the bound it started under
    state = load_tree(os.path.join(cfg.runner.logger.log_path, "checkpoints", "global_step_16"), "actor_state")
    if moves == "up":
        assert bounds[-1] == 2 and state["staleness_threshold"] == 2
        assert max(r["train/rollout_store/max_lag"] for r in records) >= 1  # the rollout ran ahead
    else:
        first_zero = bounds.index(0.0)
        assert 1.0 in bounds[:first_zero]  # down through 1
        assert abs(state["staleness_threshold"] - bounds[-1]) <= 1  # the decision after the last update


@pytest.mark.parametrize("delay", [0.0, 0.1])
def test_a_slowed_env_worker_takes_the_delay_on_every_step(make_config, delay):
    """env.slow_workers / env.slow_worker_delay_s (drills and benchmarks of uneven env speed): every
    step of the named worker takes the delay longer, counted as env time; the point env alone
    steps in well under it."""
    slow = [f"env.slow_workers={[0] if delay else []}", f"env.slow_worker_delay_s={delay}"]
    cfg = make_config(*LOCAL, *FAULTY, *slow, "runner.max_steps=2", "runner.save_interval=0")
    assert Runner(cfg).run()["step"] == 2
    records = train_records(cfg)
    decisions = sum(r["env/env_steps"] for r in records) / cfg.env.num_envs
    env_seconds_per_step = sum(r["time/env"] for r in records) / decisions
    if delay:
        assert env_seconds_per_step >= delay
    else:
        assert env_seconds_per_step < 0.05


@pytest.mark.parametrize("batch_from", ["every_stream", "first_arrived"])
def test_first_arrived_batches_go_on_without_a_slow_env_worker_within_the_bound(make_config, batch_from):
    """Two env workers, worker 0 slowed far below worker 1: every_stream waits for its trajectory
    in every update; first_arrived fills its share from worker 1 (the batch as large, no lag over
    the bound, the slow worker's late ones trained or dropped)."""
    cfg = make_config(*LOCAL, *FAULTY, "cluster.component_placement.env=0-1", f"algorithm.batch_from={batch_from}",
                      "env.slow_workers=[0]", "env.slow_worker_delay_s=0.15", "algorithm.staleness_threshold=1",
                      "runner.max_steps=6", "runner.save_interval=0")
    assert Runner(cfg).run()["step"] == 6
    records = train_records(cfg)
    fewest = [r["train/rollout_store/fewest_from_one_stream"] for r in records]
    for r in records:
        assert r["train/rollout_store/trajectories_lag_0"] + r["train/rollout_store/trajectories_lag_1"] == 2
        assert r["train/rollout_store/max_lag"] <= 1
    if batch_from == "every_stream":
        assert fewest == [1.0] * 6
    else:
        assert fewest.count(0.0) >= 3  # worker 1 alone filled most batches


def test_one_normaliser_saved_without_pickle_and_absurd_values_dropped(make_config, monkeypatch):
    cfg = make_config(*LOCAL, *FAULTY, "runner.max_steps=3", "runner.save_interval=3")
    Runner(cfg).run()
    records = train_records(cfg)
    assert sum(r["env/nonfinite_dropped"] for r in records) == 4  # nan, inf, 1e30, nan

    checkpoint = os.path.join(cfg.runner.logger.log_path, "checkpoints", "global_step_3")

    def refuse(*args, **kwargs):
        raise AssertionError("a checkpoint file was unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    manifest = verify_checkpoint(checkpoint)
    assert {"model.safetensors", "optimizer.safetensors", "runner.json"} <= set(manifest["files"])
    for name in sorted(os.listdir(checkpoint)):
        path = os.path.join(checkpoint, name)
        if name.endswith(".safetensors"):
            from safetensors.torch import load_file

            load_file(path)
        else:
            assert name.endswith(".json"), f"{name} is neither safetensors nor JSON"
            with open(path) as f:
                json.load(f)

    # the statistics the rollout normalised with live in the deployable model file, learned from
    # the sane observations only (the 1e30 row was dropped before it could reach them)
    model = load_tree(checkpoint, "model")
    count, mean, var = model["normalizer.count"], model["normalizer.mean"], model["normalizer.var"]
    assert float(count) > 3 * 4 * 8 * 0.9
    assert mean.abs().max() < 10 and var.max() < 100


def test_tampered_checkpoint_is_refused_naming_the_file(make_config):
    cfg = make_config(*LOCAL, *FAULTY, "runner.max_steps=1", "runner.save_interval=1")
    Runner(cfg).run()
    checkpoint = os.path.join(cfg.runner.logger.log_path, "checkpoints", "global_step_1")
    path = os.path.join(checkpoint, "optimizer.safetensors")
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF
    open(path, "wb").write(bytes(data))
    resumed = make_config(*LOCAL, *FAULTY, f"runner.resume_dir={checkpoint}", "runner.max_steps=2")
    with pytest.raises(CheckpointError, match="optimizer.safetensors"):
        Runner(resumed).run()
    os.truncate(path, 10)
    with pytest.raises(CheckpointError, match="truncated"):
        Runner(resumed).run()


def test_resume_restores_the_normaliser_and_the_rollout_uses_it(make_config):
    cfg = make_config(*LOCAL, *FAULTY, "runner.max_steps=2", "runner.save_interval=2")
    Runner(cfg).run()
    checkpoint = os.path.join(cfg.runner.logger.log_path, "checkpoints", "global_step_2")
    saved = load_tree(checkpoint, "model")
    resumed_cfg = make_config(*LOCAL, *FAULTY, f"runner.resume_dir={checkpoint}",
                              "runner.max_steps=2")
    runner = Runner(resumed_cfg)
    runner._start()
    try:
        rollout = runner.graph.rollout.workers[0]
        deadline = time.monotonic() + 30
        while rollout.version < 0 and time.monotonic() < deadline:  # its loop loads the published weights
            time.sleep(0.05)
        assert rollout.version == 2
        for name in ("mean", "var", "count"):
            torch.testing.assert_close(getattr(rollout.policy.normalizer, name), saved[f"normalizer.{name}"])
    finally:
        runner._shutdown()


def test_a_batch_trains_on_the_statistics_the_rollout_acts_with_next(make_config, monkeypatch):
    """Synchronous PPO: the actor merges a batch's observation moments, trains on the batch
    normalised with the merged statistics, and publishes those, so the rollout acts with the very
    statistics the policy was trained under; no update sees un-normalised states."""
    from embodied_async.algorithms import ppo
    from models.mlp.modeling_mlp import MLPPolicy

    acted = []  # per rollout decision: (raw states [B, D], the normaliser's mean and var then)
    trained = []  # per update: the policy network's inputs over the whole batch, in row order
    predict, recompute = MLPPolicy.predict, ppo.recompute_logprobs

    def spy_predict(self, obs, mode="train"):
        if mode == "train":
            acted.append((np.asarray(obs["states"], np.float64), self.normalizer.mean.clone().numpy(),
                          self.normalizer.var.clone().numpy()))
        return predict(self, obs, mode)

    def spy_recompute(policy, batch, *args, **kwargs):
        seen = []
        hook = policy.actor.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].double()))
        try:
            return recompute(policy, batch, *args, **kwargs)
        finally:
            hook.remove()
            trained.append(torch.cat(seen).detach().numpy())

    monkeypatch.setattr(MLPPolicy, "predict", spy_predict)
    monkeypatch.setattr(ppo, "recompute_logprobs", spy_recompute)
    cfg = make_config(*LOCAL, "env.name=scaled_point", "algorithm.staleness_threshold=0",
                      "rollout.recompute_logprobs=true", "runner.max_steps=3", "runner.save_interval=0")
    Runner(cfg).run()
    steps = cfg.rollout.num_steps  # decisions per batch: one env worker, one stage
    assert len(trained) == 3 and len(acted) >= 3 * steps
    for k in range(2):  # batches 0 and 1 are followed by a whole rollout of the next version
        raw = np.concatenate([states for states, _, _ in acted[k * steps:(k + 1) * steps]])  # [T * B, D], t-major
        following = acted[(k + 1) * steps:(k + 2) * steps]
        _, mean, var = following[0]
        for _, other_mean, other_var in following:  # one version's statistics for the whole rollout
            np.testing.assert_array_equal(other_mean, mean)
            np.testing.assert_array_equal(other_var, var)
        assert np.abs(mean).min() > 5, "the states' mean (about 10) is in the statistics trained with"
        expected = np.clip((raw - mean) / np.sqrt(var + 1e-8), -10, 10)
        np.testing.assert_allclose(trained[k], expected, atol=1e-5)


def test_rollout_predict_never_moves_the_statistics():
    from embodied_async.contracts import EnvSpec
    from embodied_async.normalization import merge_observation_moments, pop_observation_moments
    from models.mlp.configuration_mlp import MLPConfig
    from models.mlp.modeling_mlp import MLPPolicy

    policy = MLPPolicy(MLPConfig(hidden_sizes=[8]), EnvSpec(obs_shapes={"states": (3,)},
                                                            obs_dtypes={"states": "float32"}, action_dim=2))
    before = policy.normalizer.mean.clone()
    rng = np.random.default_rng(0)
    first, second = rng.normal(5.0, 2.0, (64, 3)), rng.normal(-1.0, 0.5, (32, 3))
    policy.predict({"states": first.astype(np.float32)}, mode="train")
    policy.predict({"states": np.array([[1e30, 0, 0]], np.float32)}, mode="train")  # ignored row
    policy.predict({"states": second.astype(np.float32)}, mode="train")
    policy.predict({"states": first.astype(np.float32)}, mode="eval")  # eval observes nothing
    assert torch.equal(policy.normalizer.mean, before)
    moments = pop_observation_moments(policy)
    assert pop_observation_moments(policy) == {}
    merge_observation_moments(policy, moments)
    both = np.concatenate([first, second]).astype(np.float32).astype(np.float64)
    count = float(policy.normalizer.count)
    assert count == pytest.approx(96 + 1e-4)
    np.testing.assert_allclose(policy.normalizer.mean.numpy(), both.mean(0) * 96 / count, rtol=1e-6)
    np.testing.assert_allclose(policy.normalizer.var.numpy(), both.var(0), rtol=1e-3)


def test_a_resumed_run_anchors_on_the_weights_it_began_with_not_on_its_checkpoints(make_config):
    """algorithm.anchor_kl_coef's reference is the policy as built and loaded at the run's start
    (model.init_from, else the seeded build): a resumed run takes the same reference again, while
    its policy holds the checkpoint's weights."""
    anchored = [*LOCAL, *FAULTY, "algorithm.anchor_kl_coef=0.5"]
    cfg = make_config(*anchored, "runner.max_steps=2", "runner.save_interval=2")
    Runner(cfg).run()
    assert all(r["train/actor/anchor_kl"] >= 0 for r in train_records(cfg))
    checkpoint = os.path.join(cfg.runner.logger.log_path, "checkpoints", "global_step_2")
    saved = load_tree(checkpoint, "model")

    def started_actor(*overrides):
        runner = Runner(make_config(*anchored, *overrides))
        runner._start()
        actor = runner.graph.actor.workers[0]
        return runner, {n: t.clone() for n, t in actor._warm_start.items()}, \
            {n: p.detach().clone() for n, p in actor.policy.named_parameters()}

    runner, fresh_anchor, _ = started_actor("runner.max_steps=3")
    runner._shutdown()
    runner, resumed_anchor, resumed_weights = started_actor(f"runner.resume_dir={checkpoint}", "runner.max_steps=3")
    runner._shutdown()
    assert fresh_anchor.keys() == resumed_anchor.keys() and fresh_anchor
    moved = [n for n in resumed_anchor if not torch.equal(resumed_anchor[n], saved[n])]
    assert moved  # two updates moved the policy away from its start
    for name, value in resumed_anchor.items():
        torch.testing.assert_close(value, fresh_anchor[name], rtol=0, atol=0)
        torch.testing.assert_close(resumed_weights[name], saved[name], rtol=0, atol=0)
