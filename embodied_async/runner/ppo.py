"""``runner.mode: ppo``: the async graph. Env workers step their simulators, rollout workers act
and evaluate, the actor ranks take PPO updates; a step is one update.

Synchronous PPO is the same graph with ``algorithm.staleness_threshold: 0``: the rollout then
waits for each update before it collects the next batch, so nothing overlaps.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from embodied_async.algorithms.version_gate import VersionGate
from embodied_async.config import Topology
from embodied_async.metrics import pool_env_metrics, progress_line
from embodied_async.runner.graph import Graph, Mode, placement_slots, start_trainer
from embodied_async.scheduler.graph_channels import GraphChannels
from embodied_async.scheduler.worker_group import Pending, WorkerGroup, wait_all, wait_answers
from embodied_async.workers.actor_worker import ActorWorker
from embodied_async.workers.env_worker import EnvWorker
from embodied_async.workers.rollout_worker import RolloutWorker


def channel_links(topology: Topology, nodes: Dict[str, Sequence]) -> Dict[str, tuple]:
    """The env <-> rollout channels' keys, and those whose env and rollout workers share a node
    (``nodes``: the node of each worker, per component): ``GraphChannels.create`` sends those
    point to point and the others through Ray. They carry one message per decision: what the
    per-message cost is paid on. Trajectories (one message per rollout) and weights (one per
    update, stored once in Ray's object store for every rollout rank) go through Ray: a large
    item in a socket would hold its sender until the consumer reads that very key, and the actor
    reads the streams in its own order."""
    links: Dict[str, tuple] = {name: ([], []) for name in ("env_outputs", "actions")}
    for rollout_rank in range(topology.num_rollout_workers):
        rollout_node = nodes["rollout"][rollout_rank]
        for env_rank in topology.env_ranks(rollout_rank):
            for stage in range(topology.stages):
                for name in links:
                    links[name][0].append((env_rank, stage))
                    if nodes["env"][env_rank] == rollout_node:
                        links[name][1].append((env_rank, stage))
    return links


def announce_demonstrations(cfg, env_spec) -> None:
    """``algorithm.demo_loss_coef``: open the dataset here, before the actor does, so a dataset that
    does not fit the env is one line."""
    from embodied_async.datasets.batches import open_dataset

    reader, keys = open_dataset(cfg.dataset.root, cfg.dataset.keys, env_spec, recorded_hz=cfg.dataset.recorded_hz)
    print(f"[ppo] demonstrations in the loss (algorithm.demo_loss_coef={cfg.algorithm.demo_loss_coef}): "
          f"{cfg.dataset.root}, {reader.num_episodes} episodes, {len(reader)} frames; inputs {keys}", flush=True)


class PPOMode(Mode):
    name = "runner"
    evaluate_method = "evaluate"

    def build(self) -> Graph:
        """Channels and the three worker groups on the topology; no loop started yet."""
        cfg, topology = self.cfg, self.topology
        slots = placement_slots(cfg, topology, ("env", "rollout", "actor"))
        links = None
        if slots and cfg.cluster.channel_transport == "auto":
            links = channel_links(topology, {name: [node for node, _ in s] for name, s in slots.items()})
        channels = GraphChannels.create(cfg.cluster.backend, links=links,
                                        trajectory_depth=VersionGate.from_config(cfg.algorithm).max_capacity,
                                        latency_s=cfg.cluster.inject_channel_latency_s)
        common = dict(cfg=cfg, topology=topology, channels=channels)
        placed = dict(topology=topology, backend=cfg.cluster.backend)
        env = WorkerGroup("env", EnvWorker, kwargs_for=lambda r: dict(common, rank=r), slots=slots.get("env"), **placed)
        env_spec = env.call_rank(0, "spec").result()
        if cfg.algorithm.demo_loss_coef > 0:
            announce_demonstrations(cfg, env_spec)
        groups = {"env": env}
        for name, worker in (("rollout", RolloutWorker), ("actor", ActorWorker)):
            groups[name] = WorkerGroup(name, worker, kwargs_for=lambda r: dict(common, rank=r, env_spec=env_spec),
                                       slots=slots.get(name), **placed)
        start_trainer(groups["actor"])
        return Graph(groups, channels, env_spec)

    def start(self, graph: Graph) -> List[Pending]:
        target = self.cfg.runner.stop_at_eval_success
        if target is not None and not graph.env_spec.reports_success:
            raise ValueError(f"runner.stop_at_eval_success={target}, but this env reports no success, so it would "
                             "never stop there: remove runner.stop_at_eval_success")
        wait_all(graph.actor.call("publish_weights"))
        return graph.env.call("run") + graph.rollout.call("run")

    def version_after_step(self, metrics: Dict[str, float], step: int) -> int:
        return int(metrics["train/actor/current_version"]) + 1

    def step_record(self, graph: Graph, metrics: Dict[str, float], interval_s: float,
                    loops: List[Pending]) -> Dict[str, float]:
        """The update's metrics, the env workers' pooled, the rollout workers' (time: their mean;
        CPU and traffic: sums) and each channel's queue size (flat over a long run: benchmarks/soak.py)."""
        patience = self.cfg.runner.hang_timeout_s  # a worker that does not answer is hung
        env_parts = wait_answers(graph.env.call("pop_metrics"), watch=loops, timeout=patience)
        rollout_parts = wait_answers(graph.rollout.call("pop_metrics"), watch=loops, timeout=patience)
        record = dict(metrics)
        record.update(pool_env_metrics(env_parts, interval_s))
        for key in rollout_parts[0]:
            total = sum(part[key] for part in rollout_parts)
            record[key] = total / len(rollout_parts) if key.startswith("time/") else total
        for name, channel in graph.channels.named().items():
            record[f"channel/{name}_qsize"] = float(channel.qsize())
        return record

    def progress_line(self, record: Dict[str, float], max_steps: int, last_eval: Optional[float]) -> str:
        return progress_line(record, max_steps, last_eval)
