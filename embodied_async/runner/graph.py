"""What a training mode gives the one loop (``loop.Runner``): its worker groups and channels
(``Graph``), and the hooks through which it supplies its step (``Mode``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from embodied_async.config import Topology, TrainConfig
from embodied_async.contracts import EnvSpec
from embodied_async.scheduler.graph_channels import GraphChannels
from embodied_async.scheduler.worker_group import Pending, WorkerGroup, init_ray, wait_all


@dataclass
class Graph:
    """A run's worker groups by component (``actor``: the ranks that train, in every training mode;
    ``rollout``: acts and evaluates; ``env``: steps the simulators), their channels, the env's spec."""

    groups: Dict[str, WorkerGroup]
    channels: Optional[GraphChannels]  # None: the workers talk only to the driver (a collection)
    env_spec: EnvSpec

    @property
    def actor(self) -> WorkerGroup:
        return self.groups["actor"]

    @property
    def rollout(self) -> Optional[WorkerGroup]:
        return self.groups.get("rollout")

    @property
    def env(self) -> Optional[WorkerGroup]:
        return self.groups.get("env")

    def looping(self) -> List[WorkerGroup]:
        """The groups that run a loop of their own beside the train step (all but the actor)."""
        return [group for name, group in self.groups.items() if name != "actor"]


def placement_slots(cfg: TrainConfig, topology: Topology, components: Sequence[str]) -> Dict[str, list]:
    """With the Ray backend: Ray started, and each component's (node, device) slots, computed once
    (channel links and the workers' pinning must agree on every node). Nothing in-process."""
    if cfg.cluster.backend != "ray":
        return {}
    init_ray(cfg.cluster.num_nodes)
    from embodied_async.scheduler.worker_group import worker_slots as slots_of

    return {name: slots_of(topology.device_kind, topology.ids(name), cfg.cluster.num_nodes) for name in components}


def start_trainer(actor: WorkerGroup) -> None:
    """The actor ranks join one process group and build, shard and load their policy."""
    host, port = actor.call_rank(0, "master_address").result()
    wait_all(actor.call("init_model", host, port))


class Mode:
    """A training mode (``runner.mode``): builds its graph and supplies the step of the one loop.

    The loop owns stopping, saving, evaluation, metrics and interrupts; a mode says what its graph
    is, what starts after a resume, how a train step's metrics become the step's record, and what
    an evaluation needs first.
    """

    name = ""  # the prefix of its log lines
    evaluate_method = "evaluate"  # the rollout worker's method an evaluation calls
    trains = True  # False: no actor, so no checkpoints to write or resume from (a collection)

    def __init__(self, cfg: TrainConfig, topology: Topology):
        self.cfg, self.topology = cfg, topology

    def build(self) -> Graph:
        raise NotImplementedError

    def start(self, graph: Graph) -> List[Pending]:
        """After the build (and a resume): start what runs beside the train step; its loops, which
        the runner watches while it waits."""
        return []

    def step(self, graph: Graph) -> List[Pending]:
        """Submit one step's work (a training step: the actor's update)."""
        return graph.actor.call("train_step")

    def take_step(self, results: list) -> Dict[str, float]:
        """The finished step's metrics from its calls' ``results`` (also after Ctrl-C: a mode that
        keeps what a step made, e.g. a collection's episodes, keeps it here)."""
        return results[0]

    def done(self, step: int) -> bool:
        """Whether the mode's work is over after ``step`` steps."""
        return step >= self.cfg.runner.max_steps

    def close(self) -> None:
        """At the end of the run, however it ends, before the workers stop: close what the mode
        writes (a dataset)."""

    def summary(self) -> Dict[str, object]:
        """What the mode adds to the run's result."""
        return {}

    def version_after_step(self, metrics: Dict[str, float], step: int) -> int:
        """The policy version the trainer holds after the step that reported ``metrics``."""
        raise NotImplementedError

    def step_record(self, graph: Graph, metrics: Dict[str, float], interval_s: float,
                    loops: List[Pending]) -> Dict[str, float]:
        """A step's record from the trainer's ``metrics`` (and whatever else the mode pools), over
        ``interval_s`` seconds of training since the last one."""
        return dict(metrics)

    def on_evaluation_due(self, graph: Graph, record: Dict[str, float]) -> None:
        """At every evaluation step, before the checkpoint: add what the mode measures then."""

    def before_evaluation(self, graph: Graph) -> None:
        """Right before an evaluation is launched: make the trained weights reach the evaluator."""

    def progress_line(self, record: Dict[str, float], max_steps: int, last_eval: Optional[float]) -> str:
        raise NotImplementedError
