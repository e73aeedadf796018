"""scripts/miniature.py, the whole VLA workflow in one command: scripted demonstrations, SFT,
evaluation, async PPO from the SFT checkpoint, evaluation on the same seeds, the record. Here in
its smoke size (2 demonstrations, 2 SFT steps, 1 PPO update, 2 evaluation episodes each), with
LoRA on (model.lora.enabled=true for every phase): the tiny OpenVLA's adapters are trained by SFT,
carried into RL by model.init_from and published to the rollout."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, assert_logs_every_recipe_metric

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess

SCRIPT = os.path.join(REPO_ROOT, "scripts", "miniature.py")


def _run(*args, timeout=900):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_the_miniature_runs_every_phase_records_them_and_keeps_finished_phases(tmp_path):
    out = tmp_path / "openvla"
    proc = _run("openvla", "--smoke", "--out", str(out), "--record", str(tmp_path / "benchmarks"),
                "model.lora.enabled=true")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    with open(out / "record.json") as f:
        record = json.load(f)
    assert record["family"] == "openvla" and record["task"] == "PushCube-v1"
    assert record["demonstrations"]["episodes"] == 2 and record["demonstrations"]["frames"] > 2
    evaluation = record["evaluation"]
    for name in ("before_rl", "after_rl"):
        low, high = evaluation[name]["ci95"]
        assert 0.0 <= low <= evaluation[name]["success_rate"] <= high <= 1.0
    # both evaluations ran the same episodes: the same seed, and the checkpoints of the two runs
    with open(out / "eval_sft.json") as f:
        before = json.load(f)
    with open(out / "eval_rl.json") as f:
        after = json.load(f)
    assert before["seed"] == after["seed"] and before["episodes"] == after["episodes"] == 2
    assert before["checkpoint"].endswith(os.path.join("sft", "checkpoints", "global_step_2"))
    assert after["checkpoint"].endswith(os.path.join("rl", "checkpoints", "global_step_1"))
    # the RL run started from the SFT checkpoint
    with open(out / "rl" / ".hydra" / "config.yaml") as f:
        assert f"init_from: {before['checkpoint']}" in f.read()
    assert record["rl_updates"] == 1 and record["rl_env_steps"] > 0
    assert record["sft_curve"] == []  # a smoke SFT evaluates only its checkpoint, in eval_sft
    # the tiny checkpoint was made in the official format at model.path and loaded back by path
    assert os.path.isfile(out / "rl" / "tiny_openvla" / "model.safetensors")
    with open(out / "rl" / "metrics.jsonl") as f:
        rl_records = [json.loads(line) for line in f]
    assert_logs_every_recipe_metric(rl_records[-1])  # every metric the other recipes log
    # the rollout evaluated the weights the actor published after its update (adapters + value head)
    assert rl_records[-1]["eval/version"] == 1.0 and rl_records[-1]["train/actor/published_bytes"] > 0
    with open(out / "sft" / "checkpoints" / "global_step_2" / "model_info.json") as f:
        assert json.load(f)["family"] == "openvla"
    assert record["rl_curve"] and record["rl_curve"][-1]["env_steps"] == record["rl_env_steps"]
    assert set(record["phase_seconds"]) == {"collect", "sft", "eval_sft", "rl", "eval_rl"}
    costs = record["rl_costs"]
    assert costs["inference_ms_per_decision"] > 0 and costs["training_ms_per_decision"] > 0
    with open(out / "record.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    copies = sorted(os.listdir(tmp_path / "benchmarks"))
    assert copies == [f"{record['date']}-miniature-openvla-pushcube-v1.json",
                      f"{record['date']}-miniature-openvla-pushcube-v1.png"]
    assert "success after SFT" in proc.stdout



def _pipeline(tmp_path, monkeypatch, *argv):
    """A Pipeline whose phases only note that they ran (the record is not written)."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
    import miniature

    ran = []
    for phase in miniature.PHASES:
        monkeypatch.setattr(miniature.Pipeline, f"_{phase}", lambda self, phase=phase: ran.append(phase) or {})
    monkeypatch.setattr(miniature, "build_record", lambda *args: {})
    monkeypatch.setattr(miniature, "write_record", lambda *args: None)
    monkeypatch.setattr(miniature, "summary_line", lambda record: "")
    pipeline = miniature.Pipeline(miniature._parse(["openvla", "--out", str(tmp_path / "out"), *argv]))
    pipeline.run()
    return ran


def test_a_repeated_command_keeps_finished_phases_and_reruns_from_the_first_changed_one(tmp_path, monkeypatch):
    assert _pipeline(tmp_path, monkeypatch) == ["collect", "sft", "eval_sft", "rl", "eval_rl"]
    assert _pipeline(tmp_path, monkeypatch) == []
    # an RL setting: the demonstrations, SFT and its evaluation are kept
    assert _pipeline(tmp_path, monkeypatch, "rl:actor.lr=5e-5") == ["rl", "eval_rl"]
    # more evaluation episodes: both evaluations, and RL after the first
    assert _pipeline(tmp_path, monkeypatch, "rl:actor.lr=5e-5", "--eval-episodes", "200") == \
        ["eval_sft", "rl", "eval_rl"]
    # a setting of every phase (the env) runs them all; --restart too
    assert _pipeline(tmp_path, monkeypatch, "rl:actor.lr=5e-5", "--eval-episodes", "200", "env.num_envs=4") == \
        ["collect", "sft", "eval_sft", "rl", "eval_rl"]
    assert len(_pipeline(tmp_path, monkeypatch, "--restart")) == 5
    # a damaged state file is named
    (tmp_path / "out" / "pipeline.json").write_text("{not json")
    import miniature

    with pytest.raises(miniature.PipelineError, match="pipeline.json is damaged"):
        _pipeline(tmp_path, monkeypatch)


def test_bad_input_is_refused_in_one_line(tmp_path):
    proc = _run("octo", "--out", str(tmp_path / "x"), timeout=120)
    assert proc.returncode == 2 and "unknown family 'octo'" in proc.stderr and "openvla" in proc.stderr
    proc = _run("openvla", "--out", str(tmp_path / "y"), "env.num_envs", timeout=120)
    assert proc.returncode == 2 and "sft:key=value" in proc.stderr
