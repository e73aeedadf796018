"""Where the RL phase of the miniature spends its time, and what the actor's settings save: runs
an RL recipe from one checkpoint for a few updates once per variant, back to back on this machine,
and prints per variant the env steps per second (steady state: the first ``--warmup`` updates left
out), the actor's training ms per trained decision, the rollout's inference ms per decision and the
components' busy shares.

    .venv/bin/python benchmarks/rl_phase.py --init-from logs/miniature_openvla/sft/checkpoints/global_step_1500
    .venv/bin/python benchmarks/rl_phase.py --recipe maniskill_miniature_ppo_pi0 --init-from ... --updates 20

Variants (``--variants``, each a name and its overrides in ``VARIANTS``): ``recipe`` (as it is),
``fresh`` (``rollout.recompute_fresh_logprobs=false``: no proximal pass for the current version's
samples), ``one_epoch`` (that and ``algorithm.update_epochs=1``). Writes ``<out>/rl_phase.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VARIANTS = {
    "recipe": [],
    "fresh": ["rollout.recompute_fresh_logprobs=false"],
    "one_epoch": ["rollout.recompute_fresh_logprobs=false", "algorithm.update_epochs=1"],
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="maniskill_miniature_ppo_openvla")
    parser.add_argument("--init-from", required=True, help="the checkpoint every variant starts from (model.init_from)")
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8, help="updates left out of the steady-state rate")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", default=None, help="default logs/rl_phase-<time>")
    parser.add_argument("overrides", nargs="*", help="key=value for every variant")
    args = parser.parse_args(argv)
    if args.updates <= args.warmup:
        parser.error("--updates must exceed --warmup")
    out = os.path.abspath(args.out or os.path.join(REPO_ROOT, "logs", f"rl_phase-{time.strftime('%Y%m%d-%H%M%S')}"))
    os.makedirs(out, exist_ok=True)
    from embodied_async.launch import training_command

    results = {}
    for name in args.variants:
        log = os.path.join(out, name)
        command = training_command(args.recipe, log, [
            f"model.init_from={args.init_from}", f"runner.max_steps={args.updates}", "runner.val_check_interval=0",
            "runner.save_interval=0", *args.overrides, *VARIANTS[name]])
        print(f"[rl_phase] {name}: {' '.join(VARIANTS[name]) or 'the recipe as it is'}", flush=True)
        with open(os.path.join(out, f"{name}.log"), "w") as log_file:
            code = subprocess.call(command, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT)
        if code != 0:
            print(f"[rl_phase] {name} failed (exit {code}); its output: {os.path.join(out, name + '.log')}",
                  file=sys.stderr, flush=True)
            return 1
        results[name] = measure(log, args.warmup)
        print(f"[rl_phase] {name}: {json.dumps(results[name])}", flush=True)
    base = results[args.variants[0]]["env_steps_per_s"]
    for name, result in results.items():
        result["speed_vs_first"] = round(result["env_steps_per_s"] / base, 3)
    report = {"date": time.strftime("%Y-%m-%d"), "recipe": args.recipe, "init_from": args.init_from,
              "updates": args.updates, "warmup": args.warmup, "overrides": args.overrides, "variants": results}
    with open(os.path.join(out, "rl_phase.json"), "w") as f:
        json.dump(report, f, indent=1)
    for name, result in results.items():
        print(f"[rl_phase] {name:10s} {result['env_steps_per_s']:7.1f} env steps/s (x{result['speed_vs_first']:.2f}), "
              f"training {result['training_ms_per_decision']:.2f} ms per decision, busy {result['busy_share']}",
              flush=True)
    return 0


def measure(log: str, warmup: int) -> dict:
    from embodied_async.metrics import decision_costs, read_metrics
    from embodied_async.run_folder import log_config

    records = [r for r in read_metrics(log) if "train/actor/current_version" in r]
    steady = records[warmup:]
    seconds = steady[-1]["wall_time_s"] - records[warmup - 1]["wall_time_s"]
    steps = sum(r["env/env_steps"] for r in steady)
    cfg = log_config(log)
    costs = decision_costs(records, int(cfg.get("env", {}).get("num_action_chunks", 1) or 1),
                           int(cfg.get("algorithm", {}).get("update_epochs", 1)))
    return {"env_steps_per_s": round(steps / seconds, 1), "updates": len(steady),
            "training_ms_per_decision": costs.get("training_ms_per_decision"),
            "inference_ms_per_decision": costs.get("inference_ms_per_decision"),
            "busy_share": costs.get("busy_share")}


if __name__ == "__main__":
    sys.exit(main())
