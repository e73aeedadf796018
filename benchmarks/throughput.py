"""Where the time goes: one command measures, back to back on this machine,

1. ``raw_env``: the configured env processes stepping random actions (no policy, no messages),
   measured again just before each of the runs below (this machine's speed drifts); with
   ``--resume CHECKPOINT`` the actions of that trained policy instead, inferred in the env process
   (a policy that pushes the cube costs the simulator more than random actions: contacts, and
   episodes that end early and reset), and the graph's runs resume from it;
2. ``local_sync``: the single-file synchronous PPO baseline (``benchmarks/ppo_pushcube_sync.py``;
   PushCube state recipes only), no Ray;
3. ``ray_sync``: the recipe's graph with ``algorithm.staleness_threshold=0``;
4. ``ray_async``: the recipe as configured;
5. with ``--relayed``: the recipe with ``cluster.channel_transport=ray`` (every message through a
   channel actor, as before point-to-point links existed).

From them it computes the **compute-bound limit**: CPU seconds per env step of simulation (from
1), inference and training (from 3's own work, not its messaging), spread over the cores (per run,
with the raw measurement just before it: ``over_limit``); and the
**overlap bound**: how much faster than 3 a perfectly overlapped loop could be on these cores.
Per run: env steps/s in steady state (the first ``--warmup-updates`` updates left out), per
component busy / waiting / idle shares, CPU seconds per env step (work and whole process),
messages and bytes per env step, and the hypervisor's steal share while it ran.
``--to-success 0.9 --seeds 0 1 2`` adds, per seed, the env steps and training seconds until an
evaluation first reached 0.9, for the baseline and the recipe. Both are timed alike: evaluation
every ``--eval-every`` updates, 32 episodes, the same number from every sub-env, with the clock
stopped meanwhile (the recipe with ``runner.eval_pauses_training=true``; ``--eval-beside-training``
adds runs with its evaluations beside training, as it runs by default). Each recipe run leaves its
final checkpoint, which ``--resume`` can take.

    .venv/bin/python benchmarks/throughput.py                      # ~5-10 min on 2 cores
    .venv/bin/python benchmarks/throughput.py --to-success 0.9 --seeds 0 1 2 --skip raw_env local_sync ray_sync
    .venv/bin/python benchmarks/throughput.py --skip raw_env \
        --resume logs/<out>/recipe_seed0/checkpoints/global_step_<N>

Writes ``<out>/throughput.json`` and ``<out>/throughput.png`` (default ``logs/throughput-<time>``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from embodied_async.records import machine  # noqa: E402
from embodied_async.throughput import (  # noqa: E402  (after the repository is on the path)
    compose,
    cpu_times,
    measure_raw_env,
    num_cores,
    steal_share,
    summarize_run,
)

PHASES = ("raw_env", "local_sync", "ray_sync", "ray_async", "ray_async_relayed")
EVAL_EPISODES = 32  # per evaluation of --to-success, in both loops (benchmarks/parity.py: 128)


# ---- 2. the single-file baseline (1, the raw env rate, lives in embodied_async.throughput) --------
def run_baseline(args, seed: int, env_steps: Optional[int], target: Optional[float], log: str) -> Dict:
    script = os.path.join(REPO_ROOT, "benchmarks", "ppo_pushcube_sync.py")
    cmd = [sys.executable, script, "--seed", str(seed), "--json", log + ".json"]
    cmd += ["--target-success", str(target), "--env-steps", "400000", "--eval-every", str(args.eval_every),
            "--eval-episodes", str(EVAL_EPISODES)] if target else \
        ["--env-steps", str(env_steps), "--eval-every", "0"]
    with open(log + ".log", "w") as out:
        subprocess.run(cmd, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, check=True)
    with open(log + ".json") as f:
        return json.load(f)


def baseline_applies(config_name: str, overrides: list) -> bool:
    """The single-file baseline runs PushCube-v1 on state observations only."""
    env = compose(config_name, overrides)[0].env
    return env.task_name() == "PushCube-v1" and env.observes_states()


# ---- 3-5. the recipe's graph ---------------------------------------------------------------------
def run_recipe(config_name: str, overrides: list, log_path: str) -> List[Dict]:
    from embodied_async.launch import train

    return train(config_name, overrides, log_path)


def time_to_success(records: List[Dict], target: float) -> Optional[Dict]:
    """When the first evaluation at or above ``target`` was of a policy: the env steps and training
    seconds of the update that produced the evaluated version (``train_time_s``: paused
    evaluations left out, as the baseline's clock leaves its evaluations out)."""
    by_step = {r["step"]: r for r in records}
    for r in records:
        if r.get("eval/success_rate") is not None and r["eval/success_rate"] >= target:
            version = int(r["eval/version"])
            produced = by_step.get(version, r)
            return {"env_steps": produced["env_steps"], "train_s": round(produced["train_time_s"], 2),
                    "wall_s": round(produced["wall_time_s"], 2), "update": version,
                    "eval_success": r["eval/success_rate"]}
    return None


def time_recipe_to_success(args, seed: int, out_dir: str, eval_beside_training: bool) -> Optional[Dict]:
    """One run of the recipe until an evaluation reaches ``args.to_success``. By default its
    evaluations pause the graph and its clock, as the baseline's do; ``eval_beside_training``: they
    run beside training (the recipe's default), and their CPU is paid out of training's."""
    name = f"recipe_eval_beside_seed{seed}" if eval_beside_training else f"recipe_seed{seed}"
    overrides = [*args.overrides, f"runner.seed={seed}", "runner.max_steps=400",
                 f"runner.stop_at_eval_success={args.to_success}", f"runner.val_check_interval={args.eval_every}",
                 f"runner.eval_pauses_training={not eval_beside_training}", f"runner.eval_episodes={EVAL_EPISODES}",
                 "runner.eval_num_envs=8", "runner.save_interval=0",
                 "runner.logger.backends=[]"]
    return time_to_success(run_recipe(args.config, overrides, os.path.join(out_dir, name)), args.to_success)


def success_means(runs: Dict) -> Dict:
    """Mean env steps and training seconds to the target per loop, over the seeds that reached it."""
    means = {}
    for loop, by_seed in runs.items():
        if not isinstance(by_seed, dict) or loop == "means":
            continue
        reached = [r for r in by_seed.values() if r]
        if reached:
            means[loop] = {"seeds_reached": len(reached), "of_seeds": len(by_seed),
                           "env_steps": round(sum(r["env_steps"] for r in reached) / len(reached)),
                           "train_s": round(sum(r["train_s"] for r in reached) / len(reached), 2)}
    return means


# ---- report ----------------------------------------------------------------------------------------
def write_chart(report: Dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = report["phases"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [p for p in PHASES if p in phases]
    rates = [phases[p]["env_steps_per_s"] for p in names]
    left.bar(names, rates, color=["#999999", "#4c72b0", "#55a868", "#c44e52", "#8172b2"][:len(names)])
    limits = [(i, phases[p]["limit_env_steps_per_s"]) for i, p in enumerate(names)
              if "limit_env_steps_per_s" in phases[p]]
    if limits:  # each run's own limit (the raw env rate measured just before it)
        xs, ys = zip(*limits)
        left.scatter(xs, ys, marker="_", s=900, color="black", label="compute-bound limit at that time")
        left.scatter(xs, [0.9 * y for y in ys], marker="_", s=900, color="grey", label="0.9 x limit")
        left.legend(loc="lower right", fontsize=8)
    left.set_ylabel("env steps / s")
    left.set_title(f"{report['config']} on {report['machine']['cores']} cores")
    left.tick_params(axis="x", rotation=20)
    runs = [p for p in ("ray_sync", "ray_async", "ray_async_relayed") if p in phases]
    labels, bottoms = [], []
    for run in runs:
        for component in ("env", "rollout", "actor"):
            labels.append(f"{run.replace('ray_', '')}\n{component}")
            bottoms.append(phases[run]["shares"][component])
    x = range(len(labels))
    busy = [s["busy"] for s in bottoms]
    waiting = [s["waiting"] for s in bottoms]
    idle = [s["idle"] for s in bottoms]
    right.bar(x, busy, label="busy", color="#55a868")
    right.bar(x, waiting, bottom=busy, label="waiting", color="#dd8452")
    right.bar(x, idle, bottom=[b + w for b, w in zip(busy, waiting)], label="idle", color="#cccccc")
    right.set_xticks(list(x), labels, fontsize=7)
    right.set_ylabel("share of wall time (per worker)")
    right.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="maniskill_async_ppo_mlp")
    parser.add_argument("--env-steps", type=int, default=24_000, help="env steps of each throughput run")
    parser.add_argument("--raw-seconds", type=float, default=15.0, help="each raw env measurement")
    parser.add_argument("--warmup-updates", type=int, default=3)
    parser.add_argument("--relayed", action="store_true", help="also run with cluster.channel_transport=ray")
    parser.add_argument("--skip", nargs="*", default=[], choices=PHASES)
    parser.add_argument("--to-success", type=float, default=None, help="also time runs until eval >= this")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0])
    parser.add_argument("--eval-every", type=int, default=10, help="updates between evaluations (both loops)")
    parser.add_argument("--eval-beside-training", action="store_true",
                        help="also time the recipe with its evaluations beside training (its default)")
    parser.add_argument("--resume", default=None, metavar="CHECKPOINT",
                        help="a trained checkpoint of the recipe: the graph's runs resume from it and the raw env "
                             "steps with its policy's actions (steady state of a policy that pushes the cube; the "
                             "single-file baseline cannot resume it and is left out)")
    parser.add_argument("--out", default=None)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for the recipe")
    return parser.parse_args()


