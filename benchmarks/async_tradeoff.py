"""The async trade-off of one workload, measured: throughput, lag (behaviour KL) and learning.

For a recipe (and a starting checkpoint: ``--init-from``) it runs, back to back and interleaved
per seed, the synchronous graph (``sync``: ``algorithm.staleness_threshold=0``), async at fixed
bounds (``1``, ``2``, ``4``, ...) and the KL-driven bound (``kl``: ``algorithm.staleness_control=kl``).
A setting with ``:slow`` runs with env worker 0 ``--slow-factor`` times slower than the raw env
rate measured at the start of its seed (``env.slow_workers``, ``env.slow_worker_delay_s``): the case
the synchronous barrier handles worst. Every run trains ``--updates`` updates with an evaluation
every ``--eval-every`` (``--eval-episodes`` episodes, the graph and its clock paused meanwhile, so
training seconds compare).

Per run: env steps/s and decisions/s in steady state, each component's busy / waiting / idle
share and CPU per env step (``embodied_async.throughput.summarize_run``), the trained trajectories' lag
histogram, the behaviour KL and behaviour-clip fraction (means over updates), the staleness bound
(mean and last), and the evaluations against training seconds and env steps. Per setting over the
seeds: the throughput over sync's (paired bootstrap 95 %), over the compute-bound limit (the raw
env's simulation CPU, sync's inference and training CPU, over the cores), the success at a fixed
training-time budget (the shortest run's) and at a fixed env-step budget, and the training time
to sync's final success (per seed) over sync's.

    .venv/bin/python benchmarks/async_tradeoff.py --config maniskill_async_ppo_mlp \\
        --settings sync 1 2 kl sync:slow 1:slow --seeds 0 1 2 --updates 60

Writes ``<out>/tradeoff.json`` and ``<out>/tradeoff.png`` (default ``logs/tradeoff-<time>``). Each
finished run is kept (``<out>/<setting>_seed<k>.json``): the same command with the same ``--out``
does only what is missing, so Ctrl-C or a crash loses at most the run in flight.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from embodied_async.launch import train  # noqa: E402  (after the repository is on the path)
from embodied_async.records import machine  # noqa: E402
from embodied_async.seed_statistics import bootstrap_mean, ratio_of_means  # noqa: E402
from embodied_async.throughput import (  # noqa: E402
    compose,
    cpu_times,
    measure_raw_env,
    num_cores,
    steal_share,
    summarize_run,
)

SETTING_HELP = "sync, a fixed bound N, or kl; a :slow suffix slows env worker 0 (e.g. sync:slow 1:slow)"


def setting_overrides(setting: str, slow_delay_s: float) -> List[str]:
    """The overrides of one setting (``SETTING_HELP``)."""
    bound, _, slow = setting.partition(":")
    if slow not in ("", "slow"):
        raise SystemExit(f"setting {setting!r}: the only suffix is :slow ({SETTING_HELP})")
    if bound == "sync":
        out = ["algorithm.staleness_threshold=0"]
    elif bound == "kl":
        out = ["algorithm.staleness_control=kl", "algorithm.staleness_threshold=1"]
    elif bound.isdigit():
        out = [f"algorithm.staleness_threshold={int(bound)}"]
    else:
        raise SystemExit(f"setting {setting!r} is not one of: {SETTING_HELP}")
    if slow:
        out += ["env.slow_workers=[0]", f"env.slow_worker_delay_s={slow_delay_s:.4f}"]
    return out


def slow_delay(raw: Dict, envs_per_stage: int, factor: float) -> float:
    """Seconds to add to each step of one env worker so that it runs ``factor`` times slower than
    the raw rate: one step of a stage is ``envs_per_stage`` sub-env steps at one process's rate."""
    per_process_rate = raw["env_steps_per_s"] / raw["processes"]
    return (factor - 1.0) * envs_per_stage / per_process_rate


