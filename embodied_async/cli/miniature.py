"""``python -m embodied_async miniature FAMILY``: the whole VLA workflow on a CPU (``miniature.py``,
the pipeline ``configs/pipelines/miniature.yaml`` declares). Phases that finished are kept when the
command is repeated and run again when their settings (or those of a phase they stand on) change.
``docs/miniature.md`` is the manual.

    python -m embodied_async miniature openvla            # or pi0
    python -m embodied_async miniature pi0 --rl-seeds 0 1 2 --record benchmarks
"""

from __future__ import annotations

import argparse
import re
import signal
from typing import List


def miniature_command(argv) -> int:
    from embodied_async.signals import is_driver, run_driver_in_own_group

    args = parse(argv)
    if not is_driver():  # the launcher: the pipeline's driver, in a process group of its own (Ray's too)
        return run_driver_in_own_group(["-m", "embodied_async", "miniature", *argv])
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # until a phase's run takes the signals over
    from embodied_async.cli.errors import report

    try:
        from embodied_async.miniature import Miniature

        Miniature(args).run()
    except KeyboardInterrupt as err:
        return report(err, "miniature", "the phases that finished are kept; run the same command to go on")
    except Exception as err:  # noqa: BLE001 (the table decides: bad input is one line, a bug keeps its traceback)
        return report(err, "miniature")
    return 0


def parse(argv):
    from embodied_async.miniature import FULL, families

    known = families()
    parser = argparse.ArgumentParser(prog="python -m embodied_async miniature", description=__doc__.split("\n\n")[0])
    parser.add_argument("family", help=f"one of {sorted(known)}")
    parser.add_argument("--out", default=None, help="the pipeline's folder (default logs/miniature_<family>)")
    parser.add_argument("--demos", type=int, default=None, help=f"demonstration episodes (default {FULL.demos})")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT steps (default: "
                        + ", ".join(f"{name} {family.sft_steps}" for name, family in known.items()) + ")")
    parser.add_argument("--rl-updates", type=int, default=None,
                        help="PPO updates (default: the recipe's); more than a finished run made continue it")
    parser.add_argument("--rl-recipe", default=None,
                        help="the RL phase's recipe (default: the family's, miniature_<family>.yaml's rl_recipe; "
                             "e.g. its GRPO twin for group-relative advantages)")
    parser.add_argument("--eval-episodes", type=int, default=None,
                        help=f"episodes of each evaluation before and after RL (default {FULL.eval_episodes})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demonstrations and the training runs")
    parser.add_argument("--rl-seeds", metavar="SEED", default=None,
                        help="--rl-seeds S [S ...]: run the RL phase and its evaluation once per seed, from the one "
                             "SFT checkpoint (default: --seed)")
    parser.add_argument("--smoke", action="store_true", help="a few demonstrations, SFT steps and one RL update")
    parser.add_argument("--restart", action="store_true", help="discard the phases a previous run finished")
    parser.add_argument("--record", default=None, help="also copy record.json/.png into this folder, dated")
    parser.add_argument("--sft-from", default=None, metavar="DIR",
                        help="start the RL phases from the SFT checkpoint another --out folder made (its "
                             "demonstrations, checkpoint and evaluation), so RL variants compare on one warm start")
    parser.add_argument("overrides", nargs="*", help="key=value (every phase), sft:key=value, rl:key=value")
    argv, rl_seeds = _take_rl_seeds(list(argv), parser)
    args = parser.parse_intermixed_args(argv)
    args.rl_seeds = rl_seeds
    return args


def _take_rl_seeds(argv: List[str], parser):
    """``--rl-seeds`` and the integers after it (key=value overrides may follow them)."""
    if "--rl-seeds" not in argv:
        return argv, None
    at = argv.index("--rl-seeds")
    end = at + 1
    while end < len(argv) and re.fullmatch(r"-?\d+", argv[end]):
        end += 1
    if end == at + 1:
        parser.error("--rl-seeds needs one or more integer seeds, e.g. --rl-seeds 0 1 2")
    return argv[:at] + argv[end:], [int(v) for v in argv[at + 1:end]]
