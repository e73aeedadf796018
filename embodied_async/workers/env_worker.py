"""Env worker: steps its sub-environments forever, one pipeline stage at a time."""

from __future__ import annotations

import threading
from typing import Dict, List, Tuple

import numpy as np

from embodied_async.contracts import EnvSpec
from embodied_async.data import ActionMessage, EnvOutput
from embodied_async.registry import build_env
from embodied_async.scheduler.channel import ChannelClosed
from embodied_async.workers.base import (
    BusyTimer,
    HandOver,
    ProcessClock,
    Stopped,
    process_metrics,
    setup_worker_process,
    wait_future,
)

POLL_SECONDS = 0.5  # how often a blocked loop looks at its stop flag


def _bad_values(value: np.ndarray, max_abs: float) -> np.ndarray:
    """NaN, inf, or beyond ``max_abs`` in magnitude (a finite but absurd value, e.g. 1e30 from an
    exploding simulator, is as useless as a NaN)."""
    with np.errstate(invalid="ignore"):
        return ~(np.abs(value) <= max_abs)  # NaN compares False, so it counts as bad


def _checked_values(out: EnvOutput):
    """``(key, [B, N] values)`` of every float array the check covers: the rewards, the
    observations and the final observations (named ``final_obs/<key>``)."""
    yield "rewards", np.asarray(out.rewards, dtype=np.float64).reshape(-1, 1)
    for prefix, obs in (("", out.obs), ("final_obs/", out.final_obs or {})):
        for key, value in obs.items():
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                yield prefix + key, value.reshape(value.shape[0], -1)


def _invalid_rows(out: EnvOutput, max_abs: float) -> np.ndarray:
    """Rows (sub-envs) whose reward or any float observation is NaN/inf or beyond ``max_abs``."""
    bad = np.zeros(len(out.rewards), dtype=bool)
    for _, values in _checked_values(out):
        bad |= _bad_values(values, max_abs).any(axis=1)
    return bad


def _first_invalid(out: EnvOutput, max_abs: float) -> Tuple[int, str, float]:
    """``(sub-env, key, value)`` of the first bad value, rewards first: what the error names."""
    for key, values in _checked_values(out):
        bad = _bad_values(values, max_abs)
        rows = np.flatnonzero(bad.any(axis=1))
        if len(rows):
            return int(rows[0]), key, float(values[rows[0]][bad[rows[0]]][0])
    raise ValueError("no invalid value in this env output")


class NonFiniteEnvValue(RuntimeError):
    """An env gave a non-finite (or beyond ``env.max_abs_value``) value under
    ``env.on_nonfinite=stop``: the message is the whole report, one line."""

    reported_in_full = True  # scheduler.worker_group shows the message alone, not Ray's traceback of it


class EpisodeStats:
    """Per-sub-env running return and length (in env steps, as executed); finished episodes are
    kept until popped.

    ``first_only`` (group-relative trajectories, each a fixed window from a fresh reset): only
    each sub-env's first episode since ``restart`` counts, the one that is trained on. The episodes
    that follow an early end are cut at the window's end unless they end first, and the short
    ones, mostly successes, would then be counted more often than the long ones."""

    def __init__(self, num_envs: int, first_only: bool = False):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.first_only = first_only
        self.counting = np.ones(num_envs, dtype=bool)
        self.finished: List[tuple] = []

    def record(self, out: EnvOutput, executed: np.ndarray) -> None:
        self.returns += np.where(out.valid, out.rewards, 0.0)
        self.lengths += executed
        for i in np.flatnonzero(out.dones & out.valid & self.counting):
            self.finished.append((self.returns[i], self.lengths[i], bool(out.successes[i])))
        self.returns[out.dones] = 0.0
        self.lengths[out.dones] = 0
        if self.first_only:
            self.counting &= ~out.dones

    def restart(self) -> None:
        """Every sub-env begins a new episode now: running ones are discarded, all count again."""
        self.returns[:] = 0.0
        self.lengths[:] = 0
        self.counting[:] = True


