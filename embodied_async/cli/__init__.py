"""One command line for what a user runs: ``python -m embodied_async <command> [arguments]``.

A command is a row of ``COMMANDS``: its one-line summary and the function that runs it (``argv ->
exit code``), imported only when that command runs, so ``--help`` and the training launcher stay
light. Every command reports errors through one table (``cli/errors.py``). ``bash
scripts/run_async.sh`` and ``examples/embodiment/train_async.py`` are entries to ``train``.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Dict, Optional, Sequence


@dataclass(frozen=True)
class Outcome:
    """What a command run in the calling process (``run_here``) hands back: its exit code and
    what it made (the run's folder and last checkpoint, the dataset, the evaluation's report)."""

    code: int
    result: Optional[Dict] = None


@dataclass(frozen=True)
class Command:
    summary: str
    target: str  # "module:function", the function taking the command's arguments, returning its exit code
    # "module:function" doing the command's work in the calling process and returning its Outcome,
    # for a pipeline that is itself a driver in a process group of its own (the target would start
    # one); None: the command cannot be a pipeline's phase
    here: Optional[str] = None


COMMANDS = {
    "train": Command("train a recipe: train RECIPE [key=value ...] (bash scripts/run_async.sh: the default recipe)",
                     "embodied_async.cli.train:train_command", here="embodied_async.cli.train:train_here"),
    "plan": Command("print a recipe's placement, batch arithmetic and memory per GPU, starting nothing: "
                    "plan RECIPE [key=value ...]", "embodied_async.cli.train:plan_command"),
    "collect": Command("record episodes of a scripted expert or a teacher checkpoint as a LeRobot dataset: "
                       "collect ENV --source S --episodes N --out DIR", "embodied_async.cli.collect:collect_command",
                       here="embodied_async.cli.collect:collect_here"),
    "eval": Command("score a checkpoint or a model on N episodes with a 95 % interval: eval TARGET --episodes N",
                    "embodied_async.cli.evaluate:eval_command", here="embodied_async.cli.evaluate:eval_here"),
    "export": Command("write a checkpoint in its policy family's published format with a model card: "
                      "export CHECKPOINT --out DIR", "embodied_async.cli.export:export_command"),
    "miniature": Command("the whole VLA workflow on a CPU, a pipeline of these commands: demonstrations -> SFT -> "
                         "eval -> RL per seed -> eval, and its record: miniature FAMILY [--rl-seeds S ...]",
                         "embodied_async.cli.miniature:miniature_command"),
    "recipes": Command("list the recipes of configs/ and what each runs", "embodied_async.cli.recipes:recipes_command"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items())
    return (f"usage: python -m embodied_async <command> [arguments]\n\ncommands:\n{rows}\n\n"
            "'python -m embodied_async <command> --help' describes a command's arguments.")


def run_here(argv: Sequence[str]) -> Outcome:
    """Run the command ``argv`` names (``[command, arguments...]``) in this process, as its driver
    would (for a pipeline of commands, itself a driver); its exit code and what it made."""
    command = COMMANDS[argv[0]]
    if command.here is None:
        raise ValueError(f"the command {argv[0]!r} cannot run as a pipeline's phase: "
                         f"use one of {[name for name, c in COMMANDS.items() if c.here]}")
    module, _, function = command.here.partition(":")
    return getattr(importlib.import_module(module), function)(list(argv[1:]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, arguments = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: no command {name!r}; the commands: {', '.join(COMMANDS)} "
              "('python -m embodied_async --help' says what each does)", file=sys.stderr)
        return 2
    module, _, function = COMMANDS[name].target.partition(":")
    return getattr(importlib.import_module(module), function)(arguments)