def run_overrides(args, cfg, report: Dict) -> List[str]:
    """What every timed run of the recipe adds: a fixed number of env steps, no evaluation or
    checkpoint; with ``--resume``, as many updates on from that checkpoint."""
    if not args.resume:
        return [f"runner.max_env_steps={args.env_steps}", "runner.max_steps=1000000", "runner.val_check_interval=0",
                "runner.save_interval=0", "runner.logger.backends=[]"]
    args.skip = [*args.skip, "local_sync"]
    from embodied_async.run_folder import read_runner_state

    resumed = read_runner_state(args.resume)
    per_update = cfg.env.num_envs * cfg.rollout.num_steps * cfg.algorithm.rollout_store_size_per_rank
    updates = -(-args.env_steps // per_update)
    report["resumed_from"] = {"checkpoint": args.resume, "step": resumed["step"], "env_steps": resumed["env_steps"]}
    return [f"runner.resume_dir={os.path.abspath(args.resume)}", f"runner.max_steps={resumed['step'] + updates}",
            "runner.val_check_interval=0", "runner.save_interval=0", "runner.logger.backends=[]"]


def measure_phases(args, common: List[str], out_dir: str, cores: int, workers: Dict[str, int]) -> tuple:
    """Each phase's run, a raw env measurement just before it; ``(phases, raw runs)``."""
    runs = {"ray_sync": ["algorithm.staleness_threshold=0"], "ray_async": [],
            "ray_async_relayed": ["cluster.channel_transport=ray"]}
    todo = [p for p in PHASES if p not in args.skip and (p != "ray_async_relayed" or args.relayed)]
    phases, raw_runs = {}, []
    for phase in todo:
        if phase == "local_sync" and not baseline_applies(args.config, args.overrides):
            print("[benchmark] local_sync skipped: the baseline runs PushCube-v1 state only", flush=True)
            continue
        # The machine's speed drifts (other tenants; seen 3x within an hour): every timed run gets
        # its own raw env measurement just before it, and its limit from that.
        print(f"[benchmark] raw_env before {phase} ...", flush=True)
        before = cpu_times()
        raw = measure_raw_env(args.config, args.overrides, args.raw_seconds, args.resume)
        raw["steal_share"] = steal_share(before, cpu_times())
        raw_runs.append(raw)
        if phase == "raw_env":
            phases[phase] = raw
            print(f"[benchmark] raw_env: {raw['env_steps_per_s']} env steps/s (steal {raw['steal_share']})", flush=True)
            continue
        print(f"[benchmark] {phase} ...", flush=True)
        before = cpu_times()
        if phase == "local_sync":
            result = run_baseline(args, 0, args.env_steps, None, os.path.join(out_dir, "local_sync"))
        else:
            records = run_recipe(args.config, [*args.overrides, *common, *runs[phase]], os.path.join(out_dir, phase))
            result = summarize_run(records, args.warmup_updates, cores, workers)
        result["steal_share"] = steal_share(before, cpu_times())
        result["raw_before"] = {k: raw[k] for k in ("env_steps_per_s", "sim_cpu_ms_per_env_step", "steal_share")}
        phases[phase] = result
        print(f"[benchmark] {phase}: {result['env_steps_per_s']} env steps/s (steal {result['steal_share']}; raw env "
              f"just before: {raw['env_steps_per_s']})", flush=True)
    return phases, raw_runs


def add_compute_bound(report: Dict, raw_runs: List[Dict], cores: int) -> None:
    """The rate the cores allow for the measured work (simulation, inference, training) and each
    run against it, and the bound of a perfectly overlapped synchronous run."""
    phases = report["phases"]
    if raw_runs and "ray_sync" in phases:
        work = phases["ray_sync"]["cpu_ms_per_env_step"]
        inference, training = work["rollout"]["work"], work["actor"]["work"]
        limit = lambda sim: round(1000 * cores / (sim + inference + training), 1)  # noqa: E731
        sims = [r["sim_cpu_ms_per_env_step"] for r in raw_runs]
        sim = sum(sims) / len(sims)
        report["compute_bound"] = {
            "sim_cpu_ms_per_env_step": round(sim, 3), "sim_cpu_ms_per_env_step_each_raw_run": sims,
            "inference_cpu_ms_per_env_step": inference, "training_cpu_ms_per_env_step": training,
            "total_cpu_ms_per_env_step": round(sim + inference + training, 3), "cores": cores,
            "limit_env_steps_per_s": limit(sim)}
        for phase, result in phases.items():
            if "raw_before" in result:  # against the limit of the moment it ran
                result["limit_env_steps_per_s"] = limit(result["raw_before"]["sim_cpu_ms_per_env_step"])
                result["over_limit"] = round(result["env_steps_per_s"] / result["limit_env_steps_per_s"], 3)
            if "cpu_ms_per_env_step" in result:
                # the same with the simulation's CPU as it was inside this run (under the policy's
                # actions and the other processes' cache traffic) instead of the raw rate's
                own = sum(c["work"] for c in result["cpu_ms_per_env_step"].values())
                result["limit_from_own_work_env_steps_per_s"] = round(1000 * cores / own, 1)
                result["over_limit_from_own_work"] = round(result["env_steps_per_s"] * own / (1000 * cores), 3)
    if "ray_sync" in phases:
        sync = phases["ray_sync"]
        busy_cpu_s = sum(c["process"] for c in sync["cpu_ms_per_env_step"].values()) * sync["env_steps"] / 1000
        # perfect overlap: collection and training side by side, unless the cores run out first
        overlapped = max(sync["collect_s"], sync["train_s"], busy_cpu_s / cores)
        report["overlap_bound"] = round(sync["wall_s"] / overlapped, 3)


def add_ratios(report: Dict) -> None:
    phases, ratios = report["phases"], report.setdefault("ratios", {})
    for phase in ("local_sync", "ray_sync", "ray_async", "ray_async_relayed"):
        if phase in phases and "over_limit" in phases[phase]:
            ratios[f"{phase}_over_limit"] = phases[phase]["over_limit"]
    if "ray_sync" in phases and "ray_async" in phases:
        speedup = phases["ray_async"]["env_steps_per_s"] / phases["ray_sync"]["env_steps_per_s"]
        ratios["async_over_sync"] = round(speedup, 3)
        if "overlap_bound" in report:
            ratios["async_over_sync_of_overlap_bound"] = round(speedup / report["overlap_bound"], 3)
    if "local_sync" in phases and "ray_async" in phases:
        ratios["async_over_local_sync"] = round(phases["ray_async"]["env_steps_per_s"]
                                                / phases["local_sync"]["env_steps_per_s"], 3)


def times_to_success(args, out_dir: str) -> Dict:
    """``--to-success``: per seed, the baseline's and the recipe's env steps and seconds to it."""
    found = {"target": args.to_success, "baseline": {}, "recipe": {}}
    for seed in args.seeds:
        if baseline_applies(args.config, args.overrides):
            print(f"[benchmark] baseline to {args.to_success}, seed {seed} ...", flush=True)
            result = run_baseline(args, seed, None, args.to_success, os.path.join(out_dir, f"baseline_seed{seed}"))
            found["baseline"][seed] = result["reached"]
            print(f"[benchmark] baseline seed {seed}: {result['reached']}", flush=True)
        print(f"[benchmark] recipe to {args.to_success}, seed {seed} ...", flush=True)
        found["recipe"][seed] = time_recipe_to_success(args, seed, out_dir, False)
        print(f"[benchmark] recipe seed {seed}: {found['recipe'][seed]}", flush=True)
        if args.eval_beside_training:
            beside = found.setdefault("recipe_eval_beside_training", {})
            beside[seed] = time_recipe_to_success(args, seed, out_dir, True)
            print(f"[benchmark] recipe (evaluation beside training) seed {seed}: {beside[seed]}", flush=True)
    found["means"] = success_means(found)
    return found


def main() -> None:
    args = parse_args()
    out_dir = args.out or os.path.join(REPO_ROOT, "logs", f"throughput-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out_dir, exist_ok=True)
    cfg, topology = compose(args.config, args.overrides)
    cores = num_cores()
    workers = {"env": topology.num_env_workers, "rollout": topology.num_rollout_workers,
               "actor": topology.actor_world_size}
    import ray
    import torch

    report: Dict = {"config": args.config, "overrides": args.overrides, "env_steps_per_run": args.env_steps,
                    "machine": {**machine(), "cores": cores, "torch": torch.__version__,
                                "ray": ray.__version__},
                    "placement": dict(cfg.cluster.component_placement), "workers": workers,
                    "pipeline_stages": topology.stages, "num_envs": cfg.env.num_envs}
    common = run_overrides(args, cfg, report)
    report["phases"], raw_runs = measure_phases(args, common, out_dir, cores, workers)
    add_compute_bound(report, raw_runs, cores)
    add_ratios(report)
    if args.to_success is not None:
        report["time_to_success"] = times_to_success(args, out_dir)
    with open(os.path.join(out_dir, "throughput.json"), "w") as f:
        json.dump(report, f, indent=1)
    if report["phases"]:
        write_chart(report, os.path.join(out_dir, "throughput.png"))
    print(json.dumps(report, indent=1))
    print(f"[benchmark] written to {out_dir}/throughput.json and throughput.png", flush=True)


if __name__ == "__main__":
    main()