class EnvWorker:
    """Owns ``pipeline_stage_num`` batched envs; talks to rollout workers only through channels.

    Stage ``s`` of worker ``rank`` uses channel key ``(rank, s)``: it puts ``EnvOutput`` on the env
    channel and takes ``ActionMessage`` from the action channel.
    """

    def __init__(self, cfg, topology, rank: int, device_id: int, channels, generation: int = 0):
        self.cfg, self.rank = cfg, rank
        # the link to its rollout worker starts again each time the runner replaces the process
        # at either end (``data.EnvOutput.generation``); a new process's simulators are seeded anew,
        # so they do not replay the episodes of the one it replaces
        self.generation = generation
        self._rollout_replacement = HandOver()  # of the rollout worker this one serves
        seed = cfg.runner.seed * 100_003 + rank * 1009 + generation * 7_919
        setup_worker_process(topology.device_kind, device_id, cfg.cluster.cpu_threads_per_worker, seed)
        stages, per_stage = topology.stages, topology.envs_per_stage
        self.envs = [build_env(cfg.env, per_stage, seed + 101 * s) for s in range(stages)]
        grouped = cfg.algorithm.adv_type == "grpo"
        self.stats = [EpisodeStats(per_stage, first_only=grouped) for _ in range(stages)]
        self.reports_success = self.envs[0].spec.reports_success
        self.env_channel, self.action_channel = channels.env_outputs, channels.actions
        # a replacement (generation > 0) takes over the socket names the killed process may have left
        self.action_channel.listen([(rank, s) for s in range(stages)], take_over=generation > 0)
        self.timer = BusyTimer()
        self.clock = ProcessClock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._env_steps = 0
        self._nonfinite = 0
        self._pending_puts = [None] * stages
        # algorithm.adv_type=grpo: every trajectory starts each group of group_size sub-envs from
        # one seed, so the group's episodes begin in the same state and their returns compare
        self.group_size = int(cfg.algorithm.group_size) if grouped else 0
        self._seed = seed
        self._decisions = [0] * stages  # decisions stepped per stage: trajectory k starts at k x num_steps
        # env.slow_workers: a slower machine or heavier scene on this worker, for drills and benchmarks
        self.step_delay_s = cfg.env.slow_worker_delay_s if rank in cfg.env.slow_workers else 0.0

    def _group_seeds(self, stage: int) -> List[int]:
        """One seed per sub-env of ``stage``, the same within each group, fresh for every trajectory."""
        num_envs = self.envs[stage].num_envs
        trajectory = self._decisions[stage] // self.cfg.rollout.num_steps
        seeds = np.random.SeedSequence([self._seed, stage, trajectory]).generate_state(num_envs // self.group_size)
        return [int(seeds[i // self.group_size]) % 2**31 for i in range(num_envs)]

    def _reset(self, stage: int) -> EnvOutput:
        """A stage's first observations: grouped seeds under grpo, the env's own otherwise."""
        env = self.envs[stage]
        return env.reset(self._group_seeds(stage)) if self.group_size else env.reset()

    def _begin_groups(self, stage: int, out: EnvOutput) -> EnvOutput:
        """Under grpo, after a trajectory's last decision: every sub-env starts a new episode from
        its group's seed (the rollout begins the next trajectory with these observations). The
        episodes that began after their sub-env's first end are never trained on and left out of
        the episode statistics (``EpisodeStats.first_only``)."""
        self._decisions[stage] += 1
        if not self.group_size or self._decisions[stage] % self.cfg.rollout.num_steps:
            return out
        out.obs = self._reset(stage).obs
        with self._lock:
            self.stats[stage].restart()
        return out

    def spec(self) -> EnvSpec:
        return self.envs[0].spec

    def _nonfinite_error(self, stage: int, out: EnvOutput) -> NonFiniteEnvValue:
        max_abs = self.cfg.env.max_abs_value
        sub_env, key, value = _first_invalid(out, max_abs)
        # the step being checked: _begin_groups counts it only once it has passed this check
        step = self._decisions[stage] + 1
        return NonFiniteEnvValue(
            f"env worker {self.rank}, sub-env {sub_env} of stage {stage}: {key}={value:g} at step {step} of that "
            f"stage (non-finite or beyond env.max_abs_value={max_abs:g}); look at the simulator or the task "
            f"'{self.cfg.env.name}', or set env.on_nonfinite=drop to drop such samples and reset the sub-env")

    def _sanitize(self, stage: int, out: EnvOutput) -> EnvOutput:
        """Check every float observation and the rewards (``env.on_nonfinite``): "stop" raises
        ``NonFiniteEnvValue``; "drop" marks the bad samples invalid, ends their episode and resets
        their sub-env."""
        bad = _invalid_rows(out, self.cfg.env.max_abs_value)
        if not bad.any():
            return out
        if self.cfg.env.on_nonfinite == "stop":
            raise self._nonfinite_error(stage, out)
        idx = np.flatnonzero(bad)
        fresh = self.envs[stage].reset_envs(idx)
        for key, value in fresh.items():
            if isinstance(value, np.ndarray):
                out.obs[key] = out.obs[key].copy()
                out.obs[key][idx] = value[idx]
        out.rewards = np.where(bad, 0.0, out.rewards).astype(np.float32)
        out.valid = out.valid & ~bad
        out.dones = out.dones | bad
        out.bootstrap = out.bootstrap & ~bad
        if out.final_obs is not None:  # keep final obs finite: they are never used for bad rows
            for value in out.final_obs.values():
                if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                    value[idx] = 0.0
        with self._lock:
            self._nonfinite += len(idx)
        return out

    def _put(self, stage: int, out: EnvOutput) -> None:
        """Send without waiting for the acknowledgement: the next output of this stage can only
        come after the rollout answered this one, so at most one put per stage is in flight."""
        if self._pending_puts[stage] is not None:
            wait_future(self._pending_puts[stage], self._stop)
        out.generation = self.generation
        self._pending_puts[stage] = self.env_channel.put_async(out, key=(self.rank, stage))

    def _get_actions(self, stage: int):
        """The next actions of this link's generation (those answering outputs sent before the
        last replacement, still queued where the channel is a Ray actor, are left unexecuted). A
        replacement of the rollout worker taken in meanwhile restarts every stage first."""
        while not self._stop.is_set():
            self._take_rollout_replacement()
            try:
                message = self.action_channel.get(key=(self.rank, stage), timeout=POLL_SECONDS)
            except TimeoutError:
                continue
            if message.generation == self.generation:
                return message
        return None

    def replace_rollout(self, generation: int, timeout_s: float = 120.0) -> Dict[str, float]:
        """The runner replaced the rollout worker this env worker serves (its process died or
        hung): the loop starts every stage's episodes anew and sends their first observations to
        the new process, as ``generation``. What was dropped: the decisions of the trajectories
        under way (``decisions``, per stage) and ``samples`` (decisions x sub-envs)."""
        return self._rollout_replacement.ask("rollout", generation, timeout_s,
                                             f"env worker {self.rank}, the rollout worker's replacement")

    def _take_rollout_replacement(self) -> bool:
        taken = False
        for _, generation, dropped in self._rollout_replacement.take():
            self._restart_stages(generation, dropped)
            taken = True
        return taken

    def _restart_stages(self, generation: int, dropped: Dict[str, float]) -> None:
        """Every stage's episodes anew, their first observations sent as ``generation``."""
        self.generation = generation
        num_steps, decisions = self.cfg.rollout.num_steps, 0
        for stage in range(len(self.envs)):
            decisions += self._decisions[stage] % num_steps
            # the next trajectory begins now (under grpo from its own group seeds)
            self._decisions[stage] = -(-self._decisions[stage] // num_steps) * num_steps
            for channel in (self.env_channel, self.action_channel):
                channel.reopen((self.rank, stage))
            self._pending_puts[stage] = None
            with self._lock:
                self.stats[stage].restart()
            self._put(stage, self._reset(stage))
        dropped.update(decisions=float(decisions), samples=float(decisions * self.envs[0].num_envs))

    def _wait_for_rollout(self) -> None:
        """The rollout worker's end of a channel closed (its process ended): wait until the runner
        replaced it, or the run stops."""
        while not self._stop.is_set():
            if self._take_rollout_replacement():
                return
            self._stop.wait(POLL_SECONDS)
        raise Stopped

    def run(self) -> None:
        """The long-lived loop; returns when stopped (or a channel closes as the run ends)."""
        try:
            for stage in range(len(self.envs)):
                self._put(stage, self._reset(stage))
            while not self._stop.is_set():
                try:
                    if not self._step_stages():
                        return
                except ChannelClosed:
                    self._wait_for_rollout()
        except (ChannelClosed, Stopped):
            return

    def _step_stages(self) -> bool:
        """One decision of every stage, in order; False when stopped."""
        for stage, env in enumerate(self.envs):
            with self.timer.section("wait"):
                message: ActionMessage = self._get_actions(stage)
            if message is None:
                return False
            with self.timer.section("env"):
                out = self._sanitize(stage, env.step(message.actions))
                if self.step_delay_s:
                    self._stop.wait(self.step_delay_s)  # a sleep that stopping cuts short
            executed = out.executed_steps(self.cfg.env.num_action_chunks)
            with self._lock:
                self.stats[stage].record(out, executed)
                self._env_steps += int(executed.sum())
            with self.timer.section("env"):
                out = self._begin_groups(stage, out)
            with self.timer.section("wait"):
                self._put(stage, out)
        return True

    def stop(self) -> None:
        self._stop.set()

    def heartbeat(self):
        """``(section, seconds)``: what the loop has been busy with, and for how long (None while
        it waits for a peer); the runner's hang check (``runner.hang_timeout_s``) reads it."""
        return self.timer.busy()

    def pop_metrics(self) -> Dict[str, float]:
        """Episode statistics and busy time since the last call (``metrics.pool_env_metrics`` pools
        the workers: counts add up, per-episode means are weighted by ``env/episodes``)."""
        episodes = []
        with self._lock:
            for stats in self.stats:
                episodes += stats.finished
                stats.finished = []
            steps, self._env_steps = self._env_steps, 0
            nonfinite, self._nonfinite = self._nonfinite, 0
        times = self.timer.pop()
        out = {"env/env_steps": float(steps), "env/episodes": float(len(episodes)),
               "env/nonfinite_dropped": float(nonfinite), "time/env": times.get("env", 0.0),
               "time/env_wait": times.get("wait", 0.0), **process_metrics("env", self.clock, times.get("env_cpu", 0.0),
                                                                            self.env_channel, self.action_channel)}
        # no episode finished in this interval: the means are undefined (null in metrics.jsonl)
        returns, lengths, successes = zip(*episodes) if episodes else ([np.nan],) * 3
        if not self.reports_success:  # the task has no notion of success: null, not 0
            successes = [np.nan]
        out.update({"env/success_rate": float(np.mean(successes)), "env/episode_return": float(np.mean(returns)),
                    "env/episode_len": float(np.mean(lengths))})
        return out

    def close(self) -> None:
        self.stop()
        for env in self.envs:
            env.close()
