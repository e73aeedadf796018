"""scripts/gpu_check_openvla.py keeps working: its tiny CPU shape prints the JSON figures."""

import json
import os
import subprocess
import sys

from conftest import REPO_ROOT


def test_gpu_check_runs_tiny_on_cpu():
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "scripts", "gpu_check_openvla.py"),
                           "--shape", "tiny", "--steps", "1", "--batch", "2", "--lora-rank", "4"],
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["rollout_actions_per_s"] > 0 and report["train_samples_per_s"] > 0
    assert 0 < report["trainable_parameters"] < report["parameters"]  # LoRA: adapters + value head only
    assert report["peak_memory_gb"] > 0
