"""``runner.mode: sft``: the trainer ranks take supervised steps on a LeRobot dataset; a rollout
worker (when ``runner.val_check_interval`` > 0) evaluates the published weights in the env beside
training. A step is one optimiser step over ``actor.global_batch_size`` frames."""

from __future__ import annotations

from typing import Dict, List, Optional

from embodied_async.datasets.batches import open_dataset
from embodied_async.registry import build_env
from embodied_async.runner.graph import Graph, Mode, placement_slots, start_trainer
from embodied_async.scheduler.graph_channels import GraphChannels
from embodied_async.scheduler.worker_group import Pending, WorkerGroup, wait_all
from embodied_async.workers.rollout_worker import RolloutWorker
from embodied_async.workers.sft_worker import SupervisedWorker


def probe_env_spec(cfg):
    """The env's spec, from one sub-env built and closed here (a supervised run starts no env
    workers, and the dataset and the policy must both fit the env they will act in)."""
    env = build_env(cfg.env, 1, cfg.runner.seed)
    try:
        return env.spec
    finally:
        env.close()


def check_dataset(cfg, env_spec) -> None:
    """The dataset exists, is a LeRobot dataset, and fits the env and the key mapping (raises
    ``DatasetError`` naming the key and what the dataset has)."""
    reader, keys = open_dataset(cfg.dataset.root, cfg.dataset.keys, env_spec, recorded_hz=cfg.dataset.recorded_hz)
    print(f"[sft] dataset {cfg.dataset.root}: {reader.num_episodes} episodes, {len(reader)} frames at {reader.fps} "
          f"fps; inputs {keys}", flush=True)


def sft_progress_line(record: Dict[str, float], max_steps: int, last_eval: Optional[float]) -> str:
    parts = [f"step {int(record['step'])}/{max_steps}", f"loss {record.get('train/sft/loss', float('nan')):.4f}",
             f"val {record['val/sft/loss']:.4f}" if "val/sft/loss" in record else "val  -  ",
             f"eval {last_eval:.2f}" if last_eval is not None else "eval  -  ",
             f"lr {record.get('train/sft/lr', 0.0):.2e}", f"epoch {record.get('train/sft/epoch', 0.0):.2f}",
             f"{record.get('throughput/samples_per_s', 0.0):.1f} samples/s", f"{record['wall_time_s']:.0f}s"]
    return " | ".join(parts)


class SupervisedMode(Mode):
    name = "sft"
    evaluate_method = "evaluate_published"

    def build(self) -> Graph:
        cfg, topology = self.cfg, self.topology
        slots = placement_slots(cfg, topology, ("rollout", "actor"))
        env_spec = probe_env_spec(cfg)
        check_dataset(cfg, env_spec)  # here, before any worker: a dataset that does not fit is one line
        channels = GraphChannels.create(cfg.cluster.backend, trajectory_depth=1, links=None)
        common = dict(cfg=cfg, topology=topology, channels=channels, env_spec=env_spec)
        placed = dict(topology=topology, backend=cfg.cluster.backend)
        groups = {"actor": WorkerGroup("actor", SupervisedWorker, kwargs_for=lambda r: dict(common, rank=r),
                                       slots=slots.get("actor"), **placed)}
        if cfg.runner.val_check_interval:  # the rollout worker only evaluates
            groups["rollout"] = WorkerGroup("rollout", RolloutWorker, kwargs_for=lambda r: dict(common, rank=r),
                                            slots=slots.get("rollout"), **placed)
        start_trainer(groups["actor"])
        return Graph(groups, channels, env_spec)

    def version_after_step(self, metrics: Dict[str, float], step: int) -> int:
        return step

    def step_record(self, graph: Graph, metrics: Dict[str, float], interval_s: float,
                    loops: List[Pending]) -> Dict[str, float]:
        return dict(metrics, **{"throughput/samples_per_s": self.cfg.actor.global_batch_size / max(interval_s, 1e-9)})

    def on_evaluation_due(self, graph: Graph, record: Dict[str, float]) -> None:
        record.update(wait_all(graph.actor.call("validate"))[0])  # the held-out loss

    def before_evaluation(self, graph: Graph) -> None:
        wait_all(graph.actor.call("publish_weights"))  # weights go out only to be evaluated

    def progress_line(self, record: Dict[str, float], max_steps: int, last_eval: Optional[float]) -> str:
        return sft_progress_line(record, max_steps, last_eval)
