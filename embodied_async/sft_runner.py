"""The supervised runner (``runner.mode: sft``): the trainer core on its actor ranks takes
supervised steps on a LeRobot dataset; a rollout worker (when ``runner.val_check_interval`` > 0)
evaluates the published weights in the env beside training. Checkpoints, resume,
``keep_checkpoints``, metrics, videos and Ctrl-C are the PPO runner's own (``runner.Runner``).
"""

from __future__ import annotations

import time
from typing import Dict

from embodied_async.config import Topology, TrainConfig
from embodied_async.datasets.batches import open_dataset
from embodied_async.metrics import MetricLogger, print_progress
from embodied_async.registry import build_env
from embodied_async.runner import Graph, Runner, deferred_sigint
from embodied_async.scheduler.graph_channels import GraphChannels
from embodied_async.scheduler.worker_group import WorkerGroup, init_ray, wait_all
from embodied_async.workers.rollout_worker import RolloutWorker
from embodied_async.workers.sft_worker import SupervisedWorker


def probe_env_spec(cfg: TrainConfig):
    """The env's spec, from one sub-env built and closed here (a supervised run starts no env
    workers, and the dataset and the policy must both fit the env they will act in)."""
    env = build_env(cfg.env, 1, cfg.runner.seed)
    try:
        return env.spec
    finally:
        env.close()


def check_dataset(cfg: TrainConfig, env_spec) -> None:
    """The dataset exists, is a LeRobot dataset, and fits the env and the key mapping (raises
    ``DatasetError`` naming the key and what the dataset has)."""
    reader, keys = open_dataset(cfg.dataset.root, cfg.dataset.keys, env_spec)
    print(f"[sft] dataset {cfg.dataset.root}: {reader.num_episodes} episodes, {len(reader)} frames at {reader.fps} "
          f"fps; inputs {keys}", flush=True)


def build_supervised_graph(cfg: TrainConfig, topology: Topology) -> Graph:
    backend = cfg.cluster.backend
    slots = {}
    if backend == "ray":
        init_ray(cfg.cluster.num_nodes)
        from embodied_async.scheduler.worker_group import worker_slots

        slots = {name: worker_slots(topology.device_kind, topology.ids(name), cfg.cluster.num_nodes)
                 for name in ("rollout", "actor")}
    env_spec = probe_env_spec(cfg)
    check_dataset(cfg, env_spec)  # here, before any worker: a dataset that does not fit is one line
    channels = GraphChannels.create(backend, trajectory_depth=1, links=None)
    common = dict(cfg=cfg, topology=topology, channels=channels, env_spec=env_spec)
    groups = dict(topology=topology, backend=backend)
    actor = WorkerGroup("actor", SupervisedWorker, kwargs_for=lambda r: dict(common, rank=r), slots=slots.get("actor"),
                        **groups)
    rollout = None
    if cfg.runner.val_check_interval:
        rollout = WorkerGroup("rollout", RolloutWorker, kwargs_for=lambda r: dict(common, rank=r),
                              slots=slots.get("rollout"), **groups)
    host, port = actor.call_rank(0, "master_address").result()
    wait_all(actor.call("init_model", host, port))
    return Graph(None, rollout, actor, channels, env_spec)


def sft_progress_line(record: Dict[str, float], max_steps: int, last_eval) -> str:
    parts = [f"step {int(record['step'])}/{max_steps}", f"loss {record.get('train/sft/loss', float('nan')):.4f}",
             f"val {record['val/sft/loss']:.4f}" if "val/sft/loss" in record else "val  -  ",
             f"eval {last_eval:.2f}" if last_eval is not None else "eval  -  ",
             f"lr {record.get('train/sft/lr', 0.0):.2e}", f"epoch {record.get('train/sft/epoch', 0.0):.2f}",
             f"{record.get('throughput/samples_per_s', 0.0):.1f} samples/s", f"{record['wall_time_s']:.0f}s"]
    return " | ".join(parts)


class SupervisedRunner(Runner):
    evaluate_method = "evaluate_published"

    def _start(self) -> None:
        cfg = self.cfg
        print(f"[sft] building the trainer (placement {dict(cfg.cluster.component_placement)}, backend "
              f"{cfg.cluster.backend}); dataset {cfg.dataset.root}", flush=True)
        self.graph = graph = build_supervised_graph(cfg, self.topology)
        if cfg.runner.resume_dir:
            versions = wait_all(graph.actor.call("load_checkpoint", cfg.runner.resume_dir))
            print(f"[sft] resumed from {cfg.runner.resume_dir}: step {versions[0]}", flush=True)
        self.started = True

    def _count_finished_step(self, metrics: Dict[str, float]) -> None:
        self.state["step"] += 1
        self.state["version"] = self.state["step"]

    def _step_record(self, metrics: Dict[str, float], interval_s: float, wall_offset: float, start: float) -> Dict:
        self._count_finished_step(metrics)
        self.state["wall_time_s"] = wall_offset + time.time() - start
        record = dict(metrics, step=self.state["step"], env_steps=self.state["env_steps"],
                      wall_time_s=self.state["wall_time_s"], train_time_s=self.state["wall_time_s"])
        record["throughput/samples_per_s"] = self.cfg.actor.global_batch_size / max(interval_s, 1e-9)
        return record

    def _train(self, logger: MetricLogger) -> None:
        cfg, graph = self.cfg, self.graph
        start, last_time = time.time(), time.time()
        wall_offset = self.state.get("wall_time_s", 0.0)
        while self.state["step"] < cfg.runner.max_steps:
            with deferred_sigint():  # Ctrl-C must not fall between submitting and recording the call
                self.in_flight = graph.actor.call("train_step")
            metrics = wait_all(self.in_flight)[0]
            self.in_flight = []
            now = time.time()
            record = self._step_record(metrics, now - last_time, wall_offset, start)
            last_time = now
            step = self.state["step"]
            last = step >= cfg.runner.max_steps
            interval = cfg.runner.val_check_interval
            due = bool(interval) and (step % interval == 0 or last)
            if due:
                record.update(wait_all(graph.actor.call("validate"))[0])
            self._take_eval(record, wait=last)
            if (last or (cfg.runner.save_interval and step % cfg.runner.save_interval == 0)) \
                    and self.last_saved_step != step:
                self._save()  # before the final evaluation, so a failing evaluation loses nothing
            if due and graph.rollout is not None:
                wait_all(graph.actor.call("publish_weights"))
                self._launch_eval()
                if last:
                    self._take_eval(record, wait=True)
                    print(f"[sft] final eval at step {step}: success rate {self.last_eval:.3f}", flush=True)
            logger.log(record)
            for launched_at, videos in self.videos_to_log:
                logger.log_videos(videos, launched_at, cfg.runner.eval_video_fps)
            self.videos_to_log = []
            print_progress(sft_progress_line(record, cfg.runner.max_steps, self.last_eval))
