"""The runner: wires env -> rollout -> actor in one function, drives training steps, logs,
evaluates and checkpoints. It owns no model math.

Synchronous PPO is the same graph with ``algorithm.staleness_threshold: 0``: the rollout then
waits for each update before it collects the next batch, so nothing overlaps.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from embodied_async.algorithms.version_gate import VersionGate
from embodied_async.checkpoint_io import CheckpointError, assert_no_pickle, verify_checkpoint, write_manifest
from embodied_async.config import Topology, TrainConfig, resolve_topology
from embodied_async.contracts import EnvSpec
from embodied_async.evaluation import write_videos
from embodied_async.metrics import MetricLogger, pool_env_metrics, print_progress, progress_line
from embodied_async.private_files import make_log_folder
from embodied_async.scheduler.graph_channels import GraphChannels
from embodied_async.scheduler.worker_group import Pending, WorkerFailed, WorkerGroup, init_ray, wait_all
from embodied_async.workers.actor_worker import ActorWorker
from embodied_async.workers.env_worker import EnvWorker
from embodied_async.workers.rollout_worker import RolloutWorker
from embodied_async.workers.trainer_core import check_init_from

INTERRUPT_GRACE_S = 8.0  # how long Ctrl-C waits for the update in flight before saving


@contextlib.contextmanager
def deferred_sigint():
    """Hold back Ctrl-C inside the block; a Ctrl-C that came meanwhile is raised right after it.

    (Masking the signal would not do: any of Ray's threads may receive it, and Python still raises
    it in the main thread. A handler that only records it does.)
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda *_: received.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt

@dataclass
class Graph:
    env: Optional[WorkerGroup]  # None in a supervised run (the rollout only evaluates)
    rollout: Optional[WorkerGroup]  # None in a supervised run that never evaluates
    actor: WorkerGroup
    channels: GraphChannels
    env_spec: EnvSpec

    def groups(self) -> List[WorkerGroup]:
        return [g for g in (self.env, self.rollout, self.actor) if g is not None]


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


def build_graph(cfg: TrainConfig, topology: Topology) -> Graph:
    """Create channels and the three worker groups on the topology; start no loop yet."""
    backend = cfg.cluster.backend
    links, slots = None, {}
    if backend == "ray":
        init_ray(cfg.cluster.num_nodes)
        from embodied_async.scheduler.worker_group import worker_slots

        # computed once: the links below and the workers' pinning must agree on every node
        slots = {name: worker_slots(topology.device_kind, topology.ids(name), cfg.cluster.num_nodes)
                 for name in ("env", "rollout", "actor")}
        if cfg.cluster.channel_transport == "auto":
            links = channel_links(topology, {name: [node for node, _ in s] for name, s in slots.items()})
    channels = GraphChannels.create(backend, trajectory_depth=VersionGate.from_config(cfg.algorithm).capacity,
                                    links=links)
    common = dict(cfg=cfg, topology=topology, channels=channels)
    groups = dict(topology=topology, backend=backend)
    env = WorkerGroup("env", EnvWorker, kwargs_for=lambda r: dict(common, rank=r), slots=slots.get("env"), **groups)
    env_spec = env.call_rank(0, "spec").result()
    if cfg.algorithm.demo_loss_coef > 0:  # here, before the actor opens it: a dataset that does not fit is one line
        from embodied_async.datasets.batches import open_dataset

        reader, keys = open_dataset(cfg.dataset.root, cfg.dataset.keys, env_spec)
        print(f"[ppo] demonstrations in the loss (algorithm.demo_loss_coef={cfg.algorithm.demo_loss_coef}): "
              f"{cfg.dataset.root}, {reader.num_episodes} episodes, {len(reader)} frames; inputs {keys}", flush=True)
    rollout = WorkerGroup("rollout", RolloutWorker, kwargs_for=lambda r: dict(common, rank=r, env_spec=env_spec),
                          slots=slots.get("rollout"), **groups)
    actor = WorkerGroup("actor", ActorWorker, kwargs_for=lambda r: dict(common, rank=r, env_spec=env_spec),
                        slots=slots.get("actor"), **groups)
    host, port = actor.call_rank(0, "master_address").result()
    wait_all(actor.call("init_model", host, port))
    return Graph(env, rollout, actor, channels, env_spec)


