"""The model card (``README.md``) of an exported policy, written from its run: what it was trained
from and on, how, how well it did at its last evaluation, and how to load it."""

from __future__ import annotations

import datetime
import json
import os
import re
from typing import Any, Dict, List, Optional

from embodied_async.run_folder import RUNNER_STATE, log_folder

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def run_recipe(log_path: str) -> Dict[str, Any]:
    """The recipe a run was launched with and its overrides (Hydra's files in the log folder)."""
    from omegaconf import OmegaConf

    hydra_dir = os.path.join(log_path, ".hydra")
    name, overrides = None, []
    if os.path.isfile(os.path.join(hydra_dir, "hydra.yaml")):
        name = OmegaConf.load(os.path.join(hydra_dir, "hydra.yaml")).hydra.job.get("config_name")
    if os.path.isfile(os.path.join(hydra_dir, "overrides.yaml")):
        overrides = [str(o) for o in OmegaConf.load(os.path.join(hydra_dir, "overrides.yaml"))]
    return {"name": name, "overrides": overrides}


def last_evaluation(log_path: str, step: int) -> Optional[Dict[str, float]]:
    """The last evaluation at or before ``step`` in the run's ``metrics.jsonl``: its success rate,
    episodes and Wilson interval; None when the run evaluated none."""
    from embodied_async.evaluation import wilson_interval

    path = os.path.join(log_path, "metrics.jsonl")
    found = None
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                # a task that reports no success logs its rate as null (metrics.jsonl has no NaN)
                if record.get("step", 0) <= step and "eval/success_rate" in record and record.get("eval/episodes"):
                    found = record
    if found is None:
        return None
    episodes, rate = int(found["eval/episodes"]), found["eval/success_rate"]
    interval = wilson_interval(round(rate * episodes), episodes) if rate is not None else None
    return {"step": int(found["step"]), "success_rate": rate, "episodes": episodes, "ci95": interval}


def write_model_card(folder: str, checkpoint: str, cfg, result, dataset: Optional[Dict[str, Any]],
                     stats_key: str, version: str) -> str:
    """Write ``folder/README.md``; returns its path."""
    log_path = log_folder(checkpoint)
    with open(os.path.join(checkpoint, RUNNER_STATE)) as f:
        state = json.load(f)
    recipe = run_recipe(log_path)
    evaluation = last_evaluation(log_path, int(state["step"]))
    base = getattr(cfg.model, "path", None)
    rows = [("policy family", cfg.model.name), ("format", result.format),
            ("base checkpoint", f"`{base}`" if base else "none (trained from scratch)"),
            ("recipe", f"`{recipe['name'] or 'unknown'}`" + _overrides(recipe["overrides"])),
            ("env and task", f"{cfg.env.name}, `{cfg.env.task_name()}`"),
            ("training", f"runner.mode={cfg.runner.mode}, {state['step']} steps, "
                         f"{state.get('env_steps', 0)} env steps"),
            ("dataset", _dataset(dataset) if cfg.runner.mode == "sft" or dataset else "none"),
            ("statistics filed under", f"`{stats_key}`"),
            ("last evaluation", _evaluation(evaluation)),
            ("exported", f"{datetime.date.today().isoformat()} from `{os.path.abspath(checkpoint)}`"),
            ("code version", version)]
    lines = _front_matter(cfg, base) + [
        f"# {cfg.model.name} policy for {cfg.env.task_name()}, fine-tuned with embodied_async", "",
        "| | |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in rows], "", "## Loading it", "", result.load_with]
    if result.notes:
        lines += ["", "## Notes", "", *[f"- {note}" for note in result.notes]]
    path = os.path.join(folder, "README.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _front_matter(cfg, base: Optional[str]) -> List[str]:
    """The hub's metadata block: tags, and the base model when it is a hub repo."""
    lines = ["---", "tags:", "- robotics", "- embodied_async", f"- {cfg.model.name}", f"- {cfg.runner.mode}"]
    if base and HUB_ID.fullmatch(base) and not os.path.isdir(base):
        lines.append(f"base_model: {base}")
    return lines + ["---", ""]


def _overrides(overrides: List[str]) -> str:
    return " with " + " ".join(f"`{o}`" for o in overrides) if overrides else " (no overrides)"


def _dataset(dataset: Optional[Dict[str, Any]]) -> str:
    if not dataset:
        return "its run's dataset is no longer where the run read it"
    return f"`{dataset['root']}`: {dataset['episodes']} episodes, {dataset['frames']} frames"


def _evaluation(evaluation: Optional[Dict[str, Any]]) -> str:
    if evaluation is None:
        return "none in the run"
    rate = evaluation["success_rate"]
    if rate is None:
        return f"{evaluation['episodes']} episodes at step {evaluation['step']} (the task reports no success)"
    low, high = evaluation["ci95"]
    return (f"success {rate:.3f} (95% CI {low:.3f}-{high:.3f}) over {evaluation['episodes']} episodes at step "
            f"{evaluation['step']}")
