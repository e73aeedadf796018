"""``eval``: a policy scored on N episodes, the success rate with its 95 % interval, episode length
and return, and videos.

    python -m embodied_async eval CHECKPOINT_OR_MODEL --episodes N [--video-dir DIR] [key=value ...]

CHECKPOINT_OR_MODEL is either a checkpoint folder of a run (``<log>/checkpoints/global_step_<N>``:
the run's composed config is read from ``<log>/.hydra/config.yaml``), or a model (a checkpoint
folder of OpenVLA or LeRobot's Pi0, or a hub repo id) evaluated under ``--recipe`` (by default the
family's recipe). ``key=value`` overrides apply on top, e.g. ``env=robosuite_lift`` or
``env.max_episode_steps=80``. Prints a JSON report (also written to ``--json``) and a one-line
summary; exit code 2 on bad input (a config, checkpoint or env that cannot be used here).

It is ``runner.mode: eval`` of the one runner: ``--evaluators`` processes (placed as the rollout
component; more than one through Ray), each a policy and an env of ``--num-envs`` sub-envs, split
the episodes; the run's record goes to ``logs/<time>-eval`` (``runner.logger.log_path=...`` names
another folder).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from embodied_async.cli.errors import CommandError, report


def eval_command(argv=None) -> int:
    return eval_here(argv).code


def eval_here(argv=None):
    """The evaluation in this process; its ``cli.Outcome``: the exit code and the report."""
    from embodied_async.cli import Outcome

    args = _parse(argv)
    try:
        cfg, topology = evaluation_config(args)
        result = evaluate(cfg, topology, args)
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 (the table decides: a bug keeps its traceback)
        return Outcome(report(err, "eval"))
    print_report(result, args)
    return Outcome(0, result)


def print_report(report: dict, args) -> None:
    """The JSON report (and ``--json``'s file), then one line of summary and one per task."""
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    low, high = report["success_rate_ci95"]
    videos = f"; {len(report['videos'])} videos in {args.video_dir}" if report["videos"] else ""
    success = "n/a (the task reports none)" if report["success_rate"] is None else \
        f"{report['success_rate']:.3f} (95% CI {low:.3f}-{high:.3f})"
    what = f"{len(report['per_task'])} tasks" if len(report["per_task"]) > 1 else report["task"]
    print(f"[eval] success {success} over {report['episodes']} episodes of {what}, mean length "
          f"{report['episode_length']:.1f} env steps, mean return {report['episode_return']:.3f}{videos}", flush=True)
    for task, rate in report["per_task"].items():  # env.tasks: each task's share of the episodes
        low, high = report["per_task_ci95"][task]
        interval = "" if rate is None else f"{rate:.3f} (95% CI {low:.3f}-{high:.3f})"
        print(f"[eval]   {task}: success {interval or 'n/a'} over {report['per_task_episodes'][task]} episodes",
              flush=True)


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m embodied_async eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a run's checkpoint folder, or a model folder / hub repo id")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--num-envs", type=int, default=None,
                        help="sub-envs stepped together (default: up to 8; one per task of env.tasks)")
    parser.add_argument("--video-dir", default=None, help="write the first --videos episodes here as mp4 + JSON")
    parser.add_argument("--videos", type=int, default=4,
                        help="record the first episode of this many sub-envs (with --video-dir; at most --num-envs)")
    parser.add_argument("--recipe", default=None, help="the recipe a model is evaluated under (default: its family's), "
                                                       "or a checkpoint instead of its run's saved config")
    parser.add_argument("--seed", type=int, default=None,
                        help="env seed (default: the run's evaluation seed, not its training episodes)")
    parser.add_argument("--device", default=None, choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument("--evaluators", type=int, default=1, help="processes splitting the episodes (default: 1)")
    parser.add_argument("--json", default=None, help="also write the report to this file")
    parser.add_argument("--sampled", action="store_true",
                        help="act with the sampled policy (the one RL trains; seeded by --seed) instead of the "
                             "deterministic decision rule (greedy tokens, flow_ode, the Gaussian's mean)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    if args.episodes < 1 or args.evaluators < 1:
        parser.error("--episodes and --evaluators must be at least 1")
    return args


def evaluation_config(args):
    """``(TrainConfig, Topology)``: the target's config (a run's, or a model's under its recipe) in
    ``runner.mode: eval``, ``--evaluators`` processes of ``--num-envs`` sub-envs each."""
    from embodied_async.config import ConfigError
    from embodied_async.config.recipes import command_config, target_config
    from embodied_async.evaluation import evaluation_seed

    try:
        raw, checkpoint = target_config(args.target, args.overrides, args.recipe)
        num_envs = sub_env_count(len(raw.env.get("tasks") or ()), args)
        evaluators = args.evaluators
        raw.cluster.component_placement = {"env,rollout": f"0-{evaluators - 1}" if evaluators > 1 else "0",
                                           "actor": "0"}
        seed = args.seed if args.seed is not None else evaluation_seed(raw.runner.seed)  # the run's evaluation seed
        setting = {"cluster.device_type": {"cpu": "cpu", "cuda": "gpu"}.get(args.device, "auto"),
                   "cluster.backend": "ray" if evaluators > 1 else "local", "env.num_envs": num_envs * evaluators,
                   "env.pipeline_stage_num": 1, "cluster.cpu_threads_per_worker": max(1, (os.cpu_count() or 1)
                                                                                      // evaluators),
                   "runner.mode": "eval", "runner.val_check_interval": 0, "runner.dry_run": False,
                   "runner.resume_dir": None, "runner.logger.backends": [], "evaluation.checkpoint": checkpoint,
                   "evaluation.episodes": args.episodes, "evaluation.seed": seed, "evaluation.sampled": args.sampled,
                   "evaluation.videos": args.videos if args.video_dir else 0}
        return command_config(raw, setting, args.overrides, "eval")
    except ConfigError as err:
        raise CommandError(str(err)) from None


def sub_env_count(num_tasks: int, args) -> int:
    """``--num-envs`` of each evaluator, by default up to 8 sub-envs, one per task under env.tasks
    (sub-env i runs task i mod their number; a sub-env in a child process can be a ~2 GB process);
    each task gets as many episodes."""
    tasks = num_tasks or 1
    if args.episodes % args.evaluators:
        raise CommandError(f"--episodes {args.episodes} must be a multiple of --evaluators {args.evaluators}")
    share = args.episodes // args.evaluators
    num_envs = args.num_envs or (tasks if num_tasks else max(d for d in range(1, 9) if share % d == 0))
    if num_envs % tasks:
        raise CommandError(f"--num-envs {num_envs} must be a multiple of the {tasks} env.tasks, so each task has as "
                           "many episodes")
    if share % num_envs:
        raise CommandError(f"--episodes {args.episodes} must be a multiple of --num-envs {num_envs}"
                           + (f" x --evaluators {args.evaluators}" if args.evaluators > 1 else ""))
    return num_envs


def evaluate(cfg, topology, args) -> dict:
    """Run ``runner.mode: eval`` on ``cfg`` and report it (videos written to ``--video-dir``)."""
    from embodied_async.evaluation import write_videos
    from embodied_async.runner import run

    if topology.device_kind != "gpu" and cfg.env.simulates_on_gpu():
        raise CommandError(f"the env ({cfg.env.name} '{cfg.env.task_name()}') simulates on a GPU and this "
                           "evaluation runs without one: pass env=<an env yaml> or env.sim_backend=cpu where the task "
                           "supports it")
    try:
        cfg.model.fetch()  # once, here: the evaluators read the local copy
    except FileNotFoundError as err:
        raise CommandError(str(err)) from None
    if args.video_dir:
        from embodied_async.config import ConfigError

        try:
            cfg.env.check_video()
        except ConfigError as err:
            raise CommandError(f"--video-dir cannot be used with this env: {err}") from None
    started = time.time()
    print(f"[eval] building {args.evaluators} evaluator(s): the {cfg.env.name} env ({topology.envs_per_stage} "
          f"sub-envs) and the {cfg.model.name} policy", flush=True)
    outcome = run(cfg, topology)
    result = outcome["evaluation"]
    paths = write_videos(result.videos, args.video_dir, cfg.runner.eval_video_fps) if args.video_dir else []
    report = {"target": args.target, "checkpoint": cfg.evaluation.checkpoint, "model": cfg.model.name,
              "env": cfg.env.name, "task": cfg.env.task_name(), "seed": cfg.evaluation.seed,
              "decision_rule": "sampled" if args.sampled else "deterministic",
              **result.summary(outcome["evaluation/reports_success"]), "episode_successes": result.successes,
              "videos": paths, "seconds": round(time.time() - started, 1), "log": cfg.runner.logger.log_path}
    return _json_safe(report)


def _json_safe(value):
    """NaN (a task that reports no success) as null: JSON has no NaN."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value

