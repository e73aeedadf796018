"""What a pipeline or a benchmark writes down about its runs: the machine it ran on, a run's
success curve with Wilson intervals, bars with those intervals on a chart; and the miniature's
record (``python -m embodied_async miniature``): per RL seed the SFT checkpoint's and that run's evaluations under
both decision rules, the curves, the phases' times and the RL run's costs, over the seeds the mean
gain with its bootstrap interval, its chart, its dated copy beside the other records."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import re
import shutil
from typing import Dict, List

from embodied_async.seed_statistics import bootstrap_mean

SFT_PHASES = ("collect", "sft", "eval_sft")  # the miniature's phases before RL


def machine() -> Dict:
    """The CPU model, cores, Python and host: what a record's seconds were measured on."""
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "host": platform.node()}


def errorbars(axis, xs, entries, **style) -> None:
    """Success rates with their ``ci95`` intervals as error bars on a matplotlib ``axis``."""
    rates = [p["success_rate"] for p in entries]
    errors = [[r - p["ci95"][0] for r, p in zip(rates, entries)], [p["ci95"][1] - r for r, p in zip(rates, entries)]]
    axis.errorbar(xs, rates, yerr=errors, capsize=3, **style)


def success_curve(records: List[Dict], x_key: str, episodes: int) -> List[Dict]:
    """The in-run evaluations: x, success rate and its Wilson interval over ``episodes``."""
    from embodied_async.evaluation import wilson_interval

    points = []
    for r in records:
        rate = r.get("eval/success_rate")
        if rate is None:
            continue
        wins = int(round(rate * episodes))
        points.append({x_key: r.get(x_key, r.get("step")), "success_rate": rate,
                       "ci95": list(wilson_interval(wins, episodes)), "episodes": episodes})
    return points


def build_record(state: Dict, family_name: str, family, sizes, rl_seed: int) -> Dict:
    """One RL seed's record: the SFT checkpoint's and that run's evaluations (both decision rules),
    the curves, the phases' times and the RL run's costs (``family``: its recipes and decision
    rule; ``sizes``: the pipeline's sizes, a dataclass)."""
    from embodied_async.metrics import decision_costs, read_metrics
    from embodied_async.run_folder import log_config

    phases = state["phases"]
    rl, eval_rl = phases[f"rl_seed{rl_seed}"], phases[f"eval_rl_seed{rl_seed}"]
    sft_cfg, rl_cfg = log_config(phases["sft"]["log"]), log_config(rl["log"])
    sft_records, rl_records = read_metrics(phases["sft"]["log"]), read_metrics(rl["log"])
    before = phases["eval_sft"]
    seconds = {name: phases[name]["seconds"] for name in (*SFT_PHASES, f"rl_seed{rl_seed}", f"eval_rl_seed{rl_seed}")}
    seconds = {name.replace(f"_seed{rl_seed}", ""): value for name, value in seconds.items()}
    total = sum(seconds.values())
    env_cfg = rl_cfg.get("env", {})
    return {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "family": family_name,
        "task": env_cfg.get("task") or env_cfg.get("name"),
        "rl_seed": rl_seed,
        "env": {k: env_cfg.get(k) for k in ("name", "task", "obs_mode", "image_size", "control_mode",
                                             "max_episode_steps") if k in env_cfg},
        "recipes": {"sft": family.sft_recipe, "rl": family.rl_recipe},
        "settings": {"family": family_name, **dataclasses.asdict(sizes),
                     **{f"{name}_settings": phases[name]["settings"] for name in ("collect", "sft")},
                     "rl_settings": rl["settings"]},
        "demonstrations": {k: phases["collect"][k] for k in ("episodes", "frames")},
        "evaluation": {**evaluation_pair(before, eval_rl, family.decision_rule, sizes.eval_episodes),
                       "sampled": evaluation_pair(before.get("sampled"), eval_rl.get("sampled"), "sampled policy",
                                                  sizes.eval_episodes)},
        "sft_curve": success_curve(sft_records, "step", sft_cfg.get("runner", {}).get("eval_episodes", 0)),
        "rl_curve": success_curve(rl_records, "env_steps", rl_cfg.get("runner", {}).get("eval_episodes", 0)),
        "rl_env_steps": rl_records[-1]["env_steps"] if rl_records else 0,
        "rl_updates": rl_records[-1]["step"] if rl_records else 0,
        "phase_seconds": seconds,
        "total_seconds": round(total, 1),
        "phase_share": {name: round(value / total, 3) for name, value in seconds.items()} if total else {},
        "rl_costs": decision_costs(rl_records, int(env_cfg.get("num_action_chunks", 1) or 1),
                                   int(rl_cfg.get("algorithm", {}).get("update_epochs", 1))),
    }


def evaluation_pair(before: Dict, after: Dict, rule: str, episodes: int) -> Dict:
    """Before and after RL under one decision rule, the gain and whether the intervals are disjoint."""
    if not before or not after:
        return {}
    return {"decision_rule": rule, "episodes": episodes, "seed": before["seed"], "before_rl": _eval_entry(before),
            "after_rl": _eval_entry(after), "gain": round(after["success_rate"] - before["success_rate"], 3),
            "intervals_disjoint": after["success_rate_ci95"][0] > before["success_rate_ci95"][1]}