def save_checkpoint(graph: Graph, root: str, step: int, state: Dict) -> str:
    """Write ``root/global_step_<step>``; a crash at any point leaves every earlier checkpoint whole.

    Everything goes to a temporary folder first, sealed by a manifest of sizes and sha256 digests;
    an existing folder of the same step is moved aside before the rename and deleted only after it.
    Only safetensors and JSON are written: loading a checkpoint never unpickles.
    """
    final = os.path.join(root, f"global_step_{step}")
    tmp, old = final + ".tmp", final + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    version = wait_all(graph.actor.call("save_checkpoint", tmp), timeout=600)[0]
    # the actor's version is the truth: an update the runner had not seen yet is in the checkpoint
    state = dict(state, version=version, step=max(state["step"], version))
    with open(os.path.join(tmp, "runner.json"), "w") as f:
        json.dump(state, f)
    write_manifest(tmp)
    if os.path.exists(final):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    with open(os.path.join(root, "latest.tmp"), "w") as f:
        f.write(os.path.basename(final) + "\n")
    os.replace(os.path.join(root, "latest.tmp"), os.path.join(root, "latest"))
    return final


def prune_checkpoints(root: str, keep: Optional[int], current_step: int, protect: Sequence[Optional[str]] = ()
                      ) -> List[str]:
    """Delete the oldest ``global_step_<N>`` folders with ``N <= current_step`` until ``keep`` of
    those remain (None: keep all). Folders of later steps (left by an earlier run that went
    further before this one resumed from an older checkpoint) are neither counted nor deleted,
    and neither is anything in ``protect`` (the checkpoint just written, the resume source)."""
    if keep is None:
        return []
    steps = []
    for name in os.listdir(root):
        match = re.fullmatch(r"global_step_(\d+)", name)
        if match and int(match.group(1)) <= current_step and os.path.isdir(os.path.join(root, name)):
            steps.append((int(match.group(1)), os.path.join(root, name)))
    steps.sort()
    protected = {os.path.realpath(p) for p in protect if p}
    deleted = []
    for _, path in steps[:max(0, len(steps) - keep)]:
        if os.path.realpath(path) not in protected:
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
    return deleted


def check_checkpoint_model(resume_dir: str, model_cfg) -> None:
    """A checkpoint resumes only into the policy family it was written by; one holding only the
    trainable weights (adapters, value head) names the base they were trained on, and a different
    ``model.path`` is reported (the same base may live under another path, e.g. the tiny
    recipe's, made afresh in each run's folder)."""
    path = os.path.join(resume_dir, "model_info.json")
    if not os.path.isfile(path):
        return
    with open(path) as f:
        info = json.load(f)
    if info.get("family") != model_cfg.name:
        raise CheckpointError(f"runner.resume_dir={resume_dir!r} holds a '{info.get('family')}' policy, but this run's "
                              f"model.name is '{model_cfg.name}': resume it with the model config it was trained with")
    base = getattr(model_cfg, "path", None)
    if info.get("contents") == "trainable" and info.get("base") != base:
        print(f"[runner] warning: {resume_dir} holds trainable weights for the base {info.get('base')!r}, and this "
              f"run's model.path is {base!r}; they only fit the base they were trained on", flush=True)


def read_resume_state(resume_dir: Optional[str]) -> Dict:
    """The runner's counters from a checkpoint, after checking every file of it is whole."""
    if not resume_dir:
        return {"step": 0, "env_steps": 0, "version": 0}
    try:
        assert_no_pickle(resume_dir)
        verify_checkpoint(resume_dir)
    except CheckpointError as err:
        raise CheckpointError(f"runner.resume_dir={resume_dir!r}: {err}") from None
    with open(os.path.join(resume_dir, "runner.json")) as f:
        return json.load(f)


