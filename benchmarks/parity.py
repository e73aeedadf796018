"""PPO parity with the single-file baseline, with statistics. Per seed, back to back on this machine:

1. ``baseline``: ``benchmarks/ppo_pushcube_sync.py`` (no Ray, no framework);
2. ``sync``: the recipe's graph with ``algorithm.staleness_threshold=0``;
3. ``async``: the recipe as configured;

each until an evaluation first reaches ``--target`` (or ``--max-env-steps``). Every arm evaluates
alike: ``--eval-episodes`` deterministic episodes (the same number from each of 8 sub-envs) every
``--eval-every`` updates, fresh episodes each time, and the same episodes for the same seed and
evaluation index in every arm (``embodied_async.evaluation.evaluation_seed``); the clocks leave
evaluation out (the graph with ``runner.eval_pauses_training=true``). An evaluation ends as soon as
its failures rule the target out (``runner.eval_stop_once_below_target``; the baseline alike): the
first passage is the one the whole evaluations would give, the curves' points below the target rest
on the complete rounds scored (``--full-evaluations`` scores every episode). Seeds are paired: seed ``k``
of every arm runs before seed ``k + 1`` of any, so the machine's drift falls on all arms alike.

Reported per arm: env steps and training seconds to the target per seed, their means, and the
ratio of means against the baseline with a paired bootstrap 95 % interval (seeds resampled); a run
that never reached the target counts with its last reading as a lower bound (``censored``). The
learning curves (mean success over seeds with a bootstrap 95 % band; a seed that reached the target
holds its last reading) against env steps and training seconds go to a PNG.

Each finished run is kept (``<out>/runs/<arm>_seed<k>.json``): the same command with the same
``--out`` does only what is missing, so Ctrl-C or a crash loses at most the run in flight.

    .venv/bin/python benchmarks/parity.py --seeds 0 1 2 3 4 5 6 7 --out logs/parity   # ~1.5-2 h on 2 cores
    .venv/bin/python benchmarks/parity.py --out logs/parity --throughput --record benchmarks

``--throughput`` adds the steady-state rate of the async recipe on a trained policy against the
compute-bound limit (``benchmarks/throughput.py --resume`` on the first async run's final
checkpoint). ``--record DIR`` copies the JSON and PNG to ``DIR/<date>-parity.{json,png}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from embodied_async.seed_statistics import ratio_of_means  # noqa: E402

ARMS = ("baseline", "sync", "async")
ARM_OVERRIDES = {"sync": ["algorithm.staleness_threshold=0"], "async": []}
COLOURS = {"baseline": "#4c72b0", "sync": "#55a868", "async": "#c44e52"}


# ---- one run per arm ---------------------------------------------------------------------------------
def run_baseline(args, seed: int, log: str) -> Dict:
    script = os.path.join(REPO_ROOT, "benchmarks", "ppo_pushcube_sync.py")
    cmd = [sys.executable, script, "--seed", str(seed), "--json", log + ".json", "--target-success", str(args.target),
           "--env-steps", str(args.max_env_steps), "--eval-every", str(args.eval_every),
           "--eval-episodes", str(args.eval_episodes)]
    cmd += [] if args.full_evaluations else ["--eval-stop-once-below-target"]
    with open(log + ".log", "w") as out:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"the baseline failed (exit {proc.returncode}); its output: {log}.log")
    with open(log + ".json") as f:
        summary = json.load(f)
    curve = [{"version": r["update"], "env_steps": r["env_steps"], "train_s": r["train_s"],
              "success": r["eval_success"], "episodes": r["eval_episodes"]} for r in summary["curve"]]
    return {"reached": summary["reached"] and {"env_steps": summary["reached"]["env_steps"],
                                                "train_s": summary["reached"]["train_s"]},
            "curve": curve, "env_steps_per_s": summary["env_steps_per_s"]}


def recipe_curve(records: List[Dict]) -> List[Dict]:
    """Each evaluation's success against the env steps and training seconds (evaluations left
    out) of the update that produced the evaluated version."""
    by_step = {r["step"]: r for r in records if "step" in r}
    curve = []
    for r in records:
        if r.get("eval/success_rate") is None:
            continue
        version = int(r["eval/version"])
        produced = by_step.get(version, r)
        curve.append({"version": version, "env_steps": int(produced["env_steps"]),
                      "train_s": round(float(produced["train_time_s"]), 2), "success": float(r["eval/success_rate"]),
                      "episodes": int(r.get("eval/episodes", 0))})
    return curve


def first_passage(curve: List[Dict], target: float) -> Optional[Dict]:
    for point in curve:
        if point["success"] >= target:
            return {"env_steps": point["env_steps"], "train_s": point["train_s"]}
    return None


def run_recipe_arm(args, arm: str, seed: int, log_path: str) -> Dict:
    from embodied_async.launch import train

    per_update = args.env_steps_per_update
    overrides = [*args.overrides, *ARM_OVERRIDES[arm], f"runner.seed={seed}",
                 f"runner.max_steps={-(-args.max_env_steps // per_update)}",
                 f"runner.stop_at_eval_success={args.target}", f"runner.val_check_interval={args.eval_every}",
                 "runner.eval_pauses_training=true", f"runner.eval_episodes={args.eval_episodes}",
                 "runner.eval_num_envs=8", f"runner.eval_stop_once_below_target={not args.full_evaluations}",
                 f"runner.save_interval={0 if arm != 'async' else 1000000}",
                 "runner.logger.backends=[]"]
    records = train(args.config, overrides, log_path)
    curve = recipe_curve(records)
    trained = [r for r in records if "train_time_s" in r]
    last = trained[-1]
    return {"reached": first_passage(curve, args.target), "curve": curve,
            "env_steps_per_s": round(last["env_steps"] / max(last["train_time_s"], 1e-9), 1),
            "log_path": log_path}


# ---- statistics ------------------------------------------------------------------------------------------
def to_success(run: Dict, key: str) -> float:
    """Env steps or training seconds to the target; a run that never got there: its last reading."""
    if run["reached"] is not None:
        return float(run["reached"][key])
    return float(run["curve"][-1][key]) if run["curve"] else float("nan")


def held_curve(run: Dict, grid: np.ndarray, key: str) -> np.ndarray:
    """Success at each grid point: the last evaluation at or before it (0 before the first); a run
    that stopped at the target holds its last reading."""
    xs = np.array([p[key] for p in run["curve"]], float)
    ys = np.array([p["success"] for p in run["curve"]], float)
    at = np.searchsorted(xs, grid, side="right") - 1
    return np.where(at >= 0, ys[np.clip(at, 0, None)] if ys.size else 0.0, 0.0)


def band(curves: np.ndarray, resamples: int = 2000, seed: int = 0) -> tuple:
    """Mean over seeds (rows) and a bootstrap 95 % interval of it at each column."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, curves.shape[0], size=(resamples, curves.shape[0]))
    means = curves[index].mean(1)
    return curves.mean(0), np.percentile(means, 2.5, axis=0), np.percentile(means, 97.5, axis=0)


