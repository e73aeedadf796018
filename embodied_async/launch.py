"""A training run in a child process, exactly as a user starts one
(``python -m embodied_async train <recipe> key=value ...``): what the
pipeline and benchmark scripts use, so each run has a process, a log folder and a Ctrl-C of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Dict, List, Sequence

from embodied_async.metrics import read_metrics

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def training_command(recipe: str, log_path: str, overrides: Sequence[str] = ()) -> List[str]:
    """The command line of a run of ``recipe`` logging to ``log_path``."""
    return [sys.executable, "-m", "embodied_async", "train", recipe, f"runner.logger.log_path={log_path}", *overrides]


def train(recipe: str, overrides: Sequence[str], log_path: str) -> List[Dict]:
    """Run ``recipe`` in a fresh ``log_path`` (metrics.jsonl appends: a reused folder would mix two
    runs), its output in ``<log_path>.log``; its metric records. RuntimeError when it fails."""
    shutil.rmtree(log_path, ignore_errors=True)
    with open(log_path + ".log", "w") as out:
        proc = subprocess.run(training_command(recipe, log_path, overrides), cwd=REPO_ROOT, stdout=out,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"the run failed (exit {proc.returncode}); its output: {log_path}.log")
    return read_metrics(log_path)
