"""Rollout worker: runs the policy without grad, builds trajectories, swaps weights between steps."""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

import numpy as np
import torch

from embodied_async.algorithms.version_gate import VersionGate
from embodied_async.data import ActionMessage, EnvOutput, StepRecord, Trajectory, WeightMessage, slice_observation
from embodied_async.evaluation import evaluation_seed, run_episodes
from embodied_async.normalization import pop_observation_moments
from embodied_async.registry import build_env, build_policy, reported_logprob_type
from embodied_async.scheduler.channel import ChannelClosed
from embodied_async.scheduler.futures import first_done
from embodied_async.workers.base import (
    BusyTimer,
    HandOver,
    ProcessClock,
    Stopped,
    process_metrics,
    setup_worker_process,
    wait_future,
)

POLL_SECONDS = 0.5
# Evaluation runs one fixed version beside the rollout. A policy up to this size is copied for
# it; a larger one (a 7B VLA: a second copy would take 15 GB of GPU memory) is shared, and
# weight swaps wait until the evaluation ends.
EVAL_COPY_MAX_BYTES = 2**30


class _StreamLost(Exception):
    """The env process of ``stream`` is gone (its channel end closed): the stream waits for the
    runner to replace it."""

    def __init__(self, stream: int):
        super().__init__(stream)
        self.stream = stream


@dataclass
class _StreamBuffer:
    steps: List[StepRecord] = field(default_factory=list)
    pending: Optional[StepRecord] = None  # the last decision, waiting for its outcome
    started: int = 0  # trajectories begun on this stream
    acknowledged: int = 0  # of those, consumed or dropped by the actor (arrives with weights)
    finished: int = 0  # of those, complete and shipped to the actor

    def idle(self) -> bool:
        """Between trajectories: the next decision would begin a new one."""
        return not self.steps and self.pending is None