def summarize(runs: Dict[str, Dict[int, Dict]], seeds: Sequence[int]) -> Dict:
    out: Dict = {"per_arm": {}, "ratios": {}}
    for arm, by_seed in runs.items():
        done = [s for s in seeds if s in by_seed]
        if not done:
            continue
        steps = [to_success(by_seed[s], "env_steps") for s in done]
        times = [to_success(by_seed[s], "train_s") for s in done]
        out["per_arm"][arm] = {
            "seeds": done, "env_steps": steps, "train_s": times,
            "censored": [s for s in done if by_seed[s]["reached"] is None],
            "mean_env_steps": round(float(np.mean(steps))), "mean_train_s": round(float(np.mean(times)), 2),
            "env_steps_per_s": round(float(np.mean([by_seed[s]["env_steps_per_s"] for s in done])), 1)}
    if "baseline" in runs:
        for arm in runs:
            if arm == "baseline":
                continue
            paired = [s for s in seeds if s in runs[arm] and s in runs["baseline"]]
            if not paired:
                continue
            ratios = {}
            for key in ("env_steps", "train_s"):
                ratios[key] = ratio_of_means([to_success(runs[arm][s], key) for s in paired],
                                             [to_success(runs["baseline"][s], key) for s in paired])
            ratios["seeds"] = paired
            out["ratios"][f"{arm}_over_baseline"] = ratios
    return out


