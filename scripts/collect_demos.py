"""Collect demonstrations into a LeRobot dataset (format v3.0): episodes of a scripted expert or of
a trained teacher, recorded as the env's cameras, states and the executed actions.

    python scripts/collect_demos.py ENV_YAML_OR_RECIPE --source {scripted,teacher:<checkpoint>}
        --episodes N --out DATASET_DIR [--num-workers W] [--codec av1|h264] [--keep-failures] [--push-to-hub REPO_ID]
        [--seed S] [key=value ...]

ENV_YAML_OR_RECIPE: an env yaml of configs/env/ (e.g. maniskill_pushcube_rgb) or a recipe of
configs/; ``key=value`` overrides apply on top (full paths: ``env.image_size=[64,64]``). Its
observation is what the dataset records: ``observation.images.main`` / ``.wrist`` (videos of
main_images / wrist_images), ``observation.state`` (states) and ``action``, one frame per executed
action, each with the observation the action was taken at; the instruction is the episode's task,
the frame rate the env's control rate.

Sources: ``scripted``, the env family's scripted expert (``env.scripted_expert``); or
``teacher:<folder>``, a checkpoint of one of our runs (``logs/<run>/checkpoints/global_step_N``,
its config read from ``logs/<run>/.hydra/config.yaml``), acting deterministically. A teacher
trained on state observations sees the env's privileged states (the task's state-mode vector)
while the dataset records what the env renders.

Episode k (counted from 0; after the highest seed already stored when appending) runs with seed
``--seed + k``; episodes that do not end in success are dropped unless ``--keep-failures``.
Worker processes (``--num-workers``) each own one env and one source. Appending to a dataset of
the same env config works; Ctrl-C keeps the episodes collected so far (exit 130); bad input
prints one line ``collect error: ...`` and exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import signal
import sys
import time
from typing import Dict, List, Optional

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import envs  # noqa: E402,F401  (sets MUJOCO_GL before any simulator is imported)
from embodied_async.config import ConfigError  # noqa: E402
from embodied_async.datasets.batches import CONVENTIONAL_KEYS  # noqa: E402
from embodied_async.hub import add_push_arguments  # noqa: E402

DEFAULT_RECIPE = "maniskill_async_ppo_mlp"  # the recipe an env yaml is composed into
# dataset key of each observation the dataset records, and of the actions (LeRobot's names)
RECORDED = {name: key for name, key in CONVENTIONAL_KEYS.items() if name != "actions"}
ACTION_KEY = CONVENTIONAL_KEYS["actions"]
# env keys of no concern to the episodes: a dataset may be appended to with other values of these
NOT_COLLECTION = ("num_envs", "pipeline_stage_num", "render_video", "video_size", "privileged_states")
PROGRESS_EVERY_S = 3.0
WORKER_START_TIMEOUT_S = 600.0


class CollectError(Exception):
    """Bad input: printed as one line, exit code 2."""


# ---- the command line -----------------------------------------------------------------------

def main(argv=None) -> int:
    args = _parse(argv)
    try:
        plan = make_plan(args)
        code = collect(plan, args)
    except (CollectError, ConfigError) as err:
        one_line = " ".join(part.strip() for part in str(err).splitlines() if part.strip())
        print(f"collect error: {one_line}", file=sys.stderr, flush=True)
        return 2
    except RuntimeError as err:  # a simulator or worker failure, not the input
        print(f"collect failed: {err}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:  # before the workers started: nothing collected yet
        print("[collect] stopped by Ctrl-C", file=sys.stderr, flush=True)
        return 130
    if code == 0 and args.push_to_hub:  # only a finished collection: a partial one stays local
        from embodied_async.hub import push_and_report

        return push_and_report(args.out, args.push_to_hub, "dataset", not args.public, "collect")
    return code


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="an env yaml name of configs/env/ or a recipe of configs/")
    parser.add_argument("--source", required=True, help="'scripted' or 'teacher:<a run's checkpoint folder>'")
    parser.add_argument("--episodes", type=int, required=True, help="episodes to add to the dataset")
    parser.add_argument("--out", required=True, help="the dataset folder (created, or appended to)")
    parser.add_argument("--num-workers", type=int, default=min(4, os.cpu_count() or 1),
                        help="env processes (default: up to 4)")
    parser.add_argument("--codec", choices=("av1", "h264"), default="av1", help="video codec (default: av1)")
    parser.add_argument("--keep-failures", action="store_true", help="also keep episodes that end without success")
    parser.add_argument("--seed", type=int, default=0, help="episode k runs with seed + k (default: 0)")
    parser.add_argument("--max-attempts", type=int, default=None,
                        help="give up after this many episodes (default: 10 x --episodes + 10)")
    add_push_arguments(parser, "dataset")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. env.image_size=[64,64]")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    if args.episodes < 1 or args.num_workers < 1:
        parser.error("--episodes and --num-workers must be at least 1")
    if args.source != "scripted" and not args.source.startswith("teacher:"):
        parser.error(f"--source {args.source!r}: use 'scripted' or 'teacher:<checkpoint folder>'")
    return args


# ---- what to collect --------------------------------------------------------------------------

@dataclasses.dataclass
class Teacher:
    """A run's checkpoint acting as the source (all a worker process needs to rebuild it)."""

    model_cfg: object
    checkpoint: str
    privileged: bool  # trained on state observations: it sees the env's privileged_states


