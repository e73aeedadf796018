"""A pipeline's command in its own process (``pipeline.py``): the command of the one command line
(``cli.run_here``: collect, train, eval, in the runner's modes) run by its driver's code, its output
kept whole in the phase's log and the lines worth it shown live."""

from __future__ import annotations

import re
import sys
from typing import Sequence

QUIET = ("{", "}", "Token authentication is enabled")  # JSON reports and Ray's notice: in the phase's log only


def show_line(line: str) -> bool:
    """The lines of a phase worth showing live: progress every 50 steps and at the last, the
    commands' own messages, errors; everything is in the phase's log."""
    if line.startswith("step "):
        match = re.match(r"step (\d+)/(\d+)", line)
        return bool(match) and (int(match.group(1)) % 50 == 0 or match.group(1) == match.group(2))
    if "error" in line.lower():
        return True
    return bool(line.strip()) and not line.startswith((" ", "\t", *QUIET)) and "][INFO]" not in line \
        and "][WARNING]" not in line


class PhaseOutput:
    """Inside the block, what this process writes (its own lines, Ray's from the workers) goes to
    the phase's ``log``, and its whole lines worth showing (``show_line``) to the terminal too."""

    def __init__(self, log):
        self.log, self.shown, self.partial = log, sys.stdout, ""

    def write(self, text: str) -> int:
        self.log.write(text)
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        for line in lines:
            if show_line(line):
                self.shown.write(f"  {line}\n")
        return len(text)

    def flush(self) -> None:
        self.log.flush()
        self.shown.flush()

    def fileno(self) -> int:  # what asks for a file descriptor (a fault handler) gets the terminal's
        return self.shown.fileno()

    def isatty(self) -> bool:
        return False

    def __enter__(self):
        self.saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = self
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout, sys.stderr = self.saved


def run_phase(command: Sequence[str], log_file: str):
    """Run ``command`` (``[name, arguments...]`` of the command line) here, its output in
    ``log_file`` (line by line, so it can be followed) after the command itself; its
    ``cli.Outcome`` (exit code and result)."""
    from embodied_async.cli import run_here

    with open(log_file, "w", buffering=1) as log:
        log.write(" ".join(command) + "\n")
        with PhaseOutput(log):
            return run_here(command)


def last_error(log_file: str) -> str:
    """The phase's last line naming an error (the command's one line), else its last line."""
    with open(log_file) as f:
        lines = [line.strip() for line in f if line.strip()]
    for line in reversed(lines):
        if "error" in line.lower():
            return line
    return lines[-1] if lines else "no output"
