"""The benchmark scripts' own arithmetic: what they time and how they score an evaluation."""

import importlib.util
import os
import sys

import numpy as np
import pytest
from conftest import REPO_ROOT


def load_script(*path):
    spec = importlib.util.spec_from_file_location(path[-1][:-3], os.path.join(REPO_ROOT, *path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class ShortSuccessEnvs:
    """Sub-env 0 succeeds every 2 steps; the others fail at a 10-step time limit."""

    num_envs = 4

    def __init__(self):
        self.t = 0

    def reset(self, seed):
        self.t = 0
        return np.zeros((self.num_envs, 3), np.float32)

    def step(self, actions):
        self.t += 1
        terminated = np.array([self.t % 2 == 0, False, False, False])
        truncated = np.array([False] + [self.t % 10 == 0] * 3)
        success = terminated.copy()
        obs = np.zeros((self.num_envs, 3), np.float32)
        return obs, np.zeros(self.num_envs, np.float32), terminated, truncated, success, obs


def test_the_baseline_scores_the_same_number_of_episodes_from_every_sub_env():
    """The first 8 episodes to finish would be sub-env 0's 5 quick successes and 3 failures (0.625);
    two from each sub-env are 2 successes in 8 (0.25)."""
    baseline = load_script("benchmarks", "ppo_pushcube_sync.py")
    agent, norm = baseline.Agent(3, 2), baseline.RunningMeanStd(3)
    assert baseline.evaluate(agent, norm, ShortSuccessEnvs(), episodes=8, seed=0) == (0.25, 8)
    # at target 0.9, 40 episodes allow 4 failures: the second complete round holds 2 x 3 = 6
    assert baseline.evaluate(agent, norm, ShortSuccessEnvs(), episodes=40, seed=0, stop_below=0.9) == (0.25, 8)
    assert baseline.evaluate(agent, norm, ShortSuccessEnvs(), episodes=40, seed=0, stop_below=0.2) == (0.25, 40)


def test_the_baseline_evaluates_each_version_on_the_graphs_episodes():
    """Evaluation k of the baseline and of the graph face the same episodes (same seed per version),
    fresh ones for every version."""
    from embodied_async.evaluation import evaluation_seed

    baseline = load_script("benchmarks", "ppo_pushcube_sync.py")
    for run_seed in (0, 3):
        seeds = [baseline.evaluation_seed(run_seed, version) for version in range(0, 400, 5)]
        assert seeds == [evaluation_seed(run_seed, version) for version in range(0, 400, 5)]
        assert min(b - a for a, b in zip(seeds, seeds[1:])) > 8  # no episode seed shared between evaluations


def test_time_to_success_reads_the_update_that_made_the_evaluated_version():
    bench = load_script("benchmarks", "throughput.py")
    records = [{"step": 1, "env_steps": 800, "wall_time_s": 2.0, "train_time_s": 2.0},
               {"step": 2, "env_steps": 1600, "wall_time_s": 5.0, "train_time_s": 4.0, "eval/success_rate": 0.5,
                "eval/version": 2.0},
               {"step": 3, "env_steps": 2400, "wall_time_s": 8.0, "train_time_s": 6.0},
               {"step": 4, "env_steps": 3200, "wall_time_s": 11.0, "train_time_s": 8.0, "eval/success_rate": 0.95,
                "eval/version": 3.0}]
    reached = bench.time_to_success(records, 0.9)
    assert reached == {"env_steps": 2400, "train_s": 6.0, "wall_s": 8.0, "update": 3, "eval_success": 0.95}
    assert bench.time_to_success(records, 0.99) is None
    means = bench.success_means({"target": 0.9, "baseline": {0: {"env_steps": 100, "train_s": 1.0}, 1: None,
                                                              2: {"env_steps": 300, "train_s": 3.0}}})
    assert means == {"baseline": {"seeds_reached": 2, "of_seeds": 3, "env_steps": 200, "train_s": 2.0}}


def test_parity_reads_first_passages_and_pairs_seeds_in_its_ratio():
    parity = load_script("benchmarks", "parity.py")
    records = [{"step": 5, "env_steps": 4000, "train_time_s": 10.0},
               {"step": 6, "env_steps": 4800, "train_time_s": 12.0, "eval/success_rate": 0.5, "eval/version": 5.0},
               {"step": 10, "env_steps": 8000, "train_time_s": 20.0},
               {"step": 11, "env_steps": 8800, "train_time_s": 22.0, "eval/success_rate": 0.92, "eval/version": 10.0}]
    curve = parity.recipe_curve(records)  # each evaluation at the update that made its version
    assert [(p["env_steps"], p["train_s"], p["success"]) for p in curve] == [(4000, 10.0, 0.5), (8000, 20.0, 0.92)]
    assert parity.first_passage(curve, 0.9) == {"env_steps": 8000, "train_s": 20.0}
    assert parity.first_passage(curve, 0.95) is None
    never = {"reached": None, "curve": curve}
    assert parity.to_success(never, "env_steps") == 8000  # censored: its last reading, a lower bound

    grid = [0, 3999, 4000, 7000, 8000, 20000]
    np.testing.assert_array_equal(parity.held_curve(never, np.array(grid, float), "env_steps"),
                                  [0, 0, 0.5, 0.5, 0.92, 0.92])

    # paired: seed k of the arm goes with seed k of the baseline in every resample
    ratio = parity.ratio_of_means([20, 40, 60], [10, 20, 30])
    assert ratio == {"ratio": 2.0, "low": 2.0, "high": 2.0}
    spread = parity.ratio_of_means([10, 40, 30, 25], [20, 20, 20, 20])
    assert spread["low"] < spread["ratio"] == 1.312 < spread["high"]


def test_the_rl_phase_benchmark_rates_the_steady_updates_and_the_trained_decisions(tmp_path):
    """env steps/s from the updates after the warm-up ones (their wall clock only), training ms per
    trained decision; and the miniature's bootstrap of the mean gain over RL seeds."""
    import json

    bench = load_script("benchmarks", "rl_phase.py")
    log = tmp_path / "run"
    (log / ".hydra").mkdir(parents=True)
    (log / ".hydra" / "config.yaml").write_text("env: {num_action_chunks: 1}\nalgorithm: {update_epochs: 2}\n")
    with open(log / "metrics.jsonl", "w") as f:
        for step in range(1, 7):  # 640 env steps an update; the first two take 10 s each, the rest 4 s
            wall = 10.0 * min(step, 2) + 4.0 * max(0, step - 2)
            f.write(json.dumps({"step": step, "train/actor/current_version": step - 1.0, "wall_time_s": wall,
                                "env/env_steps": 640.0, "train/actor/num_samples": 320.0,
                                "time/actor_training": 1.6, "time/rollout": 2.0, "time/env": 3.0}) + "\n")
    result = bench.measure(str(log), warmup=2)
    assert result["env_steps_per_s"] == 160.0 and result["updates"] == 4  # 4 x 640 steps in 16 s
    assert result["training_ms_per_decision"] == 5.0  # 6 x 1.6 s over 6 x 320 trained decisions
    from embodied_async.seed_statistics import bootstrap_mean  # the miniature record's (records.summary_record)

    gain = bootstrap_mean([0.16, 0.10, 0.22])
    assert gain["mean"] == 0.16 and gain["n"] == 3
    assert 0.10 <= gain["ci95"][0] < 0.16 < gain["ci95"][1] <= 0.22


def test_the_default_recipe_guard_reads_the_stop_and_pairs_codes_by_seed():
    """The run's figures at the record whose evaluation first reached 0.9 (where it stopped); a run
    that never did gives its last record as a lower bound; ratios pair this code's seed k with the
    reference's seed k."""
    guard = load_script("benchmarks", "default_recipe.py")
    records = [{"step": 1, "env_steps": 800, "train_time_s": 2.0, "train/actor/epochs": 8.0},
               {"step": 2, "env_steps": 1600, "train_time_s": 4.0, "train/actor/epochs": 6.0,
                "eval/success_rate": 0.5},
               {"step": 3, "env_steps": 2400, "train_time_s": 5.0, "train/actor/epochs": 7.0,
                "eval/success_rate": 0.94},
               {"step": 4, "env_steps": 3200, "train_time_s": 9.0, "train/actor/epochs": 1.0}]
    assert guard.run_summary(records) == {"reached": True, "env_steps": 2400, "train_s": 5.0, "updates": 3,
                                          "env_steps_per_s": 480.0, "epochs_per_update": 7.0, "eval_success": 0.94}
    never = guard.run_summary(records[:2])
    assert never["reached"] is False and never["env_steps"] == 1600 and never["updates"] == 2

    def run(steps, seconds):
        return {"env_steps": steps, "train_s": seconds, "env_steps_per_s": steps / seconds, "updates": steps // 800,
                "epochs_per_update": 7.0, "reached": True}
    runs = {"this": {1: run(40000, 80.0), 2: run(64000, 100.0)},
            "abc": {1: run(40000, 100.0), 2: run(48000, 100.0), 3: run(8000, 10.0)}}
    ratios = guard.compare(runs, [1, 2, 3])["abc"]
    assert ratios["seeds"] == [1, 2]  # seed 3 only ran on the reference
    assert ratios["env_steps"]["ratio"] == 1.182 and ratios["train_s"]["ratio"] == 0.9
    assert ratios["env_steps"]["low"] <= 1.0 < ratios["env_steps"]["high"]
    stored = {"references": {"old": {"env_steps": {"1": 20000, "2": 32000, "4": 1}}}}
    assert guard.against_stored(runs["this"], stored) == {
        "old": {"seeds": [1, 2], "env_steps": {"ratio": 2.0, "low": 2.0, "high": 2.0}}}
    assert guard.code_means(runs["abc"], [1, 2])["env_steps"] == 44000


def test_the_default_recipe_guard_compares_learning_figures_and_not_clocks():
    """The deterministic graph's records of two codes: clocks, traffic and the counts taken when the
    runner asks may differ; a learning figure that differs names its first update; a figure only
    one code writes is new, not a difference."""
    guard = load_script("benchmarks", "default_recipe.py")

    def record(step, loss, **extra):
        return {"step": step, "train/actor/policy_loss": loss, "env/episode_return": 2.0 * step,
                "time/env": 0.5 * step, "env_steps": 800 * step, "train/rollout_store/held_trajectories": 0.0,
                **extra}
    ours = [record(1, -0.05), record(2, -0.06, **{"eval/success_rate": 0.25}), record(3, -0.07)]
    theirs = [record(1, -0.05, **{"time/env": 9.0, "env_steps": 801}), record(2, -0.06, **{"eval/success_rate": 0.25}),
              record(3, -0.07)]
    for r in ours:
        r["train/actor/new_figure"] = 1.0
    assert guard.first_difference(ours, theirs) is None
    theirs[1]["eval/success_rate"] = 0.5
    theirs[2]["train/actor/policy_loss"] = -0.08
    assert guard.first_difference(ours, theirs) == {"update": 2, "figures": ["eval/success_rate"],
                                                    "values": {"eval/success_rate": [0.25, 0.5]}}
    assert guard.first_difference(ours, ours[:2])["update"] == 3  # a run that stopped early


def _tradeoff_records(rate_s_per_update, successes, kl, lag1):
    """A run's metrics.jsonl records: 640 env steps an update, an evaluation every 2 updates that
    pauses the graph for 5 s (wall time goes on, training time does not)."""
    records = []
    for step in range(1, 2 * len(successes) + 1):
        records.append({"step": step, "train/actor/current_version": step - 1.0, "env/env_steps": 640.0,
                        "env_steps": 640.0 * step, "wall_time_s": rate_s_per_update * step + 5.0 * (step // 2),
                        "train_time_s": rate_s_per_update * step, "train/actor/behav_approx_kl": kl,
                        "train/actor/behav_clip_fraction": 0.0, "train/actor/staleness": lag1 / 2,
                        "train/staleness_threshold": 1.0, "train/rollout_store/trajectories_lag_0": 2.0 - lag1,
                        "train/rollout_store/trajectories_lag_1": float(lag1), "time/actor_training": 1.0})
        if step % 2 == 0:
            records.append({"step": step, "eval/success_rate": successes[step // 2 - 1], "eval/version": step})
    return records


def test_the_async_tradeoff_benchmark_reads_throughput_lag_and_learning_per_setting():
    bench = load_script("benchmarks", "async_tradeoff.py")
    assert bench.setting_overrides("sync", 0.0) == ["algorithm.staleness_threshold=0"]
    assert bench.setting_overrides("2", 0.0) == ["algorithm.staleness_threshold=2"]
    assert "algorithm.staleness_control=kl" in bench.setting_overrides("kl", 0.0)
    assert bench.setting_overrides("1:slow", 0.08)[-2:] == ["env.slow_workers=[0]", "env.slow_worker_delay_s=0.0800"]
    for bad in ("async", "1:fast"):
        with pytest.raises(SystemExit, match=bad):
            bench.setting_overrides(bad, 0.0)
    # two processes at 400 sub-env steps/s together: a stage of 8 sub-envs steps in 0.04 s; 3x slower: +0.08 s
    assert abs(bench.slow_delay({"env_steps_per_s": 400.0, "processes": 2}, 8, 3.0) - 0.08) < 1e-12

    workers = {"env": 1, "rollout": 1, "actor": 1}
    runs = {"sync": {}, "1": {}}
    for seed in (0, 1):  # async: twice the rate, a lagged trajectory in every update, the same learning per update
        runs["sync"][seed] = bench.run_figures(_tradeoff_records(4.0, [0.2, 0.5, 0.6], 0.0, 0), 1, 2, workers, 1)
        runs["1"][seed] = bench.run_figures(_tradeoff_records(2.0, [0.2, 0.5, 0.6], 0.02, 1), 1, 2, workers, 1)
    run = runs["1"][0]
    assert run["env_steps_per_s"] == 320.0 and run["lag_histogram"] == {0: 6, 1: 6}  # over training time
    assert run["behaviour_kl"] == 0.02 and run["mean_lag"] == 0.5
    assert run["evaluations"][1] == {"update": 4, "success": 0.5, "train_s": 8.0, "env_steps": 2560.0}
    summary = bench.summarize_settings(runs, limit=400.0)
    assert summary["train_s_budget"] == 12.0 and summary["env_steps_budget"] == 3840.0
    assert summary["1"]["throughput_over_sync"]["ratio"] == 2.0 and summary["1"]["over_limit"] == 0.8
    assert summary["1"]["success_at_train_s_budget"] == [0.6, 0.6]  # sync got to 0.2 in 12 s
    assert summary["sync"]["success_at_train_s_budget"] == [0.2, 0.2]
    assert summary["1"]["success_at_env_steps_budget"] == summary["sync"]["success_at_env_steps_budget"] == [0.6, 0.6]
    assert summary["1"]["time_to_sync_final_over_sync"]["ratio"] == 0.5  # 12 s against 24 s


def _sample(t_s, **rss):
    return {"t_s": t_s, "step": int(t_s), "rss_mb": rss, "total_rss_mb": sum(rss.values()),
            "ray_actor_processes": 3, "queues": {"actions_qsize": 0.0}}


def test_the_soak_reads_a_memory_trend_not_the_swing_of_one_sample():
    soak = load_script("benchmarks", "soak.py")
    samples = [_sample(0.0, actor=500.0, leaky=100.0)]  # warm-up: left out
    for i in range(40):  # the actor swings +-5 % with its batches, the other grows 0.5 % a sample
        samples.append(_sample(60.0 + i, actor=800.0 + (40.0 if i % 2 else -40.0), leaky=200.0 * 1.005 ** i))
    summary = soak.summarise(samples, warmup_s=60.0)
    actor, leaky = summary["rss_growth_per_process"]["actor"], summary["rss_growth_per_process"]["leaky"]
    assert actor["growth_pct"] == pytest.approx(100 * (840 / 760 - 1), abs=0.01)  # first against last: the swing
    assert abs(actor["trend_pct"]) < 0.5
    assert leaky["trend_pct"] > 10 and summary["max_process_trend_pct"] == leaky["trend_pct"]


def test_the_soak_counts_heals_against_faults_and_refuses_unknown_kinds():
    soak = load_script("benchmarks", "soak.py")
    records = [{"step": s, "env/success_rate": 0.1 if s <= 4 else 0.9} for s in range(1, 17)]
    records.insert(5, {"step": 5, "heal/fault": "env[0] died", "heal/replaced": "env[0]", "heal/lost_decisions": 3.0,
                       "heal/gap_s": 4.2})
    records.insert(9, {"step": 8, "heal/fault": "actor[0] died", "heal/restarts": 1.0, "heal/lost_steps": 2.0,
                       "heal/gap_s": 9.0})
    healing = soak.healing_summary(records, faults=[{"kind": "env-kill"}, {"kind": "env-stop"}])
    assert healing["heal_records"] == 2 and healing["replaced_in_place"] == 1 and healing["restarts"] == 1
    assert healing["lost_decisions"] == 3.0 and healing["lost_steps"] == 2.0 and healing["max_gap_s"] == 9.0
    assert healing["success_first_quarter"] == 0.1 and healing["success_last_quarter"] == 0.9
    with pytest.raises(SystemExit):
        soak.parse(["--faults", "env-kill,disk-full"])


def test_a_soak_fault_signals_a_process_of_the_runs_session_only(tmp_path):
    import random
    import subprocess
    import time

    soak = load_script("benchmarks", "soak.py")
    # stands for a family's simulator child: its command line names the module the fault looks for
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "embodied_async.isolated.server"],
                             start_new_session=True)
    try:
        fault = soak.inject_fault(child.pid, "child-kill", random.Random(0), time.monotonic())
        assert fault["pid"] == child.pid and fault["kind"] == "child-kill"
        assert child.wait(10) == -9
        assert soak.inject_fault(child.pid, "child-kill", random.Random(0), time.monotonic()) is None  # none left
    finally:
        child.kill()