@dataclasses.dataclass
class Plan:
    env_cfg: object
    source: str  # as given: "scripted" or "teacher:<folder>"
    teacher: Optional[Teacher]
    collection_env: Dict[str, object]


def make_plan(args) -> Plan:
    env_cfg = load_env_config(args.target, args.overrides)
    if int(env_cfg.num_action_chunks) != 1:
        raise CollectError(f"env.num_action_chunks={env_cfg.num_action_chunks}: the envs return one observation per "
                           "chunk, and a dataset needs the observation of every executed action; set "
                           "env.num_action_chunks=1 (a policy trained on it may still predict chunks)")
    teacher = None
    if args.source == "scripted":
        if type(env_cfg).scripted_expert is None:
            raise CollectError(f"the '{env_cfg.name}' env family has no scripted expert (env.scripted_expert): use "
                               "--source teacher:<checkpoint folder>")
    else:
        teacher = load_teacher(args.source.split(":", 1)[1], env_cfg)
        if teacher.privileged:
            env_cfg = dataclasses.replace(env_cfg, privileged_states=True)
    env_cfg = dataclasses.replace(env_cfg, num_envs=1, render_video=False)
    # as collection.json will hold it (tuples become lists), so that an append compares like with like
    collection = json.loads(json.dumps({k: v for k, v in dataclasses.asdict(env_cfg).items()
                                        if k not in NOT_COLLECTION}))
    check_appendable(args.out, collection)
    return Plan(env_cfg, args.source, teacher, collection)


def check_appendable(root: str, env: Dict[str, object]) -> None:
    """An existing dataset of another env config is refused before any worker starts (the writer
    checks it again, with the frame rate and the features, once an env is built)."""
    from embodied_async.datasets import lerobot_format as fmt

    if not os.path.isfile(os.path.join(root, fmt.COLLECTION_PATH)):
        return
    stored = fmt.read_json(root, fmt.COLLECTION_PATH).get("env")
    differ = sorted(k for k in set(stored or {}) | set(env) if stored is not None and stored.get(k) != env.get(k))
    if differ:
        raise CollectError(f"{root} was collected in another env config (" + ", ".join(
            f"env.{k}: {stored.get(k)!r} there, {env.get(k)!r} here" for k in differ[:6]) + "): write these episodes "
            "to another --out, or collect with the dataset's config")


def load_env_config(target: str, overrides: List[str]):
    """The validated env config of an env yaml (composed into the default recipe) or a recipe."""
    from embodied_async.config.recipes import env_config

    return env_config(target, overrides, DEFAULT_RECIPE)


def load_teacher(folder: str, env_cfg) -> Teacher:
    """The teacher's run config, checked against the env it is to act in."""
    from embodied_async.config.recipes import checkpoint_config
    from embodied_async.config.validate import to_train_config
    from embodied_async.run_folder import is_checkpoint, run_config_path

    if not is_checkpoint(folder):
        raise CollectError(f"--source teacher:{folder}: not a checkpoint folder of a run (one holds runner.json and "
                           "manifest.json, e.g. logs/<run>/checkpoints/global_step_<N>)")
    if not os.path.isfile(run_config_path(folder)):
        raise CollectError(f"--source teacher:{folder}: its run's config {run_config_path(folder)} is missing, so "
                           "what the teacher observes and how it acts is unknown: use a checkpoint inside its run's "
                           "log folder")
    raw = checkpoint_config(folder)
    raw.cluster.device_type, raw.runner.dry_run = "cpu", False  # the teacher acts in this process
    cfg = to_train_config(raw)
    theirs, ours = cfg.env.acting_settings(), env_cfg.acting_settings()
    if theirs != ours:
        differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        raise CollectError("the teacher was trained on " + _describe(theirs, differ) + ", this env is "
                           + _describe(ours, differ) + ": collect in the teacher's task and control mode (e.g. "
                           + " ".join(f"env.{k}={theirs.get(k)}" for k in differ if k != "name") + ")")
    if int(cfg.env.num_action_chunks) != 1:
        raise CollectError(f"the teacher acts in chunks of {cfg.env.num_action_chunks} actions (its "
                           "env.num_action_chunks); the collector records single actions: use a teacher trained with "
                           "env.num_action_chunks=1")
    privileged = cfg.env.observes_states()
    if privileged and not type(env_cfg).supports_privileged_states:
        raise CollectError(f"the teacher was trained on state observations, and the '{env_cfg.name}' env family "
                           "cannot give them beside its own (env.privileged_states)")
    return Teacher(cfg.model, folder, privileged)


