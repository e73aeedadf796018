"""The one step loop, for every mode: it asks the mode (``runner.mode``, ``modes.MODES``) for its
graph and its step (a training mode's step: the actor ranks' ``train_step``; a collection's: an
episode per env worker; an evaluation's: every evaluator's share), and owns what every run does
around them: stopping (``max_steps`` or the mode's own end, ``max_env_steps``,
``stop_at_eval_success``), checkpoints (through ``run_folder``, for a mode that trains),
evaluations (beside training or paused), metrics and progress, and the signals that stop or
checkpoint a run (``signals``: Ctrl-C, a scheduler's SIGTERM, SIGUSR1). It owns no model math."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import signal
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from embodied_async import run_folder, signals
from embodied_async.config import Topology, TrainConfig, resolve_topology
from embodied_async.evaluation import write_videos
from embodied_async.metrics import MetricLogger, print_progress
from embodied_async.private_files import make_log_folder
from embodied_async.runner.graph import Graph
from embodied_async.runner.modes import MODES
from embodied_async.runner.replacement import replace_in_place
from embodied_async.scheduler.worker_group import (
    Pending,
    WorkerDied,
    WorkerFailed,
    WorkerHung,
    wait_all,
    wait_answers,
)
from embodied_async.signals import deferred, preempted, stop_signal, take_save_request

INTERRUPT_GRACE_S = 8.0  # how long Ctrl-C waits for the update in flight before saving
HANG_CHECK_S = 5.0  # how often a step that has not finished looks for a hung worker (runner.hang_timeout_s)
TOTALS = ("time/env", "time/rollout", "time/actor_training")  # summed over the run into its result


class Runner:
    """Drives one run. ``topology``: the one ``config.resolve`` returned with ``cfg`` (resolved
    here when not given)."""

    def __init__(self, cfg: TrainConfig, topology: Optional[Topology] = None, restart: Optional[Dict] = None,
                 faults=None):
        self.cfg = cfg
        self.restart = restart  # a healed fault's record (runner/healing.py), logged once the workers run again
        # healing (runner.restarts_per_hour > 0): the run's faults so far (faults.Faults), and each
        # env rank's link generation in this attempt (one more per replacement at either end)
        self.faults = faults
        self.link_generations: Dict[int, int] = {}
        self.metric_logger: Optional[MetricLogger] = None  # while the run trains: where a replacement is logged
        self.topology = topology if topology is not None else resolve_topology(cfg)
        self.mode = MODES[cfg.runner.mode](cfg, self.topology)
        self.log_path = cfg.runner.logger.log_path
        make_log_folder(self.log_path)
        self.checkpoint_root = run_folder.checkpoints_root(self.log_path)
        self.state = run_folder.read_runner_state(cfg.runner.resume_dir)
        if cfg.runner.resume_dir:
            run_folder.check_resume_model(cfg.runner.resume_dir, cfg.model)
        if cfg.model.init_from:
            run_folder.check_init_from(cfg.model.init_from, cfg.model)
        self.graph: Optional[Graph] = None
        self.worker_nodes: Dict[str, list] = {}  # component -> the Ray node of each worker (several nodes)
        self.loops: List[Pending] = []
        self.in_flight: List[Pending] = []
        self.eval_in_flight: Optional[Pending] = None
        self.longest_update_s = 0.0  # the actor's longest update of this attempt: its hang bound
        self.eval_launched_at = 0  # the step an evaluation in flight was launched at (its videos' folder)
        self.videos_to_log: list = []  # (launch step, videos) of finished evaluations, for TensorBoard
        self.last_eval: Optional[float] = None
        self.totals: Dict[str, float] = {}
        # a resumed run's own checkpoint is already on disk: never rewrite it for nothing
        self.last_saved_step: Optional[int] = self.state["step"] if cfg.runner.resume_dir else None
        self.started = False

    def log(self, message: str) -> None:
        try:
            print(f"[{self.mode.name}] {message}", flush=True)
        except OSError:  # a terminal that hung up or a closed pipe must not stop a save
            pass

    # ---- start-up ----------------------------------------------------------------------------
    def _start(self) -> None:
        cfg = self.cfg
        self.log(f"building workers (mode {cfg.runner.mode}, placement {dict(cfg.cluster.component_placement)}, "
                 f"backend {cfg.cluster.backend})")
        self.graph = graph = self.mode.build()
        if not self.mode.trains:  # nothing to resume or to save
            self.loops = self.mode.start(graph)
            self.started = True
            return
        if cfg.cluster.backend == "ray" and cfg.cluster.num_nodes > 1:
            # asked from inside each worker: where the processes really run
            self.worker_nodes = {group.name: group.placed_nodes() for group in graph.groups.values()}
            self.log("nodes: " + "; ".join(f"{name} on {[node[:8] for node in nodes]}"
                                           for name, nodes in self.worker_nodes.items()))
        if cfg.runner.resume_dir:
            try:
                versions = wait_all(graph.actor.call("load_checkpoint", cfg.runner.resume_dir))
            except Exception as err:
                raise RuntimeError(f"could not resume from runner.resume_dir={cfg.runner.resume_dir!r}: the "
                                   "checkpoint must come from a run with the same model config. "
                                   f"Loading failed with: {err}") from err
            self.log(f"resumed from {cfg.runner.resume_dir}: step {self.state['step']}, version {versions[0]}")
        self._warn_if_short_of_space()
        self.loops = self.mode.start(graph)
        self.started = True

    def _warn_if_short_of_space(self) -> None:
        """Warn when the log folder's filesystem cannot hold the checkpoints this run will keep."""
        runner = self.cfg.runner
        written = runner.max_steps // runner.save_interval + 1 if runner.save_interval else 1
        # a new checkpoint is complete before the oldest goes
        kept = min(written, runner.keep_checkpoints + 1) if runner.keep_checkpoints else written
        size = wait_all(self.graph.actor.call("checkpoint_bytes"), timeout=60)[0]
        free = shutil.disk_usage(self.log_path).free
        if free < kept * size:
            self.log(f"warning: {free / 2**20:.0f} MiB are free where the run writes ({self.log_path}) and its "
                     f"checkpoints will take about {kept * size / 2**20:.0f} MiB ({kept} of ~{size / 2**20:.1f} MiB): "
                     "set runner.keep_checkpoints, a larger runner.save_interval, or another runner.logger.log_path")

    # ---- the loop ----------------------------------------------------------------------------
    def _train(self, logger: MetricLogger) -> None:
        self.metric_logger = logger
        start_time, last_time = time.time(), time.time()
        wall_offset = self.state.get("wall_time_s", 0.0)
        paused_at_last = self.state.get("eval_paused_s", 0.0)
        if self.restart is not None:  # the gap: from the fault to the workers running again
            record = {key: value for key, value in self.restart.items() if key != "heal/fault_time"}
            logger.log({**record, "heal/gap_s": time.time() - self.restart["heal/fault_time"]})
        while not self.mode.done(self.state["step"]):
            with deferred():  # a stop must not fall between submitting and recording the call
                self.in_flight = self.mode.step(self.graph)
            in_flight = self.in_flight
            metrics = self._count_finished_step(self._healing(lambda: self._wait_watching_hangs(in_flight)))
            self.in_flight = []
            now, paused_s = time.time(), self.state.get("eval_paused_s", 0.0)
            # the interval's throughput leaves out a paused evaluation inside it
            interval_s = now - last_time - (paused_s - paused_at_last)
            record = self._healing(lambda: self.mode.step_record(self.graph, metrics, interval_s, self.loops))
            last_time, paused_at_last = now, paused_s
            self.state["env_steps"] += int(record.get("env/env_steps", 0))
            self.state["wall_time_s"] = wall_offset + now - start_time
            record.update(step=self.state["step"], env_steps=self.state["env_steps"],
                          wall_time_s=self.state["wall_time_s"], train_time_s=self.state["wall_time_s"] - paused_s)
            for key in TOTALS:
                if key in record:
                    self.totals[key] = self.totals.get(key, 0.0) + record[key]
            last = self._after_step(record)
            self._log_step(logger, record)
            if last:
                break

    def _wait_watching_hangs(self, pending: List[Pending]) -> list:
        """``wait_all(pending)`` watching the loops; with ``runner.hang_timeout_s``, a looping worker
        busy in one section (or silent) for longer is a ``WorkerHung`` naming it and its activity."""
        timeout = self.cfg.runner.hang_timeout_s
        if not timeout:
            return wait_all(pending, watch=self.loops)
        while True:
            try:
                return wait_all(pending, watch=self.loops, timeout=min(timeout / 4, HANG_CHECK_S))
            except TimeoutError:
                check_hangs(self.graph, timeout, self._update_limit())

    def _update_limit(self) -> Optional["BusyLimit"]:
        """How long the actor's update may take before it is hung (``runner.update_hang_factor``
        times the longest of this attempt's updates, at least ``runner.hang_timeout_s``), and why."""
        factor, longest = self.cfg.runner.update_hang_factor, self.longest_update_s
        if not factor or not longest:
            return None
        limit = max(factor * longest, self.cfg.runner.hang_timeout_s)
        return BusyLimit(limit, f"runner.update_hang_factor={factor:g} x its longest update so far ({longest:.1f} s)")

    def _healing(self, wait: Callable[[], Any]) -> Any:
        """``wait()``, again after each dead or hung worker it meets was replaced in place
        (``replacement.replace_in_place``: an env or rollout worker)."""
        while True:
            try:
                return wait()
            except (WorkerDied, WorkerHung) as fault:
                if not replace_in_place(self, fault):
                    raise

    def _after_step(self, record: Dict) -> bool:
        """Evaluate, stop and save as the step that made ``record`` calls for; True to stop."""
        cfg, step = self.cfg.runner, self.state["step"]
        last = self.mode.done(step) or bool(cfg.max_env_steps and self.state["env_steps"] >= cfg.max_env_steps)
        due = bool(cfg.val_check_interval) and (step % cfg.val_check_interval == 0 or last)
        paused = cfg.eval_pauses_training
        if take_save_request() and self.last_saved_step != step and self.mode.trains:  # SIGUSR1: a scheduler's
            self.log(f"SIGUSR1: {self._save()} saved; the run goes on")  # warning: now, not after an evaluation
        if due:
            self.mode.on_evaluation_due(self.graph, record)
        if paused and due:
            if last:  # a failing evaluation must not lose the final state
                self._save()
            self._evaluate_paused(record)
        self._take_eval(record, wait=last)  # at the end, let an older evaluation finish first
        reached = not last and cfg.stop_at_eval_success is not None and "eval/success_rate" in record \
            and self.last_eval >= cfg.stop_at_eval_success
        if reached:  # this record keeps that evaluation: no final one of a later version
            self.log(f"evaluation of version {int(record['eval/version'])} reached success rate {self.last_eval:.3f} "
                     f">= runner.stop_at_eval_success={cfg.stop_at_eval_success}: stopping")
            last = True
        if (last or (cfg.save_interval and step % cfg.save_interval == 0)) and self.last_saved_step != step:
            self._save()  # before the final evaluation, so a failing evaluation loses nothing
        if due and not reached and not paused and self.graph.rollout is not None:
            self._launch_eval()
            if last:  # the last record carries the final policy's evaluation
                self._take_eval(record, wait=True)
                self.log(f"final eval at step {step}: success rate {self.last_eval:.3f}")
        return last

    def _log_step(self, logger: MetricLogger, record: Dict) -> None:
        logger.log(record)
        for launched_at, videos in self.videos_to_log:  # at the step whose policy they show
            logger.log_videos(videos, launched_at, self.cfg.runner.eval_video_fps)
        self.videos_to_log = []
        print_progress(self.mode.progress_line(record, self.cfg.runner.max_steps, self.last_eval))

    def _count_finished_step(self, results: list) -> Dict[str, float]:
        """Count a finished step (also one that finished after Ctrl-C), so a checkpoint says what it
        holds; its metrics."""
        metrics = self.mode.take_step(results)
        self.longest_update_s = max(self.longest_update_s, metrics.get("time/actor_training", 0.0))
        self.state["step"] += 1
        self.state["version"] = self.mode.version_after_step(metrics, self.state["step"])
        return metrics

    # ---- evaluation --------------------------------------------------------------------------
    def _launch_eval(self, pause_training: bool = False) -> None:
        if self.eval_in_flight is None:
            self.mode.before_evaluation(self.graph)
            self.eval_launched_at = self.state["step"]
            self.eval_in_flight = self.graph.rollout.call_rank(
                0, self.mode.evaluate_method, self.cfg.runner.eval_episodes, self.cfg.runner.eval_num_envs,
                pause_training, self.state["version"])

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
            folder = run_folder.videos_folder(self.log_path, self.eval_launched_at)
            with run_folder.storage_errors_end_the_run(f"the evaluation videos in {folder}", self.log_path,
                                                       silent_writer=True):
                write_videos(videos, folder, self.cfg.runner.eval_video_fps)
            self.log(f"{len(videos)} evaluation videos written to {folder}")
            self.videos_to_log.append((self.eval_launched_at, videos))
        record.update(result)
        self.last_eval = result["eval/success_rate"]

    # ---- checkpoints, Ctrl-C, shutdown -------------------------------------------------------
    def _save(self) -> Optional[str]:
        if not self.mode.trains:
            return None

        def write_contents(folder: str) -> int:
            return wait_all(self.graph.actor.call("save_checkpoint", folder), timeout=600)[0]

        with deferred():  # a stop that comes meanwhile waits until the checkpoint is written and counted
            path = run_folder.write_checkpoint(self.checkpoint_root, self.state["step"], write_contents, self.state,
                                               self.cfg.runner.resume_dir)
            self.last_saved_step = self.state["step"]
            self.log(f"checkpoint saved: {path}")
            keep = self.cfg.runner.keep_checkpoints
            protect = (path, self.cfg.runner.resume_dir)
            for old in run_folder.prune_checkpoints(self.checkpoint_root, keep, self.state["step"], protect):
                self.log(f"removed old checkpoint {old} (runner.keep_checkpoints={keep})")
        return path

    def _on_stop(self) -> Optional[str]:
        """Ctrl-C or a scheduler's SIGTERM: let the step in flight finish (briefly), save, then
        stop everything; returns the checkpoint holding the run's state (None: there is none).
        Further signals are only recorded (``signals``): they must not cut the checkpoint short."""
        grace = self.cfg.runner.preemption_grace_s / 2 if preempted() else INTERRUPT_GRACE_S
        what = f"preempted ({signal.Signals(stop_signal()).name})" if preempted() else "interrupted"
        self.log(f"{what}: finishing the step in flight" + (" and saving a checkpoint" if self.mode.trains else ""))
        self._save_after_stop(grace)
        saved = run_folder.latest_checkpoint(self.checkpoint_root)
        return saved or self.cfg.runner.resume_dir

    def _save_after_stop(self, grace_s: float) -> None:
        if not self.started:  # still starting (maybe loading the checkpoint we resume from): save nothing
            self.log("stopped during start-up: no new checkpoint written")
            return
        if self.in_flight:
            try:
                self._count_finished_step(wait_all(self.in_flight, watch=self.loops, timeout=grace_s))
            except (TimeoutError, WorkerFailed) as err:
                # the trainer is mid-step: its state is not a consistent checkpoint
                self.log(f"the step in flight did not finish ({err}); the last saved checkpoint "
                         f"(step {self.last_saved_step}) stays as it was")
                return
        self._stop_loops()
        if self.last_saved_step != self.state["step"]:
            self._save()

    def _close(self, logger: MetricLogger, failed: bool) -> None:
        """Close the metrics and stop every process. When the run is already ending with an error
        (or a stop), a metrics file that cannot be closed is said, not raised over that error."""
        try:
            self.mode.close()
            logger.close()
        except (run_folder.StorageError, OSError) as err:
            if not failed:
                raise
            self.log(f"the run's outputs could not be closed as it ended: {err}")
        finally:
            self._shutdown()

    def _stop_loops(self) -> None:
        for group in self.graph.looping():
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
        for channel in (self.graph.channels.named().values() if self.graph.channels else ()):
            try:
                getattr(channel, "destroy", channel.close)()
            except Exception:
                pass
        for pending in [*self.in_flight, *filter(None, [self.eval_in_flight])]:
            try:  # failed with its channels: taken here, so Ray does not print it as an unhandled error
                pending.result(timeout=5)
            except Exception:
                pass
        for group in self.graph.groups.values():
            try:
                wait_all(group.call("close"), timeout=5)
            except Exception:
                pass
            group.shutdown()

    def run(self) -> Dict[str, float]:
        """Train to ``runner.max_steps``; saves the last completed step on a normal end and on Ctrl-C."""
        signals.reset()  # a stop or a checkpoint request of an earlier run in this process is not this one's
        logger_cfg = self.cfg.runner.logger
        # the trackers record the resolved config (every default filled in) as plain data
        logger = MetricLogger(self.log_path, logger_cfg.backends, logger_cfg.project, dataclasses.asdict(self.cfg))
        failed = True
        try:
            self._start()
            self._train(logger)
            failed = False
        except KeyboardInterrupt as stop:  # Ctrl-C, or a scheduler's SIGTERM (signals.preempted())
            stop.checkpoint = self._on_stop()
            raise
        finally:
            with contextlib.suppress(KeyboardInterrupt), deferred():  # the run is over: no process left behind
                self._close(logger, failed)
        return {"step": self.state["step"], "env_steps": self.state["env_steps"], "eval/success_rate": self.last_eval,
                "wall_time_s": self.state.get("wall_time_s", 0.0), **self.totals, **self.mode.summary()}


