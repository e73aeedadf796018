"""Metric sinks: metrics.jsonl (one object per training step), TensorBoard, a progress line."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Dict, List, Optional

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
    def __init__(self, log_path: str, tensorboard: bool = True):
        os.makedirs(log_path, exist_ok=True)
        self.path = os.path.join(log_path, "metrics.jsonl")
        self._file = open(self.path, "a", buffering=1)
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(os.path.join(log_path, "tensorboard"))

    def log(self, record: Dict[str, float]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        if self._writer is not None:
            step = int(record["step"])
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(key, value, step)

    def log_videos(self, videos, step: int, fps: int = 10) -> None:
        """Evaluation episodes as animated images in TensorBoard's Images tab (what its
        ``add_video`` makes, without the moviepy dependency it needs for that)."""
        if self._writer is None:
            return
        from tensorboard.compat.proto.summary_pb2 import Summary

        for index, video in enumerate(videos):
            height, width = video.frames.shape[1:3]
            image = Summary.Image(height=height, width=width, colorspace=3,
                                  encoded_image_string=animated_gif(video.frames, fps))
            tag = f"eval_video/{video.file_stem(index)}"
            self._writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
        self._writer.flush()

    def close(self) -> None:
        self._file.close()
        if self._writer is not None:
            self._writer.close()


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


def animated_gif(frames, fps: int) -> bytes:
    """uint8 frames ``[T, H, W, 3]`` -> the bytes of a looping GIF."""
    import io

    from PIL import Image

    images = [Image.fromarray(frame) for frame in frames]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return buffer.getvalue()


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