def _describe(keys: Dict[str, object], differ: List[str]) -> str:
    return " ".join(f"{k}={keys.get(k)!r}" for k in differ)


# ---- a worker process: one env, one source ---------------------------------------------------

def build_source(plan: Plan, env):
    """``obs -> actions [1, C, A]`` (numpy) of the plan's source in ``env``."""
    if plan.teacher is None:
        import importlib

        module, _, name = type(plan.env_cfg).scripted_expert.partition(":")
        return getattr(importlib.import_module(module), name)(plan.env_cfg, env)
    return _teacher_source(plan.teacher, env)


def _teacher_source(teacher: Teacher, env):
    import torch

    from embodied_async.registry import build_policy
    from embodied_async.run_folder import load_policy_weights

    spec = env.spec
    shapes = {k: v for k, v in spec.obs_shapes.items() if k != "privileged_states"}
    if teacher.privileged:
        shapes = {"states": spec.obs_shapes["privileged_states"]}
    their_spec = dataclasses.replace(spec, obs_shapes=shapes,
                                     obs_dtypes={k: spec.obs_dtypes.get(k, "float32") for k in shapes})
    policy = build_policy(teacher.model_cfg, their_spec, device=torch.device("cpu")).eval()
    try:
        load_policy_weights(policy, teacher.checkpoint)
    except (KeyError, ValueError) as err:
        seen = f"states of {shapes['states'][0]} values (the env's privileged states)" if teacher.privileged \
            else f"observations {shapes}"
        raise ValueError(f"the teacher {teacher.checkpoint} does not fit {seen}: {err}") from None

    def act(obs):
        given = {k: v for k, v in obs.items() if k != "privileged_states"}
        if teacher.privileged:
            given = {"states": obs["privileged_states"], "task_descriptions": obs["task_descriptions"]}
        actions = policy.predict(given, mode="eval").actions
        return actions.float().cpu().numpy()

    return act


def run_episode(env, act, seed: int) -> dict:
    """One episode from a reset with ``seed``: the recorded frames, success and return."""
    low, high = np.asarray(env.spec.action_low), np.asarray(env.spec.action_high)
    obs = env.reset(seed=seed).obs
    frames: Dict[str, list] = {RECORDED[k]: [] for k in RECORDED if k in obs}
    actions, total = [], 0.0
    while True:
        chunk = np.asarray(act(obs), dtype=np.float32)
        for key in RECORDED:
            if key in obs:
                frames[RECORDED[key]].append(np.asarray(obs[key][0]))
        actions.append(np.clip(chunk[0, 0], low, high))  # what the env executes
        out = env.step(chunk)
        total += float(out.rewards[0])
        if out.dones[0]:
            break
        obs = out.obs
    episode = {key: np.stack(values) for key, values in frames.items()}
    episode[ACTION_KEY] = np.stack(actions).astype(np.float32)
    return {"frames": episode, "task": str(obs["task_descriptions"][0]), "success": bool(out.successes[0]),
            "return_": total}