class BusyLimit(NamedTuple):
    """How long a worker may stay in one section before it is hung, and the setting that says so
    (for the message)."""

    seconds: float
    setting: str


def check_hangs(graph: Graph, timeout: float, update_limit: Optional[BusyLimit] = None) -> None:
    """``WorkerHung`` for the first worker (one with a ``heartbeat``) not answering within
    ``timeout`` seconds, or busy in one section for longer than its bound: a looping worker's is
    ``timeout``, the actor's ``update_limit`` (None: none). The section
    names what it was doing (``env``: stepping its simulators; ``rollout``: computing actions;
    ``update``: the actor's update)."""
    bounds = [(group, BusyLimit(timeout, f"runner.hang_timeout_s={timeout:g}")) for group in graph.looping()]
    if "actor" in graph.groups:
        bounds.append((graph.actor, update_limit))
    for group, bound in bounds:
        if not hasattr(group.cls, "heartbeat"):
            continue
        busy = wait_answers(group.call("heartbeat"), timeout=timeout)
        for rank, section in enumerate(busy):
            if section is not None and bound is not None and section[1] > bound.seconds:
                raise WorkerHung(f"{group.name}[{rank}] hung: busy in its '{section[0]}' section for "
                                 f"{section[1]:.0f} s, more than {bound.setting}", (group.name, rank))