# ---- chart -----------------------------------------------------------------------------------------------
def write_chart(runs: Dict[str, Dict[int, Dict]], summary: Dict, target: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], "env_steps", "env steps"), (axes[1], "train_s", "training seconds")):
        end = max((p[key] for by_seed in runs.values() for run in by_seed.values() for p in run["curve"]), default=1)
        grid = np.linspace(0, end, 200)
        for arm, by_seed in runs.items():
            if not by_seed:
                continue
            curves = np.stack([held_curve(run, grid, key) for run in by_seed.values()])
            mean, low, high = band(curves)
            ax.plot(grid, mean, color=COLOURS.get(arm), label=f"{arm} ({len(by_seed)} seeds)")
            ax.fill_between(grid, low, high, color=COLOURS.get(arm), alpha=0.2)
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(label)
        ax.set_ylim(0, 1)
        ax.set_ylabel("eval success (mean over seeds, 95 % band)")
        ax.legend(loc="lower right", fontsize=8)
    ratios = summary.get("ratios", {})
    title = "; ".join(f"{name.split('_')[0]}/baseline: steps {r['env_steps']['ratio']} "
                      f"[{r['env_steps']['low']}, {r['env_steps']['high']}], time {r['train_s']['ratio']} "
                      f"[{r['train_s']['low']}, {r['train_s']['high']}]" for name, r in ratios.items())
    fig.suptitle(title or "parity", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- main ------------------------------------------------------------------------------------------------
def load_runs(out_dir: str, arms: Sequence[str]) -> Dict[str, Dict[int, Dict]]:
    runs: Dict[str, Dict[int, Dict]] = {arm: {} for arm in arms}
    folder = os.path.join(out_dir, "runs")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        arm, _, seed = name[:-len(".json")].rpartition("_seed")
        if name.endswith(".json") and arm in runs:
            with open(os.path.join(folder, name)) as f:
                runs[arm][int(seed)] = json.load(f)
    return runs


def measure_throughput(args, runs: Dict, out_dir: str) -> Optional[Dict]:
    trained = [run for _, run in sorted(runs.get("async", {}).items()) if run.get("log_path")]
    from embodied_async.run_folder import checkpoints_root, latest_checkpoint

    newest = (latest_checkpoint(checkpoints_root(run["log_path"])) for run in trained)
    checkpoints = [path for path in newest if path]
    if not checkpoints:
        print("[parity] --throughput: no async run left a checkpoint", flush=True)
        return None
    folder = os.path.join(out_dir, "throughput")
    cmd = [sys.executable, os.path.join(REPO_ROOT, "benchmarks", "throughput.py"), "--config", args.config,
           "--skip", "raw_env", "--resume", checkpoints[0], "--out", folder, *args.overrides]
    print(f"[parity] throughput on the trained policy {checkpoints[0]} ...", flush=True)
    with open(folder + ".log", "w") as log:
        subprocess.run(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    with open(os.path.join(folder, "throughput.json")) as f:
        report = json.load(f)
    phases = report["phases"]
    return {"checkpoint": checkpoints[0], "compute_bound": report.get("compute_bound"),
            **{f"{phase}_env_steps_per_s": phases[phase]["env_steps_per_s"] for phase in phases},
            **{f"{phase}_over_limit": phases[phase].get("over_limit") for phase in phases},
            "async_over_sync": report.get("ratios", {}).get("async_over_sync")}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="maniskill_async_ppo_mlp")
    parser.add_argument("--seeds", type=int, nargs="*", default=list(range(8)))
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=ARMS)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--eval-every", type=int, default=5, help="updates between evaluations (every arm)")
    parser.add_argument("--eval-episodes", type=int, default=128)
    parser.add_argument("--full-evaluations", action="store_true",
                        help="score every evaluation's episodes in full (by default an evaluation ends once its "
                             "failures rule the target out: the passage is the same, the curves' early points "
                             "rest on fewer episodes)")
    parser.add_argument("--max-env-steps", type=int, default=200_000,
                        help="a run stops here if it never reached --target")
    parser.add_argument("--throughput", action="store_true", help="also measure the async recipe on a trained policy")
    parser.add_argument("--out", default=None)
    parser.add_argument("--record", default=None, metavar="DIR", help="copy the JSON and PNG to DIR/<date>-parity.*")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for the recipe (both graph arms)")
    return parser, parser.parse_args()