class Runner:
    """Drives one run. ``topology``: the one ``config.resolve`` returned with ``cfg`` (resolved
    here when not given)."""

    evaluate_method = "evaluate"  # the rollout worker's method an evaluation calls

    def __init__(self, cfg: TrainConfig, topology: Optional[Topology] = None):
        self.cfg = cfg
        self.topology = topology if topology is not None else resolve_topology(cfg)
        self.log_path = cfg.runner.logger.log_path
        make_log_folder(self.log_path)
        self.checkpoint_root = os.path.join(self.log_path, "checkpoints")
        self.state = read_resume_state(cfg.runner.resume_dir)
        if cfg.runner.resume_dir:
            check_checkpoint_model(cfg.runner.resume_dir, cfg.model)
        if cfg.model.init_from:
            check_init_from(cfg.model.init_from, cfg.model)
        self.graph: Optional[Graph] = None
        self.worker_nodes: Dict[str, list] = {}  # component -> the Ray node of each worker (several nodes)
        self.loops: List[Pending] = []
        self.in_flight: List[Pending] = []
        self.eval_in_flight: Optional[Pending] = None
        self.eval_launched_at = 0  # the step an evaluation in flight was launched at (its videos' folder)
        self.videos_to_log: list = []  # (launch step, videos) of finished evaluations, for TensorBoard
        self.last_eval: Optional[float] = None
        self.totals: Dict[str, float] = {}
        # a resumed run's own checkpoint is already on disk: never rewrite it for nothing
        self.last_saved_step: Optional[int] = self.state["step"] if cfg.runner.resume_dir else None
        self.started = False

    # ---- start-up ----------------------------------------------------------------------------
    def _start(self) -> None:
        cfg = self.cfg
        print(f"[runner] building workers (placement {dict(cfg.cluster.component_placement)}, "
              f"backend {cfg.cluster.backend})", flush=True)
        self.graph = graph = build_graph(cfg, self.topology)
        if cfg.runner.stop_at_eval_success is not None and not graph.env_spec.reports_success:
            raise ValueError(f"runner.stop_at_eval_success={cfg.runner.stop_at_eval_success}, but this env reports no "
                             "success, so it would never stop there: remove runner.stop_at_eval_success")
        if cfg.cluster.backend == "ray" and cfg.cluster.num_nodes > 1:
            # asked from inside each worker: where the processes really run
            self.worker_nodes = {group.name: group.placed_nodes() for group in graph.groups()}
            print("[runner] nodes: " + "; ".join(f"{name} on {[node[:8] for node in nodes]}"
                                                 for name, nodes in self.worker_nodes.items()), flush=True)
        if cfg.runner.resume_dir:
            try:
                versions = wait_all(graph.actor.call("load_checkpoint", cfg.runner.resume_dir))
            except Exception as err:
                raise RuntimeError(f"could not resume from runner.resume_dir={cfg.runner.resume_dir!r}: the "
                                   "checkpoint must come from a run with the same model config. "
                                   f"Loading failed with: {err}") from err
            print(f"[runner] resumed from {cfg.runner.resume_dir}: step {self.state['step']}, "
                  f"version {versions[0]}", flush=True)
        wait_all(graph.actor.call("publish_weights"))
        self.loops = graph.env.call("run") + graph.rollout.call("run")
        self.started = True

    def _accumulate(self, metrics: Dict[str, float]) -> None:
        for key in ("time/env", "time/rollout", "time/actor_training"):
            self.totals[key] = self.totals.get(key, 0.0) + metrics.get(key, 0.0)

    def _launch_eval(self, pause_training: bool = False) -> None:
        if self.eval_in_flight is None:
            self.eval_launched_at = self.state["step"]
            self.eval_in_flight = self.graph.rollout.call_rank(
                0, self.evaluate_method, self.cfg.runner.eval_episodes, self.cfg.runner.eval_num_envs, pause_training,
                self.state["version"])

    def _evaluate_paused(self, record: Dict) -> None:
        """``runner.eval_pauses_training``: evaluate the version just trained while the graph stands
        still (no update is asked for, the rollout acts for no env); its seconds are left out of
        ``train_time_s``."""
        start = time.time()
        self._launch_eval(pause_training=True)
        self._take_eval(record, wait=True)
        self.state["eval_paused_s"] = self.state.get("eval_paused_s", 0.0) + time.time() - start

    def _take_eval(self, record: Dict, wait: bool) -> None:
        """Add a finished evaluation's results to ``record`` (waiting for it when ``wait``)."""
        if self.eval_in_flight is None or not (wait or self.eval_in_flight.done()):
            return
        result = wait_all([self.eval_in_flight], watch=self.loops, timeout=600 if wait else None)[0]
        self.eval_in_flight = None
        videos = result.pop("videos", [])
        if videos:
            folder = os.path.join(self.log_path, "videos", f"step_{self.eval_launched_at}")
            write_videos(videos, folder, self.cfg.runner.eval_video_fps)
            print(f"[runner] {len(videos)} evaluation videos written to {folder}", flush=True)
            self.videos_to_log.append((self.eval_launched_at, videos))
        record.update(result)
        self.last_eval = result["eval/success_rate"]

    def _collect_metrics(self, actor_metrics: Dict, interval_s: float) -> Dict[str, float]:
        graph = self.graph
        env_parts = wait_all(graph.env.call("pop_metrics"), watch=self.loops)
        rollout_parts = wait_all(graph.rollout.call("pop_metrics"), watch=self.loops)
        record = dict(actor_metrics)
        record.update(pool_env_metrics(env_parts, interval_s))
        for key in rollout_parts[0]:  # time/*: mean over the rollout workers; CPU and traffic: sums
            total = sum(p[key] for p in rollout_parts)
            record[key] = total / len(rollout_parts) if key.startswith("time/") else total
        for name, channel in graph.channels.named().items():
            record[f"channel/{name}_qsize"] = float(channel.qsize())  # flat over a long run (scripts/soak.py)
        return record

    # ---- the loop ----------------------------------------------------------------------------
    def _train(self, logger: MetricLogger) -> None:
        cfg, graph = self.cfg, self.graph
        start_time, last_time = time.time(), time.time()
        wall_offset = self.state.get("wall_time_s", 0.0)
        paused = cfg.runner.eval_pauses_training
        paused_at_last = self.state.get("eval_paused_s", 0.0)
        while self.state["step"] < cfg.runner.max_steps:
            with deferred_sigint():  # Ctrl-C must not fall between submitting and recording the call
                self.in_flight = graph.actor.call("train_step")
            actor_metrics = wait_all(self.in_flight, watch=self.loops)[0]
            self.state["step"] += 1
            self.state["version"] = int(actor_metrics["train/actor/current_version"]) + 1
            self.in_flight = []
            now, paused_s = time.time(), self.state.get("eval_paused_s", 0.0)
            # the interval's throughput leaves out a paused evaluation inside it
            record = self._collect_metrics(actor_metrics, now - last_time - (paused_s - paused_at_last))
            last_time, paused_at_last = now, paused_s
            self.state["env_steps"] += int(record["env/env_steps"])
            self.state["wall_time_s"] = wall_offset + now - start_time
            record.update(step=self.state["step"], env_steps=self.state["env_steps"],
                          wall_time_s=self.state["wall_time_s"], train_time_s=self.state["wall_time_s"] - paused_s)
            self._accumulate(record)
            step = self.state["step"]
            last = step >= cfg.runner.max_steps or bool(
                cfg.runner.max_env_steps and self.state["env_steps"] >= cfg.runner.max_env_steps)
            interval = cfg.runner.val_check_interval
            due = bool(interval) and (step % interval == 0 or last)
            if paused and due:
                if last:  # a failing evaluation must not lose the final state
                    self._save()
                self._evaluate_paused(record)
            self._take_eval(record, wait=last)  # at the end, let an older evaluation finish first
            target = cfg.runner.stop_at_eval_success
            reached = not last and target is not None and "eval/success_rate" in record and self.last_eval >= target
            if reached:  # this record keeps that evaluation: no final one of a later version
                print(f"[runner] evaluation of version {int(record['eval/version'])} reached success rate "
                      f"{self.last_eval:.3f} >= runner.stop_at_eval_success={target}: stopping", flush=True)
                last = True
            if (last or (cfg.runner.save_interval and step % cfg.runner.save_interval == 0)) \
                    and self.last_saved_step != step:
                self._save()  # before the final evaluation, so a failing evaluation loses nothing
            if due and not reached and not paused:
                self._launch_eval()
            if last and due and not reached and not paused:  # the last record carries the final policy's evaluation
                self._take_eval(record, wait=True)
                print(f"[runner] final eval at step {step}: success rate {self.last_eval:.3f}", flush=True)
            logger.log(record)
            for launched_at, videos in self.videos_to_log:  # at the step whose policy they show
                logger.log_videos(videos, launched_at, cfg.runner.eval_video_fps)
            self.videos_to_log = []
            print_progress(progress_line(record, cfg.runner.max_steps, self.last_eval))
            if last:
                break

    def _save(self) -> str:
        path = save_checkpoint(self.graph, self.checkpoint_root, self.state["step"], dict(self.state))
        self.last_saved_step = self.state["step"]
        print(f"[runner] checkpoint saved: {path}", flush=True)
        protect = (path, self.cfg.runner.resume_dir)
        keep = self.cfg.runner.keep_checkpoints
        for old in prune_checkpoints(self.checkpoint_root, keep, self.state["step"], protect):
            print(f"[runner] removed old checkpoint {old} (runner.keep_checkpoints={self.cfg.runner.keep_checkpoints})",
                  flush=True)
        return path

    def _on_interrupt(self) -> None:
        """Ctrl-C: let the update in flight finish (briefly), save, then stop everything."""
        print("\n[runner] interrupted: finishing the update in flight and saving a checkpoint", flush=True)
        if not self.started:  # still starting (maybe loading the checkpoint we resume from): save nothing
            print("[runner] interrupted during start-up: no new checkpoint written", flush=True)
            return
        if self.in_flight:
            try:
                self._count_finished_step(wait_all(self.in_flight, watch=self.loops, timeout=INTERRUPT_GRACE_S)[0])
            except (TimeoutError, WorkerFailed) as err:
                # the actor is mid-update: its state is not a consistent checkpoint
                print(f"[runner] the update in flight did not finish ({err}); the last saved checkpoint "
                      f"(step {self.last_saved_step}) stays as it was", flush=True)
                return
        self._stop_loops()
        if self.last_saved_step != self.state["step"]:
            self._save()

    def _count_finished_step(self, metrics: Dict[str, float]) -> None:
        """An update that finished after Ctrl-C: count it, so the checkpoint says what it holds."""
        self.state["step"] += 1
        self.state["version"] = int(metrics["train/actor/current_version"]) + 1

    def _stop_loops(self) -> None:
        for group in (self.graph.env, self.graph.rollout):
            if group is None:
                continue
            try:
                wait_all(group.call("stop"), timeout=5)
            except Exception:
                pass

    def _shutdown(self) -> None:
        if self.graph is None:
            return
        self._stop_loops()
        try:  # the loops notice the stop flag within a poll interval
            wait_all(self.loops, timeout=3)
        except Exception:
            pass
        for channel in self.graph.channels.named().values():
            try:
                getattr(channel, "destroy", channel.close)()
            except Exception:
                pass
        for group in self.graph.groups():
            try:
                wait_all(group.call("close"), timeout=5)
            except Exception:
                pass
            group.shutdown()

    def run(self) -> Dict[str, float]:
        """Train to ``runner.max_steps``; saves the last completed step on a normal end and on Ctrl-C."""
        logger = MetricLogger(self.log_path, self.cfg.runner.logger.tensorboard)
        try:
            self._start()
            self._train(logger)
        except KeyboardInterrupt:
            self._on_interrupt()
            raise
        finally:
            logger.close()
            self._shutdown()
        return {"step": self.state["step"], "env_steps": self.state["env_steps"], "eval/success_rate": self.last_eval,
                "wall_time_s": self.state.get("wall_time_s", 0.0), **self.totals}


def run(cfg: TrainConfig, topology: Optional[Topology] = None) -> Dict[str, float]:
    """Train as ``runner.mode`` says: the async PPO graph, or supervised steps on a dataset."""
    if cfg.runner.mode == "sft":
        from embodied_async.sft_runner import SupervisedRunner

        return SupervisedRunner(cfg, topology).run()
    return Runner(cfg, topology).run()