def run_figures(records: List[Dict], warmup: int, cores: int, workers: Dict[str, int], chunks: int) -> Dict:
    """One run's figures: the steady-state summary, the lag, the behaviour KL, the evaluations."""
    # rates over training time: the paused evaluations' seconds are not the graph's
    train = [{**r, "wall_time_s": r["train_time_s"]} for r in records if "train/actor/current_version" in r]
    out = summarize_run(train, warmup, cores, workers)
    out["decisions_per_s"] = round(out["env_steps_per_s"] / chunks, 1)
    lags = sorted({int(k.rsplit("_", 1)[1]) for r in train for k in r if k.startswith("train/rollout_store/"
                                                                                       "trajectories_lag_")})
    out["lag_histogram"] = {lag: int(sum(r.get(f"train/rollout_store/trajectories_lag_{lag}", 0) for r in train))
                            for lag in lags}
    mean = lambda key: round(sum(r.get(key) or 0.0 for r in train) / len(train), 5)  # noqa: E731
    out["behaviour_kl"] = mean("train/actor/behav_approx_kl")
    out["behaviour_clip_fraction"] = mean("train/actor/behav_clip_fraction")
    out["mean_lag"] = mean("train/actor/staleness")
    out["staleness_bound"] = {"mean": mean("train/staleness_threshold"),
                              "last": train[-1].get("train/staleness_threshold")}
    by_step = {r["step"]: r for r in train}
    out["evaluations"] = []
    for r in records:
        if r.get("eval/success_rate") is None:
            continue
        produced = by_step.get(int(r["eval/version"]), r)  # the update that made the evaluated version
        out["evaluations"].append({"update": int(r["eval/version"]), "success": r["eval/success_rate"],
                                   "train_s": round(produced["train_time_s"], 2), "env_steps": produced["env_steps"]})
    return out


def success_at(evaluations: List[Dict], key: str, budget: float) -> Optional[float]:
    """The last evaluation of a version made within ``budget`` of ``key`` (train_s or env_steps)."""
    within = [e["success"] for e in evaluations if e[key] <= budget]
    return within[-1] if within else None


def time_to(evaluations: List[Dict], target: float) -> Optional[float]:
    """Training seconds until the first evaluated version at or above ``target``."""
    return next((e["train_s"] for e in evaluations if e["success"] >= target), None)


def summarize_settings(runs: Dict[str, Dict[int, Dict]], limit: Optional[float]) -> Dict:
    """Per setting over the seeds: throughput (against sync's and the limit), success at the
    budgets, time to sync's final success."""
    seeds = sorted(next(iter(runs.values())))
    every = [run for by_seed in runs.values() for run in by_seed.values()]
    time_budget = min(run["evaluations"][-1]["train_s"] for run in every)
    step_budget = min(run["evaluations"][-1]["env_steps"] for run in every)
    sync = runs.get("sync")
    out = {"train_s_budget": time_budget, "env_steps_budget": step_budget}
    for setting, by_seed in runs.items():
        rates = [by_seed[s]["env_steps_per_s"] for s in seeds]
        row = {"env_steps_per_s": bootstrap_mean(rates),
               "behaviour_kl": bootstrap_mean([by_seed[s]["behaviour_kl"] for s in seeds]),
               "mean_lag": bootstrap_mean([by_seed[s]["mean_lag"] for s in seeds]),
               # our processes' CPU over the cores' time: near 1, the machine is saturated, and a rate
               # below the compute-bound limit is overhead outside the measured work (serialising, IPC,
               # the renderer's threads), not waiting
               "cpu_share": bootstrap_mean([by_seed[s]["our_processes_cpu_share"] for s in seeds]),
               "success_at_train_s_budget": [success_at(by_seed[s]["evaluations"], "train_s", time_budget)
                                             for s in seeds],
               "success_at_env_steps_budget": [success_at(by_seed[s]["evaluations"], "env_steps", step_budget)
                                               for s in seeds]}
        if limit:
            row["over_limit"] = round(row["env_steps_per_s"]["mean"] / limit, 3)
        if sync and setting != "sync":
            row["throughput_over_sync"] = ratio_of_means(rates, [sync[s]["env_steps_per_s"] for s in seeds])
            targets = {s: sync[s]["evaluations"][-1]["success"] for s in seeds}
            times = [(time_to(by_seed[s]["evaluations"], targets[s]), time_to(sync[s]["evaluations"], targets[s]))
                     for s in seeds]
            row["time_to_sync_final_success"] = [t for t, _ in times]
            paired = [(t, b) for t, b in times if t is not None and b is not None]
            if len(paired) == len(seeds):
                row["time_to_sync_final_over_sync"] = ratio_of_means(*zip(*paired))
        out[setting] = row
    return out