def run_arms(args, out_dir: str) -> Dict:
    """Every arm on every seed, one after the other, skipping the runs an earlier call kept."""
    runs = load_runs(out_dir, args.arms)
    for seed in args.seeds:
        for arm in args.arms:
            if seed in runs[arm]:
                continue
            print(f"[parity] {arm}, seed {seed} ...", flush=True)
            started = time.time()
            log = os.path.join(out_dir, f"{arm}_seed{seed}")
            run = run_baseline(args, seed, log) if arm == "baseline" else run_recipe_arm(args, arm, seed, log)
            run["wall_s"] = round(time.time() - started, 1)
            path = os.path.join(out_dir, "runs", f"{arm}_seed{seed}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(run, f, indent=1)
            os.replace(path + ".tmp", path)  # a run is kept whole or not at all
            runs[arm][seed] = run
            print(f"[parity] {arm}, seed {seed}: {run['reached'] or 'not reached'} "
                  f"(last eval {run['curve'][-1]['success'] if run['curve'] else None}, {run['wall_s']} s wall)",
                  flush=True)
    return runs


def main() -> None:
    parser, args = parse_args()
    from embodied_async.config.recipes import resolve_recipe

    cfg, _ = resolve_recipe(args.config, args.overrides)
    # the single-file baseline runs PushCube-v1 on state observations only
    if "baseline" in args.arms and not (cfg.env.task_name() == "PushCube-v1" and cfg.env.observes_states()):
        parser.error("the baseline runs PushCube-v1 state only: pick such a recipe or leave the baseline out (--arms)")
    if args.eval_episodes % 8:
        parser.error("--eval-episodes must split evenly over the 8 evaluation sub-envs")
    args.env_steps_per_update = cfg.env.num_envs * cfg.rollout.num_steps * cfg.algorithm.rollout_store_size_per_rank
    out_dir = args.out or os.path.join(REPO_ROOT, "logs", f"parity-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(os.path.join(out_dir, "runs"), exist_ok=True)
    runs = run_arms(args, out_dir)
    summary = summarize(runs, args.seeds)
    report = {"config": args.config, "overrides": args.overrides, "target": args.target, "eval_every": args.eval_every,
              "eval_episodes": args.eval_episodes, "full_evaluations": args.full_evaluations,
              "max_env_steps": args.max_env_steps, "seeds": args.seeds, **summary,
              "runs": {arm: {str(s): r for s, r in sorted(by_seed.items())} for arm, by_seed in runs.items()}}
    if args.throughput:
        report["throughput"] = measure_throughput(args, runs, out_dir)
    with open(os.path.join(out_dir, "parity.json"), "w") as f:
        json.dump(report, f, indent=1)
    write_chart(runs, summary, args.target, os.path.join(out_dir, "parity.png"))
    print(json.dumps({k: report[k] for k in ("per_arm", "ratios")}, indent=1))
    if args.record:
        stem = os.path.join(args.record, f"{time.strftime('%Y-%m-%d')}-parity")
        shutil.copy(os.path.join(out_dir, "parity.json"), stem + ".json")
        shutil.copy(os.path.join(out_dir, "parity.png"), stem + ".png")
        print(f"[parity] recorded {stem}.json and .png", flush=True)
    print(f"[parity] written to {out_dir}/parity.json and parity.png", flush=True)


if __name__ == "__main__":
    main()
