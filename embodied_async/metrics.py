"""Metric sinks: metrics.jsonl (one object per training step), the experiment trackers
(``trackers.py``: TensorBoard, wandb, swanlab), a progress line."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Dict, List, Optional, Sequence

from embodied_async.run_folder import storage_errors_end_the_run
from embodied_async.trackers import close_trackers, open_trackers

# Per-episode means of the env workers: pooled weighted by each worker's finished episodes.
EPISODE_MEANS = ("env/success_rate", "env/episode_return", "env/episode_len")


def pool_env_metrics(parts: List[Dict[str, float]], interval_s: float) -> Dict[str, float]:
    """Pool the env workers' metrics: ``time/*`` averaged over workers, per-episode means weighted
    by their episodes, every other count added up; plus the interval's throughput."""
    episodes = sum(p["env/episodes"] for p in parts)
    out: Dict[str, float] = {}
    for key in parts[0]:
        if key.startswith("time/"):
            out[key] = sum(p[key] for p in parts) / len(parts)
        elif key in EPISODE_MEANS:
            out[key] = (sum(p[key] * p["env/episodes"] for p in parts if p["env/episodes"]) / episodes
                        if episodes else float("nan"))
        else:
            out[key] = sum(p[key] for p in parts)
    out["throughput/env_steps_per_s"] = out["env/env_steps"] / interval_s if interval_s > 0 else 0.0
    return out


class MetricLogger:
    """``<log_path>/metrics.jsonl`` (one object per training step) and the trackers of ``backends``
    (``runner.logger.backends``, ``embodied_async.trackers``), each given every record, the
    evaluation videos and, once at start, ``run_config`` (the run's resolved config as plain data)."""

    def __init__(self, log_path: str, backends: Sequence[str] = ("tensorboard",), project: str = "embodied_async",
                 run_config: Optional[Dict] = None):
        os.makedirs(log_path, exist_ok=True)
        self.log_path = log_path
        self.path = os.path.join(log_path, "metrics.jsonl")
        with storage_errors_end_the_run("the run's metrics", log_path, self.path):
            self._file = open(self.path, "a", buffering=1)
        try:
            self._trackers = open_trackers(backends, log_path, project, run_config)
        except BaseException:
            self._file.close()
            raise

    def log(self, record: Dict[str, float]) -> None:
        """Write ``record`` everywhere; a folder that cannot take it ends the run (StorageError):
        records are never dropped silently."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with storage_errors_end_the_run("the run's metrics", self.log_path, self.path):
            self._file.write(json.dumps(clean) + "\n")
            for tracker in self._trackers:
                tracker.log(record)

    def log_videos(self, videos, step: int, fps: int = 10) -> None:
        """Evaluation episodes (``evaluation.EpisodeVideo``) at the step whose policy they show."""
        with storage_errors_end_the_run("the run's metrics", self.log_path, self.path):
            for tracker in self._trackers:
                tracker.log_videos(videos, step, fps)

    def close(self) -> None:
        with storage_errors_end_the_run("the run's metrics", self.log_path, self.path):
            try:
                self._file.close()
            finally:
                close_trackers(self._trackers)


def progress_line(record: Dict[str, float], max_steps: int, last_eval: Optional[float]) -> str:
    success = record.get("env/success_rate", float("nan"))
    parts = [f"step {int(record['step'])}/{max_steps}", f"env steps {int(record['env_steps'])}",
             f"success {success:.2f}" if math.isfinite(success) else "success  -  ",
             f"eval {last_eval:.2f}" if last_eval is not None and math.isfinite(last_eval) else "eval  -  ",
             f"{record.get('throughput/env_steps_per_s', 0.0):.0f} env steps/s",
             f"staleness {record.get('train/actor/staleness', 0.0):.2f}",
             f"{record['wall_time_s']:.0f}s"]
    return " | ".join(parts)


def print_progress(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


def read_metrics(log_path: str) -> List[Dict]:
    """The records a run's ``MetricLogger`` wrote to ``<log_path>/metrics.jsonl`` ([] when none)."""
    path = os.path.join(log_path, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def decision_costs(records: List[Dict], actions_per_decision: int, update_epochs: int) -> Dict:
    """Per decision (one policy call for one sub-env, ``actions_per_decision`` env steps) over a
    PPO run's ``records``: the rollout's inference ms and the actor's training ms (forward +
    backward over its ``update_epochs`` passes), and the busy shares of the components."""
    steps = sum(r.get("env/env_steps", 0) for r in records)
    if not steps:
        return {}
    total = lambda key: sum(r.get(key) or 0.0 for r in records)  # noqa: E731
    wall = records[-1]["wall_time_s"]
    decisions = steps / actions_per_decision
    trained = total("train/actor/num_samples") or decisions
    return {
        "inference_ms_per_decision": round(1000 * total("time/rollout") / decisions, 2),
        "training_ms_per_decision": round(1000 * total("time/actor_training") / trained, 2),
        "update_epochs": update_epochs,
        "env_ms_per_step": round(1000 * total("time/env") / steps, 2),
        "actions_per_decision": actions_per_decision,
        # each component's own work over the run's wall time (time/env: the env processes' mean)
        "busy_share": {name: round(total(key) / wall, 3) for name, key in
                       (("env", "time/env"), ("rollout", "time/rollout"), ("actor", "time/actor_training"))},
    }