def worker(plan: Plan, rank: int, tasks, results) -> None:
    """Build the env and the source, then run the episode numbers ``tasks`` hands out (None: stop)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides what Ctrl-C stops
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch

        torch.set_num_threads(1)
        from embodied_async.registry import build_env

        env = build_env(plan.env_cfg, 1, 0)
        act = build_source(plan, env)
    except Exception as err:  # noqa: BLE001  (a config, checkpoint or asset this env cannot use)
        results.put(("error", rank, f"{type(err).__name__}: {err}"))
        return
    results.put(("ready", rank, env.spec))
    try:
        for number, seed in iter(tasks.get, None):
            results.put(("episode", rank, dict(run_episode(env, act, seed), number=number, seed=seed)))
    except Exception as err:  # noqa: BLE001  (reported by the main process, which stops)
        import traceback

        results.put(("crash", rank, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    finally:
        env.close()


# ---- the main process: workers, order, the dataset --------------------------------------------

class Workers:
    """``count`` worker processes (spawned: no simulator state is forked) fed episode numbers."""

    def __init__(self, plan: Plan, count: int):
        import multiprocessing as mp

        context = mp.get_context("spawn")
        self.tasks, self.results = context.Queue(), context.Queue()
        self.processes = [context.Process(target=worker, args=(plan, rank, self.tasks, self.results), daemon=True)
                          for rank in range(count)]
        for process in self.processes:
            process.start()
        self.ready = 0

    def get(self, interrupt: "Interrupt", timeout: float = 0.5):
        """The next message, or None after ``timeout``; a worker that died unannounced is an error
        (unless Ctrl-C, which may have reached a worker still starting, is stopping everything)."""
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:
            dead = [(rank, p.exitcode) for rank, p in enumerate(self.processes) if p.exitcode not in (None, 0)]
            if dead and not interrupt.requested:
                raise RuntimeError(f"worker {dead[0][0]} died (exit code {dead[0][1]}) without a word: a simulator "
                                   "crash? Its output is above") from None
            return None

    def stop(self, grace_s: float = 10.0) -> None:
        """Workers finish the episode they are in and leave; episode numbers handed out ahead and
        episodes not yet read are dropped (a worker exits only once its queued results are read)."""
        _drain(self.tasks)
        for _ in self.processes:
            self.tasks.put(None)
        deadline = time.time() + grace_s
        while time.time() < deadline and any(p.is_alive() for p in self.processes):
            _drain(self.results, wait_s=0.1)
        for process in self.processes:
            if process.is_alive():  # still inside an episode: it would only finish to be discarded
                process.terminate()
            process.join(timeout=5.0)


def _drain(channel, wait_s: float = 0.0) -> None:
    """Read and drop what a queue holds (each read waiting up to ``wait_s``)."""
    take = (lambda: channel.get(timeout=wait_s)) if wait_s else channel.get_nowait
    try:
        while True:
            take()
    except queue.Empty:
        pass


@dataclasses.dataclass
class Tally:
    wanted: int
    started: float = dataclasses.field(default_factory=time.time)
    attempted: int = 0
    successes: int = 0
    kept: int = 0
    frames: int = 0
    printed: float = 0.0
    ready_at: Optional[float] = None  # when the first worker could start episodes

    def line(self, note: str = "") -> str:
        rate = self.attempted / max(time.time() - self.started, 1e-9)
        success = f"{self.successes / self.attempted:.0%}" if self.attempted else "n/a"
        return (f"[collect] {self.kept}/{self.wanted} episodes kept, {self.attempted} attempted (source success "
                f"{success}), {rate:.2f} episodes/s{note}")

    def progress(self, note: str = "", force: bool = False) -> None:
        if force or time.time() - self.printed >= PROGRESS_EVERY_S:
            print(self.line(note), file=sys.stderr, flush=True)
            self.printed = time.time()


class Interrupt:
    """Ctrl-C sets a flag the loop reads between episodes: an episode is never half written."""

    def __init__(self):
        self.requested = False
        self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, *_):
        self.requested = True

    def restore(self) -> None:
        signal.signal(signal.SIGINT, self._previous)


def first_episode(root: str, seed: int) -> int:
    """Episode numbers continue after the highest seed already stored (no episode twice)."""
    from embodied_async.datasets import lerobot_format as fmt

    path = os.path.join(root, fmt.COLLECTION_PATH)
    if not os.path.isfile(path):
        return 0
    seeds = [int(e["seed"]) for e in fmt.read_json(root, fmt.COLLECTION_PATH).get("episodes", []) if "seed" in e]
    return max([0] + [s - seed + 1 for s in seeds])


def open_writer(plan: Plan, args, spec):
    """The dataset writer for the env a worker built (``spec``: its EnvSpec)."""
    from embodied_async.datasets.batches import dataset_features
    from embodied_async.datasets.lerobot_format import DatasetError
    from embodied_async.datasets.writer import DatasetWriter

    hz = spec.control_hz
    if hz is None or abs(hz - round(hz)) > 1e-6:
        raise CollectError(f"the '{plan.env_cfg.name}' env gives no whole control rate (EnvSpec.control_hz={hz}); a "
                           "LeRobot dataset's fps is the rate its actions were executed at")
    if not spec.reports_success and not args.keep_failures:
        raise CollectError("this task reports no success, so no episode would be kept: pass --keep-failures")
    features = dataset_features(spec)
    robot = plan.env_cfg.robot_name()
    try:
        return DatasetWriter(args.out, int(round(hz)), features, robot_type=robot, video_codec=args.codec,
                             collection={"env": plan.collection_env})
    except DatasetError as err:
        raise CollectError(str(err)) from None


def collect(plan: Plan, args) -> int:
    """Run the workers until ``--episodes`` are kept (or the attempts run out, or Ctrl-C)."""
    start = first_episode(args.out, args.seed)
    limit = args.max_attempts or 10 * args.episodes + 10
    tally, interrupt = Tally(args.episodes), Interrupt()
    print(f"[collect] {args.num_workers} worker(s) building the {plan.env_cfg.name} env and the {plan.source} source; "
          f"episodes from seed {args.seed + start}", file=sys.stderr, flush=True)
    workers = Workers(plan, args.num_workers)
    try:
        info = _wait_ready(workers, tally, interrupt)
        if info is None:
            print("[collect] stopped by Ctrl-C before any episode", file=sys.stderr, flush=True)
            return 130
        with open_writer(plan, args, info) as writer:
            tally.ready_at = time.time()
            code = _gather(workers, writer, tally, args, start, limit, interrupt)
            total = writer.total_episodes
    finally:
        workers.stop()
        interrupt.restore()
    _summary(tally, args, total, code)
    return code


def _wait_ready(workers: Workers, tally: Tally, interrupt: Interrupt) -> Optional[dict]:
    """The spec of the first worker whose env and source are built; None on Ctrl-C."""
    deadline = time.time() + WORKER_START_TIMEOUT_S
    while not interrupt.requested:
        message = workers.get(interrupt)
        if message is None:
            if time.time() > deadline:
                raise RuntimeError(f"no worker built its env within {WORKER_START_TIMEOUT_S:.0f} s")
            tally.progress(", waiting for the workers to build their envs")
            continue
        kind, rank, body = message
        if kind in ("error", "crash"):
            raise CollectError(f"worker {rank} could not start: {body}")
        return body
    return None


def _gather(workers: Workers, writer, tally: Tally, args, start: int, limit: int, interrupt: Interrupt) -> int:
    """Hand out episode numbers, take the episodes back, write them in number order."""
    next_number, next_written, pending = start, start, {}
    while tally.kept < tally.wanted and tally.attempted < limit and not interrupt.requested:
        while next_number - next_written - len(pending) < 2 * len(workers.processes) and next_number < start + limit:
            workers.tasks.put((next_number, args.seed + next_number))  # a few ahead: no worker waits
            next_number += 1
        message = workers.get(interrupt)
        if message is None:
            tally.progress()
            continue
        kind, rank, body = message
        if kind == "error":
            raise CollectError(f"worker {rank} could not start: {body}")
        if kind == "crash":
            raise RuntimeError(f"worker {rank} failed: {body}")
        if kind == "episode":
            pending[body["number"]] = body
        while next_written in pending and tally.kept < tally.wanted:  # the order does not depend on the workers
            _record(writer, pending.pop(next_written), tally, args)
            next_written += 1
        tally.progress()
    if interrupt.requested:  # keep what came back, in order
        for number in sorted(pending):
            if tally.kept < tally.wanted:
                _record(writer, pending[number], tally, args)
        return 130
    return 0 if tally.kept >= tally.wanted else 1


def _record(writer, episode: dict, tally: Tally, args) -> None:
    tally.attempted += 1
    tally.successes += int(episode["success"])
    if episode["success"] or args.keep_failures:
        writer.add_episode(episode["frames"], episode["task"], seed=episode["seed"], source=args.source,
                           success=episode["success"], return_=episode["return_"])
        tally.kept += 1
        tally.frames += len(episode["frames"][ACTION_KEY])


def _summary(tally: Tally, args, total: int, code: int) -> None:
    elapsed = time.time() - tally.started
    steady = time.time() - (tally.ready_at or tally.started)
    why = {130: "stopped by Ctrl-C: ", 1: f"gave up after {tally.attempted} attempts: "}.get(code, "")
    print(tally.line(note=""), file=sys.stderr, flush=True)
    print(f"[collect] {why}wrote {tally.kept} episodes ({tally.frames} frames) to {args.out} (it holds {total}); "
          f"source success {tally.successes}/{tally.attempted}; {60 * tally.attempted / max(elapsed, 1e-9):.1f} "
          f"episodes/min overall, {60 * tally.attempted / max(steady, 1e-9):.1f} once the workers were ready "
          f"({elapsed:.0f} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
