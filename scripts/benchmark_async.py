"""Async vs synchronous PPO on one recipe, for the same number of env steps, in one invocation.

    .venv/bin/python scripts/benchmark_async.py --config maniskill_async_ppo_mlp --env-steps 40000

Prints (and writes as JSON) env steps/s of each run, their ratio, busy seconds per component, and
the ideal overlap bound (t_env + t_rollout + t_train) / max(t_env + t_rollout, t_train) measured on
the synchronous run: how much faster perfect overlap of simulation and training could be.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compose(config_name: str, overrides: list):
    from hydra import compose as hydra_compose, initialize_config_dir

    from embodied_async.config import resolve
    from embodied_async.config.hydra_schema import register_schema

    register_schema()
    with initialize_config_dir(config_dir=os.path.join(REPO_ROOT, "configs"), version_base=None):
        return resolve(hydra_compose(config_name=config_name, overrides=overrides))  # (config, topology)


def measure(config_name: str, overrides: list, label: str) -> dict:
    from embodied_async.runner import run

    print(f"[benchmark] {label}: {' '.join(overrides)}", flush=True)
    result = run(*compose(config_name, overrides))
    busy = {k: round(result[k], 2) for k in ("time/env", "time/rollout", "time/actor_training")}
    return {"env_steps": result["env_steps"], "wall_time_s": round(result["wall_time_s"], 2),
            "env_steps_per_s": round(result["env_steps"] / result["wall_time_s"], 1),
            "busy_s": busy, "steps": result["step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="maniskill_async_ppo_mlp")
    parser.add_argument("--env-steps", type=int, default=40_000)
    parser.add_argument("--out", default=None, help="JSON file (default logs/benchmark-<time>-<config>.json)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to both runs")
    args = parser.parse_args()

    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = os.path.join(REPO_ROOT, "logs", f"benchmark-{stamp}-{args.config}")
    common = [*args.overrides, f"runner.max_env_steps={args.env_steps}", "runner.max_steps=100000",
              "runner.val_check_interval=0", "runner.save_interval=0"]
    runs = {
        "async": measure(args.config, [*common, f"runner.logger.log_path={root}/async"], "async"),
        "sync": measure(args.config, [*common, "algorithm.staleness_threshold=0",
                                      f"runner.logger.log_path={root}/sync"], "sync"),
    }
    sync_busy = runs["sync"]["busy_s"]
    t_env, t_rollout, t_train = sync_busy["time/env"], sync_busy["time/rollout"], sync_busy["time/actor_training"]
    report = {
        "config": args.config, "env_steps_target": args.env_steps, **runs,
        "speedup_async_over_sync": round(runs["async"]["env_steps_per_s"] / runs["sync"]["env_steps_per_s"], 3),
        "ideal_overlap_bound": round((t_env + t_rollout + t_train) / max(t_env + t_rollout, t_train), 3),
    }
    out = args.out or f"{root}.json"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    print(f"[benchmark] written to {out}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
