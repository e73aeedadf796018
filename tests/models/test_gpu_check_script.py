"""scripts/gpu_check.py runs the recipe's model path without Ray, ManiSkill, Hydra or omegaconf
(a GPU machine may have none of them): here on the CPU with the tiny shape, in float32 and in the
GPU's bfloat16 mixed precision (FSDP2 then shards a single rank too)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

# make importing them fail, as on a machine that lacks them
BLOCK = ("import sys, runpy; sys.modules.update(dict.fromkeys(['ray', 'mani_skill', 'hydra', 'omegaconf'])); "
         "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_check_runs_tiny_on_cpu_without_ray_maniskill_hydra(tmp_path, dtype):
    script = os.path.join(REPO_ROOT, "scripts", "gpu_check.py")
    output = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, "-c", BLOCK, script, "--device", "cpu", "--shape", "tiny", "--steps", "1",
                           "--rollout-batch", "4", "--micro-batch", "8", "--dtype", dtype, "--output", str(output)],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert json.loads(output.read_text()) == report
    assert report["dtype"] == dtype
    assert set(report["phases"]) == {"build", "rollout", "shard", "actor", "publish", "load", "sft_openvla", "pi0"}
    assert report["sft_openvla"]["loss"] > 0 and report["pi0"]["loss"] > 0
    assert all(p["seconds"] >= 0 and p["peak_memory_gb"] > 0 for p in report["phases"].values())
    assert all(report["phases"][name]["seconds"] > 0 for name in ("build", "rollout", "actor"))
    assert report["rollout_decisions_per_s"] > 0 and report["train_samples_per_s"] > 0
    assert report["micro_batch"] == 8 and report["optimizer_steps"] == 1.0 == report["pi0"]["ppo_optimizer_steps"]
    # only adapters and value head are published, in the compute dtype
    assert 0 < report["trainable_parameters"] < report["parameters"]
    assert report["published_bytes"] == (4 if dtype == "float32" else 2) * report["trainable_parameters"]
    # rollout copy and actor hold the same weights at version 0: the log-probs agree, up to bf16's
    # rounding of two different passes (KV-cached sampling, one full pass: up to ~1e-3 seen). The
    # sharded actor must re-score the data as sampled: Pi0's chains rounded to bf16 on the way in
    # (FSDP's default input cast) put its gap at ~0.2 nats.
    bound = 1e-3 if dtype == "float32" else 1e-2
    assert report["logprob_gap_version_0"] < bound
    assert report["pi0"]["logprob_gap_version_0"] < bound
    assert report["maniskill_gpu"] == "skipped: no GPU"
