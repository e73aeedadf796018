"""``collect``: demonstrations into a LeRobot dataset (format v3.0), episodes of a scripted expert
or of a trained teacher recorded as the env's cameras, states and the executed actions.

    python -m embodied_async collect ENV_YAML_OR_RECIPE --source {scripted,teacher:<checkpoint>}
        --episodes N --out DATASET_DIR [--num-workers W] [--codec av1|h264] [--keep-failures]
        [--seed S] [--max-attempts M] [--push-to-hub REPO_ID] [key=value ...]

ENV_YAML_OR_RECIPE: an env yaml of configs/env/ (e.g. maniskill_pushcube_rgb, composed into the
default recipe, ``configs/defaults/recipe.yaml``) or a recipe of configs/; ``key=value`` overrides
apply on top (full paths: ``env.image_size=[64,64]``). The dataset records
``observation.images.main`` / ``.wrist`` (videos of main_images / wrist_images),
``observation.state`` (states) and ``action``, one frame per executed action with the observation
it was taken at; the instruction is the episode's task, the frame rate the env's control rate.

Sources: ``scripted``, the env family's scripted expert; or ``teacher:<folder>``, a checkpoint of
one of our runs (its config read from its run's folder), acting deterministically. Episode k
(counted after the highest seed already stored when appending) runs with seed ``--seed + k``;
episodes that do not end in success are dropped unless ``--keep-failures``.

It is ``runner.mode: collect`` of the one runner: the env workers (``--num-workers``, placed as
``cluster.component_placement``'s env) act, the driver writes; Ctrl-C keeps the episodes collected
so far (exit 130); bad input is one line and exit 2; the run's records go to ``logs/<time>-collect``.
"""

from __future__ import annotations

import argparse
import os
import signal
from typing import Optional

from embodied_async.signals import is_driver, run_driver_in_own_group


def collect_command(argv) -> int:
    args = parse(argv)
    if not is_driver():  # the launcher: the collection's driver in a process group of its own
        return run_driver_in_own_group(["-m", "embodied_async", "collect", *argv])
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    return drive(args)


def collect_here(argv):
    """The driver's work in this process (a pipeline's phase); its ``cli.Outcome``: the exit code
    and the dataset (``dataset``: its folder, ``episodes`` and ``frames`` it holds)."""
    from embodied_async.cli import Outcome

    outcome = {}
    code = drive(parse(argv), outcome)
    return Outcome(code, outcome.get("result") if code == 0 else None)


def parse(argv):
    from embodied_async.hub import add_push_arguments

    parser = argparse.ArgumentParser(prog="python -m embodied_async collect", description=__doc__.split("\n\n")[0])
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
    return args


def collection_config(args):
    """``(TrainConfig, Topology)`` of the collection: the target's config in ``runner.mode:
    collect``, one sub-env per env worker, the workers on this machine's CPU process slots."""
    from embodied_async.config.recipes import command_config, env_target_config

    raw = env_target_config(args.target, args.overrides)
    workers = args.num_workers
    raw.cluster.component_placement = {"env": f"0-{workers - 1}" if workers > 1 else "0", "rollout,actor": "0"}
    setting = {"cluster.device_type": "cpu", "env.num_envs": workers, "env.pipeline_stage_num": 1,
               "runner.mode": "collect", "runner.val_check_interval": 0, "runner.dry_run": False,
               "runner.logger.backends": [], "collect.source": args.source, "collect.episodes": args.episodes,
               "collect.out": args.out, "collect.codec": args.codec, "collect.keep_failures": args.keep_failures,
               "collect.seed": args.seed, "collect.max_attempts": args.max_attempts}
    return command_config(raw, setting, args.overrides, f"collect-{args.target}")


def drive(args, outcome: Optional[dict] = None) -> int:
    """Check everything, then run the collection in this process (the driver); the dataset it
    wrote in ``outcome["result"]``."""
    from embodied_async.cli.errors import report
    from embodied_async.collection import check_plan
    from embodied_async.signals import exit_code, install_driver_handlers

    try:
        cfg, topology = collection_config(args)
        check_plan(cfg)  # the source, the env and the dataset appended to, before anything starts
    except Exception as err:  # noqa: BLE001 (the table decides: bad input is one line, a bug keeps its traceback)
        return report(err, "collect")
    install_driver_handlers()
    try:
        from embodied_async.runner import run

        result = run(cfg, topology)
    except KeyboardInterrupt:  # Ctrl-C, or a scheduler's SIGTERM: the episodes written are kept
        print(f"[collect] stopped: the episodes written so far are kept in {args.out}; the same command appends "
              "the rest", flush=True)
        return exit_code()
    except Exception as err:  # noqa: BLE001
        return report(err, "collect")
    code = summarise(result, args)
    if outcome is not None:
        outcome["result"] = {"dataset": args.out, "episodes": result["collect/dataset_episodes"],
                             "frames": result["collect/dataset_frames"]}
    if code == 0 and args.push_to_hub:  # only a finished collection: a partial one stays local
        from embodied_async.hub import push_and_report

        return push_and_report(args.out, args.push_to_hub, "dataset", not args.public, "collect")
    return code


def summarise(result: dict, args) -> int:
    kept, attempted = result["collect/kept"], result["collect/attempted"]
    why = "" if kept >= args.episodes else f"gave up after {attempted} attempts (--max-attempts): "
    seconds = max(result["wall_time_s"], 1e-9)
    print(f"[collect] {why}wrote {kept} episodes ({result['collect/frames']} frames) to {args.out} (it holds "
          f"{result['collect/dataset_episodes']}); source success {result['collect/successes']}/{attempted}; "
          f"{60 * attempted / seconds:.1f} episodes/min once the workers were ready ({seconds:.0f} s)", flush=True)
    return 0 if kept >= args.episodes else 1