class RolloutWorker:
    """Serves the env workers ``env_ranks``. Each pipeline stage of each is a stream (its own policy
    batch and trajectories), acted for as soon as its observations arrive: an env process that
    finished its step never waits for another's."""

    def __init__(self, cfg, topology, rank: int, device_id: int, env_spec, channels,
                 link_generations: Optional[Dict[int, int]] = None):
        self.cfg, self.rank, self.env_ranks = cfg, rank, topology.env_ranks(rank)
        seed = cfg.runner.seed * 100_003 + 50_000 + rank
        self.device = setup_worker_process(topology.device_kind, device_id, cfg.cluster.cpu_threads_per_worker, seed)
        self.policy = build_policy(cfg.model, env_spec, device=self.device,
                                   logprob_type=reported_logprob_type(cfg)).eval()
        self.reports_success = env_spec.reports_success
        torch.manual_seed(seed)  # each rollout rank draws its own exploration noise
        self.env_channel, self.action_channel = channels.env_outputs, channels.actions
        self.actor_channel, self.weight_channel = channels.trajectories, channels.weights
        self.actor_world_size = topology.actor_world_size
        self.stream_keys = topology.stream_env_keys(rank)  # stream i: (env rank, stage) it serves
        self.version = -1  # no weights yet: the actor publishes version 0 at start-up
        self.buffers = [_StreamBuffer() for _ in self.stream_keys]
        self.gate = VersionGate.from_config(cfg.algorithm)
        self.drift = cfg.algorithm.batch_from == "first_arrived"  # streams need not keep in step
        self.timer = BusyTimer()
        self.clock = ProcessClock()
        self._policy_lock = threading.Lock()  # weight swaps vs. evaluation in another thread
        # held by the loop while it swaps weights and acts, and by an evaluation that pauses
        # training for its whole length: the env workers then wait for actions, and stand still
        self._acting = threading.Lock()
        self._stop = threading.Event()
        self._eval_env = None
        self._weight_future = None
        self._hold_weights = False  # an evaluation shares the policy: swaps wait
        self._held_message: Optional[WeightMessage] = None
        self._pending_puts: List[Optional[object]] = [None] * len(self.stream_keys)  # actions in flight
        self._output_gets: List[Optional[object]] = [None] * len(self.stream_keys)  # armed gets of env outputs
        # env workers the runner replaced (dead or hung): each env rank's process now, the streams
        # whose process is gone until its replacement comes, the replacements to take in
        # (``link_generations``: this process replaced a dead or hung one, each link's generation)
        self.link_generations = {env_rank: (link_generations or {}).get(env_rank, 0) for env_rank in self.env_ranks}
        self._counts_pending = link_generations is not None  # no trajectory before the actor says where to begin
        self._lost_streams: set = set()
        self._replacements = HandOver()  # of env workers, by env rank
        self.env_channel.listen(self.stream_keys, take_over=link_generations is not None)  # a replacement
        self.weight_channel.listen([rank], take_over=link_generations is not None)

    # ---- weights -------------------------------------------------------------------------
    def _load(self, message: WeightMessage) -> bool:
        """Swap the weights in; False when an evaluation holds them back (kept for later)."""
        with self._policy_lock:
            if self._hold_weights:  # the newest message carries everything: keep only it
                self._held_message = message
                return False
            result = self.policy.load_state_dict(message.state_dict, strict=False)
            self._check_loaded(result)
            # under the lock: an evaluation starting now sees these weights with their version
            self.version = message.version
            if message.staleness_threshold is not None:
                self.gate = self.gate.with_threshold(message.staleness_threshold)
            for stream, count in message.acknowledged.items():
                self.buffers[int(stream)].acknowledged = int(count)
            if message.shipped is not None and self._counts_pending:  # go on from the counts of the one replaced
                for stream, count in message.shipped.items():
                    self.buffers[int(stream)].started = self.buffers[int(stream)].finished = int(count)
                self._counts_pending = False
        return True

    def _check_loaded(self, result) -> None:
        # only what the actor does not train may be missing (buffers such as observation
        # statistics, frozen weights under LoRA): a renamed parameter would otherwise be skipped
        # silently while the version still advances
        untrained = {name for name, _ in self.policy.named_buffers()}
        untrained |= {name for name, p in self.policy.named_parameters() if not p.requires_grad}
        missing = [k for k in result.missing_keys if k not in untrained]
        if result.unexpected_keys or missing:
            raise RuntimeError(f"published weights do not match the rollout policy: unexpected "
                               f"{result.unexpected_keys[:5]}, missing {missing[:5]}")

    def _poll_weights(self) -> None:
        """Swap in any weights published since the last look (one get is always armed, so a look
        costs no call)."""
        self._apply_held()
        while True:
            if self._weight_future is None:
                self._weight_future = self.weight_channel.get_async(key=self.rank)
            if not self._weight_future.done():
                return
            message = self._weight_future.result()
            self._weight_future = None
            self._load(message)

    def _apply_held(self) -> bool:
        """Load the weights that arrived during an evaluation, once it has ended."""
        with self._policy_lock:
            message = None if self._hold_weights else self._held_message
            self._held_message = None if message is not None else self._held_message
        return message is not None and self._load(message)

    def _wait_for_weights(self) -> None:
        while not self._apply_held():
            if self._weight_future is None:
                self._weight_future = self.weight_channel.get_async(key=self.rank)
            try:
                message = self._weight_future.result(timeout=POLL_SECONDS)
            except TimeoutError:
                if self._stop.is_set():
                    raise Stopped from None
                if self._replacements:  # the loop takes it in: a replaced env may be what the update waits for
                    return
                continue
            self._weight_future = None
            if self._load(message):
                return

    def _may_act(self, stream: int) -> bool:
        """The throttle: a new trajectory begins only while the version gate allows it (which
        bounds its lag by algorithm.staleness_threshold), and once every stream has finished the
        trajectories this one began; one under way always goes on.

        The streams begin their trajectories together, so an update's trajectories start with the
        same weights. Left to drift apart, a stream that finished early would run most of its next
        trajectory on the weights of the update still training (the actor waits for the late
        stream), and the samples' mean lag doubled (0.25 -> 0.51 versions, 8 runs each). Under
        algorithm.batch_from=first_arrived they drift: an update takes whichever arrive first, so a
        stream held for a slow one would hold the updates up again."""
        buf = self.buffers[stream]
        if self.version < 0 or self._counts_pending:  # the actor publishes version 0 at start-up
            return False
        if not buf.idle():
            return True
        in_step = self.drift or all(other.finished >= buf.started for other in self.buffers)
        return in_step and self.gate.may_start(buf.started, buf.acknowledged)

    # ---- the loop ------------------------------------------------------------------------
    def _wait_for_outputs(self, streams: List[int]) -> Optional[int]:
        """The first of ``streams`` whose env outputs have arrived (waiting up to a poll slice);
        None when none has yet. Each stream keeps one get armed, so nothing is taken twice."""
        for stream in streams:
            if self._output_gets[stream] is None:
                self._output_gets[stream] = self.env_channel.get_async(key=self.stream_keys[stream])
        index = first_done([self._output_gets[s] for s in streams], POLL_SECONDS)
        return None if index is None else streams[index]

    def _take_outputs(self, stream: int) -> EnvOutput:
        future, self._output_gets[stream] = self._output_gets[stream], None
        try:
            return wait_future(future, self._stop, POLL_SECONDS)
        except ChannelClosed:  # its env process is gone: the get stays armed for the one replacing it
            self._output_gets[stream] = future
            raise _StreamLost(stream) from None

    def _close_pending(self, buf: _StreamBuffer, out: EnvOutput) -> None:
        step = buf.pending
        # torch.tensor copies: arrays that arrive through Ray are read-only views
        step.rewards = torch.tensor(out.rewards, dtype=torch.float32) * self.cfg.algorithm.reward_scale
        step.dones = torch.tensor(out.dones, dtype=torch.bool)
        step.loss_mask = torch.tensor(out.valid, dtype=torch.bool)
        step.executed_actions = torch.tensor(out.executed_steps(self.cfg.env.num_action_chunks), dtype=torch.int64)
        step.bootstrap_values = torch.zeros_like(step.rewards)
        rows = np.flatnonzero(out.dones & out.bootstrap & out.valid)
        if len(rows):
            with self._policy_lock:
                final_values = self.policy.value(slice_observation(out.final_obs, rows)).float().cpu()
            self._check_finite(bootstrap_values=final_values)
            step.bootstrap_values[torch.as_tensor(rows)] = final_values
        buf.steps.append(step)
        buf.pending = None

    def _finish_trajectory(self, buf: _StreamBuffer, obs) -> List[Trajectory]:
        with self._policy_lock:
            next_values = self.policy.value(obs).float().cpu()
        self._check_finite(next_values=next_values)
        trajectory = Trajectory.stack(buf.steps, next_values, pop_observation_moments(self.policy))
        buf.steps = []
        return trajectory.split(self.actor_world_size)

    def _check_finite(self, **tensors: torch.Tensor) -> None:
        """A policy whose outputs are NaN/inf has diverged: stop with that, not with a poisoned batch."""
        for name, value in tensors.items():
            bad = ~torch.isfinite(value)
            if bad.any():
                rows = torch.nonzero(bad.reshape(bad.shape[0], -1).any(dim=1)).flatten().tolist()
                raise FloatingPointError(
                    f"the rollout policy (version {self.version}) produced non-finite {name} for sub-envs "
                    f"{rows[:8]}: its weights have diverged. Lower actor.lr or actor.max_grad_norm, or resume "
                    "from an earlier checkpoint (runner.resume_dir=logs/<run>/checkpoints/global_step_<N>)")

    def _receive(self, stream: int) -> Optional[EnvOutput]:
        """Take the stream's env outputs (arrived); close the pending step; ship a finished
        trajectory. None for outputs of a replaced env process."""
        buf = self.buffers[stream]
        out = self._take_outputs(stream)
        if out.generation < self.link_generations[self.stream_keys[stream][0]]:
            return None  # sent by a process that was replaced: its trajectory was dropped
        shards = []
        with self.timer.section("rollout"):
            if buf.pending is not None:
                self._close_pending(buf, out)
            if len(buf.steps) == self.cfg.rollout.num_steps:
                shards = self._finish_trajectory(buf, out.obs)
                buf.finished += 1
        for actor_rank, shard in enumerate(shards):
            # one key per (stream, actor rank): every actor rank sees the streams in the same order;
            # a blocking put, so a full trajectory channel holds the rollout back (backpressure)
            key = (self.rank, stream, actor_rank)
            with self.timer.section("wait"):
                wait_future(self.actor_channel.put_async(shard, key=key), self._stop, POLL_SECONDS)
        return out

    def _act(self, stream: int, out: EnvOutput) -> None:
        buf = self.buffers[stream]
        if buf.idle():
            buf.started += 1
        with self.timer.section("rollout"):
            with self._policy_lock:
                result = self.policy.predict(out.obs, mode="train")
            self._check_finite(logprobs=result.logprobs, values=result.values)
            buf.pending = StepRecord(
                forward_inputs={k: v.cpu() for k, v in result.forward_inputs.items()},
                actions=result.actions.float().cpu(), logprobs=result.logprobs.float().cpu(),
                values=result.values.float().cpu(),
                versions=torch.full((out.num_envs,), self.version, dtype=torch.int64))
            actions = buf.pending.actions.numpy()
        # sent without waiting: the env answers before it can need the next actions
        message = ActionMessage(actions, generation=out.generation)
        with self.timer.section("wait"):
            try:
                if self._pending_puts[stream] is not None:
                    wait_future(self._pending_puts[stream], self._stop, POLL_SECONDS)
                self._pending_puts[stream] = self.action_channel.put_async(message, key=self.stream_keys[stream])
            except ChannelClosed:  # its env process is gone
                raise _StreamLost(stream) from None

    def run(self) -> None:
        """Serve the streams whose observations arrive, in the order they arrive. A stream that may
        not start its next trajectory yet (throttle) is parked with its observation while the others
        go on; only when every stream is parked does the loop block for new weights (so synchronous
        PPO with several streams cannot deadlock). A stream whose env process is gone waits, left
        out, until the runner replaces that process (``replace_env``)."""
        parked: List[Optional[EnvOutput]] = [None] * len(self.buffers)
        try:
            while not self._stop.is_set():
                self._take_replacements(parked)
                live = [stream for stream in range(len(parked)) if stream not in self._lost_streams]
                stepping = [stream for stream in live if parked[stream] is None]
                try:
                    if stepping:
                        with self.timer.section("wait"):
                            arrived = self._wait_for_outputs(stepping)
                        if arrived is not None:
                            parked[arrived] = self._receive(arrived)
                    for stream in live:
                        if parked[stream] is None:
                            continue
                        with self._acting:
                            self._poll_weights()
                            if self._may_act(stream):
                                self._act(stream, parked[stream])
                                parked[stream] = None
                except _StreamLost as lost:
                    if self._stop.is_set():
                        return
                    self._lost_streams.add(lost.stream)
                    parked[lost.stream] = None
                    continue
                if all(parked[stream] is not None for stream in live):
                    with self.timer.section("wait"):
                        self._wait_for_weights()
        except (Stopped, ChannelClosed):
            return

    # ---- env workers replaced ---------------------------------------------------------------
    def replace_env(self, env_rank: int, generation: int, timeout_s: float = 120.0) -> Dict[str, float]:
        """The runner replaced env worker ``env_rank`` (its process died or hung) by the process of
        ``generation``, not started yet: the loop drops the trajectories that rank's streams had
        under way and serves the new process from its first observations. What was dropped:
        ``decisions`` (one per stream and step) and ``samples`` (one per sub-env and decision)."""
        return self._replacements.ask(env_rank, generation, timeout_s,
                                      f"rollout worker {self.rank}, env worker {env_rank}'s replacement")

    def _take_replacements(self, parked: List[Optional[EnvOutput]]) -> None:
        for env_rank, generation, dropped in self._replacements.take():
            self.link_generations[env_rank] = generation
            steps = []
            for stream, key in enumerate(self.stream_keys):
                if key[0] != env_rank:
                    continue
                buf = self.buffers[stream]
                steps += buf.steps + ([buf.pending] if buf.pending is not None else [])
                buf.steps, buf.pending, buf.started = [], None, buf.finished
                parked[stream], self._pending_puts[stream] = None, None
                self._lost_streams.discard(stream)
                self.env_channel.reopen(key)
                self.action_channel.reopen(key)
            dropped.update(decisions=float(len(steps)), samples=float(sum(len(step.actions) for step in steps)))

    def stop(self) -> None:
        self._stop.set()

    def heartbeat(self):
        """``(section, seconds)``: what the loop has been busy with, and for how long (None while
        it waits for a peer); the runner's hang check (``runner.hang_timeout_s``) reads it."""
        return self.timer.busy()

    def pop_metrics(self) -> Dict[str, float]:
        times = self.timer.pop()
        return {"time/rollout": times.get("rollout", 0.0), "time/rollout_wait": times.get("wait", 0.0),
                **process_metrics("rollout", self.clock, times.get("rollout_cpu", 0.0), self.env_channel,
                                  self.action_channel, self.actor_channel)}

    # ---- evaluation and state --------------------------------------------------------------
    def evaluate(self, num_episodes: int, num_envs: int, pause_training: bool = False,
                 min_version: int = -1) -> Dict[str, float]:
        """Deterministic actions on this worker's own eval envs; every sub-env runs the same count.

        ``pause_training``: the loop acts for no env while it runs (``runner.eval_pauses_training``),
        once this worker holds weights of ``min_version`` or newer (the version just trained).
        """
        if not pause_training:
            return self._evaluate(num_episodes, num_envs)
        while self.version < min_version:  # the loop swaps the new weights in between its steps
            if self._stop.is_set():
                raise Stopped
            self._stop.wait(0.001)
        with self._acting:
            return self._evaluate(num_episodes, num_envs)

    def evaluate_published(self, num_episodes: int, num_envs: int, pause_training: bool = False,
                           min_version: int = 0, timeout_s: float = 600.0) -> Dict[str, float]:
        """Evaluate the weights of ``min_version`` or newer once they arrive, for a run without
        the rollout loop (a supervised run publishes weights only to be evaluated)."""
        deadline = time.monotonic() + timeout_s
        while self.version < min_version:
            self._poll_weights()
            if self._stop.is_set():
                raise Stopped
            if time.monotonic() > deadline:
                raise TimeoutError(f"no weights of version {min_version} arrived within {timeout_s:.0f} s")
            self._stop.wait(0.01)
        return self._evaluate(num_episodes, num_envs)

    def _evaluate(self, num_episodes: int, num_envs: int) -> Dict[str, float]:
        if self._eval_env is None:
            env_cfg = self.cfg.env
            if self.cfg.runner.eval_video:
                env_cfg = replace(env_cfg, render_video=True)
            self._eval_env = build_env(env_cfg, num_envs, evaluation_seed(self.cfg.runner.seed))
        with self._policy_lock:  # evaluate one version even if new weights arrive meanwhile
            size = sum(p.numel() * p.element_size() for p in self.policy.parameters())
            shared = size > EVAL_COPY_MAX_BYTES
            policy, version = (self.policy if shared else copy.deepcopy(self.policy)), self.version
            self._hold_weights = shared
        try:
            return self._run_evaluation(policy, version, num_episodes, num_envs)
        finally:
            with self._policy_lock:
                self._hold_weights = False

    def _run_evaluation(self, policy, version: int, num_episodes: int, num_envs: int) -> Dict[str, object]:
        runner = self.cfg.runner
        stop_below = runner.stop_at_eval_success if runner.eval_stop_once_below_target else None
        videos = runner.eval_video_episodes if runner.eval_video else 0
        result = run_episodes(policy, self._eval_env, num_episodes, videos,
                              seed=evaluation_seed(runner.seed, version), stop_below=stop_below)
        summary = result.summary(self.reports_success)
        per_task = {f"eval/success_rate/{task}": rate for task, rate in summary["per_task"].items()}
        return {"eval/success_rate": summary["success_rate"], "eval/episode_return": summary["episode_return"],
                "eval/episode_len": summary["episode_length"], "eval/version": float(version),
                "eval/episodes": float(summary["episodes"]), **per_task, "videos": result.videos}

    def close(self) -> None:
        self.stop()
        if self._eval_env is not None:
            self._eval_env.close()