def write_chart(report: Dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, runs = report["summary"], report["runs"]
    settings = list(runs)
    fig, (rate_ax, kl_ax, learn_ax) = plt.subplots(1, 3, figsize=(16, 4.5))
    rates = [summary[s]["env_steps_per_s"] for s in settings]
    rate_ax.bar(settings, [r["mean"] for r in rates],
                yerr=[[r["mean"] - r["ci95"][0] for r in rates], [r["ci95"][1] - r["mean"] for r in rates]],
                color="#55a868", capsize=4)
    if report.get("compute_bound"):
        limit = report["compute_bound"]["limit_env_steps_per_s"]
        rate_ax.axhline(limit, color="black", label="compute-bound limit")
        rate_ax.axhline(0.9 * limit, color="grey", linestyle="--", label="0.9 x limit")
        rate_ax.legend(fontsize=8)
    rate_ax.set_ylabel("env steps / s")
    rate_ax.set_title("throughput")
    rate_ax.tick_params(axis="x", rotation=20)
    kl_ax.bar(settings, [summary[s]["behaviour_kl"]["mean"] for s in settings], color="#dd8452")
    for i, s in enumerate(settings):
        kl_ax.annotate(f"lag {summary[s]['mean_lag']['mean']:.2f}", (i, summary[s]["behaviour_kl"]["mean"]),
                       ha="center", va="bottom", fontsize=8)
    for level in (0.01, 0.03):
        kl_ax.axhline(level, color="grey", linestyle=":")
    kl_ax.set_ylabel("behaviour KL (mean over updates)")
    kl_ax.set_title("lag")
    kl_ax.tick_params(axis="x", rotation=20)
    for setting in settings:
        for seed, run in runs[setting].items():
            xs = [e["train_s"] for e in run["evaluations"]]
            learn_ax.plot(xs, [e["success"] for e in run["evaluations"]], alpha=0.7,
                          color=f"C{settings.index(setting)}", label=setting if seed == min(runs[setting]) else None)
    learn_ax.axvline(summary["train_s_budget"], color="grey", linestyle="--", label="time budget")
    learn_ax.set_xlabel("training seconds (evaluations paused)")
    learn_ax.set_ylabel("evaluation success")
    learn_ax.set_title("learning")
    learn_ax.legend(fontsize=8)
    fig.suptitle(f"{report['config']} on {report['machine']['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="maniskill_async_ppo_mlp")
    parser.add_argument("--settings", nargs="+", default=["sync", "1", "2", "4", "kl"], help=SETTING_HELP)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--updates", type=int, default=60, help="updates per run")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-episodes", type=int, default=32)
    parser.add_argument("--warmup-updates", type=int, default=3, help="left out of the steady-state rates")
    parser.add_argument("--slow-factor", type=float, default=3.0, help="how much slower a :slow setting's worker 0 is")
    parser.add_argument("--raw-seconds", type=float, default=15.0)
    parser.add_argument("--init-from", default=None, metavar="CHECKPOINT", help="model.init_from of every run")
    parser.add_argument("--out", default=None)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for the recipe")
    args = parser.parse_args()
    for setting in args.settings:
        setting_overrides(setting, 0.0)  # refuse a bad setting before anything runs
    if args.eval_every <= 0 or args.updates < args.eval_every:
        raise SystemExit("--eval-every must be > 0 and at most --updates: learning is read from the evaluations")
    return args


def run_settings(args, report: Dict, overrides: List[str], out_dir: str, cfg, topology, cores: int) -> None:
    """Per seed a raw env measurement, then every setting's run (those an earlier call kept are read back)."""
    common = [f"runner.max_steps={args.updates}", f"runner.val_check_interval={args.eval_every}",
              "runner.eval_pauses_training=true", f"runner.eval_episodes={args.eval_episodes}",
              "runner.save_interval=0", "runner.logger.backends=[]"]
    for seed in args.seeds:
        before = cpu_times()
        raw = measure_raw_env(args.config, overrides, args.raw_seconds)
        raw["steal_share"] = steal_share(before, cpu_times())
        report["raw_env"][seed] = raw
        delay = slow_delay(raw, topology.envs_per_stage, args.slow_factor)
        print(f"[tradeoff] seed {seed}: raw env {raw['env_steps_per_s']} env steps/s; a slowed worker waits "
              f"{delay * 1000:.1f} ms per step", flush=True)
        for setting in args.settings:
            log = os.path.join(out_dir, f"{setting.replace(':', '_')}_seed{seed}")
            if os.path.exists(log + ".json"):  # finished in an earlier call with this --out
                with open(log + ".json") as f:
                    report["runs"][setting][seed] = json.load(f)
                continue
            print(f"[tradeoff] {setting}, seed {seed} ...", flush=True)
            run_overrides = [*overrides, *common, f"runner.seed={seed}", *setting_overrides(setting, delay)]
            records = train(args.config, run_overrides, log)
            run = run_figures(records, args.warmup_updates, cores, report["workers"], cfg.env.num_action_chunks)
            report["runs"][setting][seed] = run
            with open(log + ".json", "w") as f:
                json.dump(run, f, indent=1)
            print(f"[tradeoff] {setting}, seed {seed}: {run['env_steps_per_s']} env steps/s, behaviour KL "
                  f"{run['behaviour_kl']}, lag {run['mean_lag']}, last evaluation "
                  f"{run['evaluations'][-1]['success'] if run['evaluations'] else None}", flush=True)


def main() -> None:
    args = parse_args()

    out_dir = args.out or os.path.join(REPO_ROOT, "logs", f"tradeoff-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out_dir, exist_ok=True)
    overrides = list(args.overrides)
    if args.init_from:
        overrides.append(f"model.init_from={os.path.abspath(args.init_from)}")
    cfg, topology = compose(args.config, overrides)
    cores = num_cores()
    workers = {"env": topology.num_env_workers, "rollout": topology.num_rollout_workers,
               "actor": topology.actor_world_size}
    report: Dict = {"config": args.config, "overrides": overrides, "settings": args.settings, "seeds": args.seeds,
                    "updates": args.updates, "slow_factor": args.slow_factor,
                    "machine": {**machine(), "cores": cores},
                    "workers": workers, "raw_env": {}, "runs": {s: {} for s in args.settings}}
    run_settings(args, report, overrides, out_dir, cfg, topology, cores)
    if "sync" in report["runs"]:
        sims = [r["sim_cpu_ms_per_env_step"] for r in report["raw_env"].values()]
        syncs = list(report["runs"]["sync"].values())
        inference = sum(r["cpu_ms_per_env_step"]["rollout"]["work"] for r in syncs) / len(syncs)
        training = sum(r["cpu_ms_per_env_step"]["actor"]["work"] for r in syncs) / len(syncs)
        total = sum(sims) / len(sims) + inference + training
        report["compute_bound"] = {"sim_cpu_ms_per_env_step": round(sum(sims) / len(sims), 3),
                                   "inference_cpu_ms_per_env_step": round(inference, 3),
                                   "training_cpu_ms_per_env_step": round(training, 3), "cores": cores,
                                   "limit_env_steps_per_s": round(1000 * cores / total, 1)}
    limit = report.get("compute_bound", {}).get("limit_env_steps_per_s")
    report["summary"] = summarize_settings(report["runs"], limit)
    with open(os.path.join(out_dir, "tradeoff.json"), "w") as f:
        json.dump(report, f, indent=1)
    write_chart(report, os.path.join(out_dir, "tradeoff.png"))
    print(json.dumps(report["summary"], indent=1))
    print(f"[tradeoff] written to {out_dir}/tradeoff.json and tradeoff.png", flush=True)


if __name__ == "__main__":
    sys.exit(main())