def summary_record(records: List[Dict]) -> Dict:
    """Every RL seed's record and, over the seeds, the mean gain under each decision rule."""
    first = records[0]
    gains = {"deterministic": [r["evaluation"]["gain"] for r in records],
             "sampled": [r["evaluation"]["sampled"]["gain"] for r in records if r["evaluation"]["sampled"]]}
    before = first["evaluation"]["before_rl"]
    return {
        **{key: first[key] for key in ("date", "machine", "family", "task", "env", "recipes", "demonstrations",
                                       "sft_curve")},
        "rl_seeds": [r["rl_seed"] for r in records],
        "before_rl": before,
        "gain": {rule: bootstrap_mean(values) for rule, values in gains.items() if values},
        # the bar: each seed's after-RL success above the SFT checkpoint's interval
        "every_seed_above_sft_interval": all(r["evaluation"]["after_rl"]["success_rate"] > before["ci95"][1]
                                             for r in records),
        "seeds": records,
    }


def _eval_entry(result: Dict) -> Dict:
    return {"success_rate": result["success_rate"], "ci95": result["success_rate_ci95"],
            "episode_length": result["episode_length"], "checkpoint": result["checkpoint"]}


def write_record(record: Dict, records: List[Dict], out: str) -> None:
    for seed_record in records:
        with open(os.path.join(out, f"record_seed{seed_record['rl_seed']}.json"), "w") as f:
            json.dump(seed_record, f, indent=1)
    with open(os.path.join(out, "record.json"), "w") as f:
        json.dump(record, f, indent=1)
    write_chart(record, os.path.join(out, "record.png"))


def write_chart(record: Dict, path: str) -> None:
    """SFT's curve and its checkpoint's evaluation (left); every RL seed's curve and final
    evaluation, from the SFT checkpoint at 0 env steps (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    before = record["before_rl"]
    points = record["sft_curve"]
    end = max([p["step"] for p in points], default=0)
    if points:
        errorbars(left, [p["step"] for p in points], points, marker="o",
                       label=f"beside training ({points[0]['episodes']} episodes)")
    errorbars(left, [end], [before], marker="s", color="black", label="the SFT checkpoint")
    errorbars(right, [0], [before], marker="s", color="gray", label="the SFT checkpoint (start)")
    for index, seed_record in enumerate(record["seeds"]):
        color = f"C{index}"
        curve_points, after = seed_record["rl_curve"], seed_record["evaluation"]["after_rl"]
        if curve_points:
            errorbars(right, [p["env_steps"] for p in curve_points], curve_points, marker="o", color=color,
                           alpha=0.6, label=f"seed {seed_record['rl_seed']} beside training")
        last = max([p["env_steps"] for p in curve_points], default=0)
        errorbars(right, [last], [after], marker="s", color=color, label=f"seed {seed_record['rl_seed']} final")
    for axis, label in ((left, "SFT steps"), (right, "RL env steps")):
        axis.set_xlim(left=0)
        axis.set_xlabel(label)
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right", fontsize=7)
    left.set_ylabel("success rate (Wilson 95 %)")
    left.set_ylim(-0.02, 1.02)
    gain = record["gain"]["deterministic"]
    fig.suptitle(f"{record['family']} (tiny, random init) on {record['task']}: SFT {before['success_rate']:.2f}, "
                 f"mean gain {gain['mean']:+.2f} [{gain['ci95'][0]:+.2f}, {gain['ci95'][1]:+.2f}] over "
                 f"{gain['n']} RL seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def copy_record(out: str, folder: str, record: Dict, records: List[Dict]) -> str:
    """Into ``folder``, dated: one JSON per RL seed, the summary JSON and its chart; their stem."""
    os.makedirs(folder, exist_ok=True)
    task = re.sub(r"[^A-Za-z0-9]+", "-", str(record["task"])).strip("-").lower()
    stem = os.path.join(folder, f"{record['date']}-miniature-{record['family']}-{task}")
    for seed_record in records:
        shutil.copyfile(os.path.join(out, f"record_seed{seed_record['rl_seed']}.json"),
                        f"{stem}-seed{seed_record['rl_seed']}.json")
    shutil.copyfile(os.path.join(out, "record.json"), stem + ".json")
    shutil.copyfile(os.path.join(out, "record.png"), stem + ".png")
    return stem


def summary_line(record: Dict) -> str:
    interval = lambda e: f"{e['success_rate']:.2f} [{e['ci95'][0]:.2f}, {e['ci95'][1]:.2f}]"  # noqa: E731
    before = record["before_rl"]
    afters = ", ".join(f"seed {r['rl_seed']} {interval(r['evaluation']['after_rl'])}" for r in record["seeds"])
    gains = "; ".join(f"{rule} {g['mean']:+.2f} [{g['ci95'][0]:+.2f}, {g['ci95'][1]:+.2f}]"
                      for rule, g in record["gain"].items())
    episodes = record["seeds"][0]["evaluation"]["episodes"]
    seconds = [r["phase_seconds"] for r in record["seeds"]]
    minutes = (sum(seconds[0][name] for name in SFT_PHASES) + sum(s["rl"] + s["eval_rl"] for s in seconds)) / 60
    return (f"[miniature] {record['family']} on {record['task']}: success after SFT {interval(before)}, after RL "
            f"{afters} ({episodes} episodes each, same seeds); mean gain over {len(record['seeds'])} RL seeds: "
            f"{gains}; {minutes:.1f} min of phases")
