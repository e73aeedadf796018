"""python -m embodied_async miniature, the whole VLA workflow in one command: scripted demonstrations, SFT,
evaluation, async PPO from the SFT checkpoint, evaluation on the same seeds, the record. Here in
its smoke size (2 demonstrations, 2 SFT steps, 1 PPO update, 2 evaluation episodes each), with
LoRA on (model.lora.enabled=true for every phase): the tiny OpenVLA's adapters are trained by SFT,
carried into RL by model.init_from and published to the rollout."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO_ROOT, assert_logs_every_recipe_metric

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess

def _run(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "embodied_async", "miniature", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_miniature_runs_every_phase_records_them_and_keeps_finished_phases(tmp_path):
    out = tmp_path / "openvla"
    # two RL seeds from one SFT checkpoint, with two of the levers for VLAs: a privileged critic and
    # demonstrations in the loss
    proc = _run("openvla", "--smoke", "--out", str(out), "--record", str(tmp_path / "benchmarks"),
                "--rl-seeds", "0", "1", "model.lora.enabled=true", "rl:model.value_input=privileged_states",
                "rl:env.privileged_states=true", "rl:algorithm.demo_loss_coef=0.5", "rl:algorithm.demo_batch_size=4")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    with open(out / "record.json") as f:
        summary = json.load(f)
    assert summary["rl_seeds"] == [0, 1] and [r["rl_seed"] for r in summary["seeds"]] == [0, 1]
    gain = summary["gain"]["deterministic"]
    assert gain["n"] == 2 and gain["ci95"][0] <= gain["mean"] <= gain["ci95"][1]
    assert "sampled" in summary["gain"]
    with open(out / "record_seed0.json") as f:
        record = json.load(f)
    assert record == summary["seeds"][0]
    assert record["family"] == "openvla" and record["task"] == "PushCube-v1" and record["rl_seed"] == 0
    assert record["demonstrations"]["episodes"] == 2 and record["demonstrations"]["frames"] > 2
    evaluation = record["evaluation"]
    for entry in (evaluation, evaluation["sampled"]):  # both decision rules, before and after RL
        for name in ("before_rl", "after_rl"):
            low, high = entry[name]["ci95"]
            assert 0.0 <= low <= entry[name]["success_rate"] <= high <= 1.0
    # every evaluation ran the same episodes: the same seed, and the checkpoints of the runs
    reports = {}
    for name in ("eval_sft", "eval_rl_seed0", "eval_rl_seed1", "eval_sft_sampled", "eval_rl_seed1_sampled"):
        with open(out / f"{name}.json") as f:
            reports[name] = json.load(f)
    before, after = reports["eval_sft"], reports["eval_rl_seed0"]
    assert len({r["seed"] for r in reports.values()}) == 1 and before["episodes"] == after["episodes"] == 2
    assert reports["eval_sft_sampled"]["decision_rule"] == "sampled" and before["decision_rule"] == "deterministic"
    assert before["checkpoint"].endswith(os.path.join("sft", "checkpoints", "global_step_2"))
    assert after["checkpoint"].endswith(os.path.join("rl_seed0", "checkpoints", "global_step_1"))
    # each RL run started from the SFT checkpoint, with its own seed
    for seed in (0, 1):
        with open(out / f"rl_seed{seed}" / ".hydra" / "config.yaml") as f:
            text = f.read()
        assert f"init_from: {before['checkpoint']}" in text and f"seed: {seed}" in text
    assert record["rl_updates"] == 1 and record["rl_env_steps"] > 0
    assert record["sft_curve"] == []  # a smoke SFT evaluates only its checkpoint, in eval_sft
    # the tiny checkpoint was made in the official format at model.path and loaded back by path
    assert os.path.isfile(out / "rl_seed0" / "tiny_openvla" / "model.safetensors")
    with open(out / "rl_seed0" / "metrics.jsonl") as f:
        rl_records = [json.loads(line) for line in f]
    assert_logs_every_recipe_metric(rl_records[-1])  # every metric the other recipes log
    with open(out / "rl_seed0" / "metrics.jsonl") as f:
        trained = [r for r in map(json.loads, f) if "train/actor/current_version" in r]
    assert all(np.isfinite(r["train/demo/loss"]) for r in trained if r["train/actor/optimizer_steps"])
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
    stem = f"{record['date']}-miniature-openvla-pushcube-v1"
    assert copies == [f"{stem}-seed0.json", f"{stem}-seed1.json", f"{stem}.json", f"{stem}.png"]
    assert "success after SFT" in proc.stdout
    # the value-free lever on a third seed, scored by progress: SFT and its evaluation are kept, one RL
    # run and its evaluation run
    proc = _run("openvla", "--smoke", "--out", str(out), "--rl-seeds", "2", "--rl-recipe",
                "maniskill_miniature_grpo_openvla", "model.lora.enabled=true", "rl:algorithm.group_size=2",
                "rl:rollout.num_steps=20", "rl:actor.global_batch_size=20", "rl:actor.micro_batch_size=10",
                "rl:env.reward_mode=normalized_dense", "rl:env.reward=progress",
                "rl:algorithm.logprob_type=token_level")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "sft: done in an earlier run" in proc.stdout and "rl_seed2: starting" in proc.stdout
    with open(out / "rl_seed2" / "metrics.jsonl") as f:
        trained = [r for r in map(json.loads, f) if "train/actor/current_version" in r]
    assert trained and all("train/grpo/groups" in r and "train/critic/value_loss" not in r for r in trained)
    # a success reward drops every group of a policy that never succeeds; progress ranks failures too
    assert all(r["train/grpo/groups_dropped"] < r["train/grpo/groups"] for r in trained)
    with open(out / "record.json") as f:
        assert json.load(f)["recipes"]["rl"] == "maniskill_miniature_grpo_openvla"


@pytest.mark.slow
def test_pi0s_miniature_runs_rl_on_the_gaussian_action_with_the_anchor_from_its_sft_checkpoint(tmp_path):
    """Issue 47's modes through the one command: SFT trains the flow (flow_sde), RL samples the
    executed action around the deterministic chain's end (model.noise_method=action_gaussian) with
    a KL toward the warm start; the action std, an RL-only head, starts fresh, and the SFT
    checkpoint's sampled evaluation samples as RL does."""
    out = tmp_path / "pi0"
    proc = _run("pi0", "--smoke", "--out", str(out), "--rl-recipe", "maniskill_miniature_grpo_pi0",
                "rl:model.noise_method=action_gaussian", "rl:model.action_std=0.2", "rl:algorithm.anchor_kl_coef=0.1",
                "rl:algorithm.group_size=2", "rl:env.reward_mode=normalized_dense", "rl:env.reward=progress")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    with open(out / "rl_seed0.log") as f:
        log = f.read()
    assert "has no action log std (only RL trains it): it starts fresh" in log
    with open(out / "rl_seed0" / "metrics.jsonl") as f:
        trained = [r for r in map(json.loads, f) if "train/actor/current_version" in r]
    assert trained and all(np.isfinite(r["train/actor/anchor_kl"]) and r["train/actor/anchor_kl"] >= 0
                           for r in trained)
    with open(out / "eval_sft_sampled.log") as f:
        command = f.readline()
    assert "model.noise_method=action_gaussian" in command and "model.action_std=0.2" in command
    with open(out / "record.json") as f:
        record = json.load(f)
    assert record["recipes"]["rl"] == "maniskill_miniature_grpo_pi0" and record["family"] == "pi0"


def _stub_record(monkeypatch):
    """The record is not written (its phases' results are stubs)."""
    from embodied_async import miniature

    for name in ("build_record", "summary_record", "write_record"):
        monkeypatch.setattr(miniature, name, lambda *args: {})
    monkeypatch.setattr(miniature, "summary_line", lambda record: "")


def _miniature(*argv):
    from embodied_async.cli.miniature import parse
    from embodied_async.miniature import Miniature

    return Miniature(parse(list(argv)))


def _pipeline(tmp_path, monkeypatch, *argv, family="openvla"):
    """A miniature whose phases only note that they ran."""
    from embodied_async.miniature import Miniature

    ran = []
    monkeypatch.setattr(Miniature, "run_phase", lambda self, phase, pipeline, continued: ran.append(phase.name) or {})
    _stub_record(monkeypatch)
    _miniature(family, "--out", str(tmp_path / "out"), *argv).run()
    return ran


def test_the_phases_run_as_the_yaml_declares_them():
    """configs/pipelines/miniature.yaml's phases: those run once, then each seed's, each standing on
    the same seed's phases; a declaration that cannot run is refused naming the phase."""
    from embodied_async.cli.errors import CommandError
    from embodied_async.miniature import SHARED
    from embodied_async.pipeline import declared_phases

    phases = declared_phases(SHARED["phases"], [3, 5], "miniature.yaml")
    assert [(p.name, p.command, p.stands_on, p.seed) for p in phases] == [
        ("collect", "collect", (), None), ("sft", "train", ("collect",), None), ("eval_sft", "eval", ("sft",), None),
        ("rl_seed3", "train", ("sft",), 3), ("eval_rl_seed3", "eval", ("rl_seed3",), 3),
        ("rl_seed5", "train", ("sft",), 5), ("eval_rl_seed5", "eval", ("rl_seed5",), 5)]
    for declaration, why in (([{"name": "a", "command": "export"}], "runs 'export': a phase runs one of"),
                             ([{"name": "a", "command": "eval", "stands_on": ["b"]}], "stands on 'b'"),
                             ([{"name": "a", "command": "eval", "per_seed": True}, {"name": "b", "command": "eval",
                                                                                    "stands_on": ["a"]}],
                              "stands on 'a'"),
                             ([{"name": "a", "command": "eval", "after": "b"}], "only the keys")):
        with pytest.raises(CommandError, match=why):
            declared_phases(declaration, [0], "x.yaml")


def test_a_repeated_command_keeps_finished_phases_and_reruns_from_the_first_changed_one(tmp_path, monkeypatch):
    rl = ["rl_seed0", "eval_rl_seed0"]
    assert _pipeline(tmp_path, monkeypatch) == ["collect", "sft", "eval_sft", *rl]
    assert _pipeline(tmp_path, monkeypatch) == []
    # more RL seeds: only the new ones run, from the same SFT checkpoint
    assert _pipeline(tmp_path, monkeypatch, "--rl-seeds", "0", "1", "2") == \
        ["rl_seed1", "eval_rl_seed1", "rl_seed2", "eval_rl_seed2"]
    # an RL setting: the demonstrations, SFT and its evaluation are kept
    assert _pipeline(tmp_path, monkeypatch, "rl:actor.lr=5e-5") == rl
    # more evaluation episodes: both evaluations, not the runs they score
    assert _pipeline(tmp_path, monkeypatch, "rl:actor.lr=5e-5", "--eval-episodes", "200") == \
        ["eval_sft", "eval_rl_seed0"]
    # a setting of every phase (the env) runs them all; --restart too
    assert _pipeline(tmp_path, monkeypatch, "rl:actor.lr=5e-5", "--eval-episodes", "200", "env.num_envs=4") == \
        ["collect", "sft", "eval_sft", *rl]
    assert len(_pipeline(tmp_path, monkeypatch, "--restart")) == 5
    # a damaged state file is named
    (tmp_path / "out" / "pipeline.json").write_text("{not json")
    from embodied_async.cli.errors import CommandError

    with pytest.raises(CommandError, match="pipeline.json is damaged"):
        _pipeline(tmp_path, monkeypatch)


def test_sft_from_runs_rl_from_another_folders_sft_checkpoint(tmp_path, monkeypatch):
    from embodied_async.cli.errors import CommandError

    assert len(_pipeline(tmp_path, monkeypatch)) == 5
    fork = ["--out", str(tmp_path / "fork"), "--sft-from", str(tmp_path / "out")]
    assert _pipeline(tmp_path, monkeypatch, *fork, "rl:algorithm.demo_loss_coef=0.3") == ["rl_seed0", "eval_rl_seed0"]
    assert _pipeline(tmp_path, monkeypatch, *fork, "rl:algorithm.demo_loss_coef=0.3") == []
    # the source made its SFT checkpoint anew: the fork's RL runs again from it
    assert _pipeline(tmp_path, monkeypatch, "--sft-steps", "10") == ["sft", "eval_sft", "rl_seed0", "eval_rl_seed0"]
    assert _pipeline(tmp_path, monkeypatch, *fork, "--sft-steps", "10", "rl:algorithm.demo_loss_coef=0.3") == \
        ["rl_seed0", "eval_rl_seed0"]
    with pytest.raises(CommandError, match="its collect phase ran with .* pass the same settings"):
        _pipeline(tmp_path, monkeypatch, *fork, "--sft-steps", "10", "env.num_envs=4")
    with pytest.raises(CommandError, match="has no pipeline.json"):
        _pipeline(tmp_path, monkeypatch, "--out", str(tmp_path / "fork"), "--sft-from", str(tmp_path / "none"))
    with pytest.raises(CommandError, match="this run's own --out"):
        _pipeline(tmp_path, monkeypatch, "--sft-from", str(tmp_path / "out"))


def test_a_forks_rl_run_starts_from_the_sources_sft_checkpoint_and_reads_its_demonstrations(tmp_path, monkeypatch):
    """The command line of a fork's RL run (the phases' commands recorded, none run)."""
    from embodied_async.miniature import Miniature
    from embodied_async.pipeline import Pipeline

    source = tmp_path / "out"
    checkpoint = str(source / "sft" / "checkpoints" / "global_step_2")
    monkeypatch.setattr(Miniature, "_collect", lambda self, phase: {"dataset": str(source / "demos")})
    monkeypatch.setattr(Miniature, "_sft", lambda self, phase: {"log": str(source / "sft"), "checkpoint": checkpoint})
    monkeypatch.setattr(Miniature, "_evaluate", lambda self, phase, *args: {})
    trained = {}

    def command(self, phase, label, arguments):
        log = next(item.split("=", 1)[1] for item in arguments if item.startswith("runner.logger.log_path="))
        trained.setdefault(log, [phase.command, *arguments])
        return {"log": log, "checkpoint": os.path.join(log, "checkpoints", "global_step_1")}

    monkeypatch.setattr(Pipeline, "command", command)
    _stub_record(monkeypatch)
    _miniature("openvla", "--out", str(source)).run()
    fork = tmp_path / "fork"
    _miniature("openvla", "--out", str(fork), "--sft-from", str(source), "rl:algorithm.demo_loss_coef=0.5").run()
    arguments = trained[str(fork / "rl_seed0")]
    assert arguments[:2] == ["train", "maniskill_miniature_ppo_openvla"]
    assert f"model.init_from={checkpoint}" in arguments and f"dataset.root={source / 'demos'}" in arguments
    assert "algorithm.demo_loss_coef=0.5" in arguments and str(fork / "sft") not in trained


def test_the_sft_checkpoint_is_evaluated_with_the_rl_recipes_decision_rule(tmp_path, monkeypatch):
    """A model key that shapes both decision rules (Pi0's model.initial_noise_scale) given to the RL
    phase is given to both evaluations of the SFT checkpoint too; a fork with --sft-from evaluates
    the SFT checkpoint again where its source decided otherwise, and keeps its RL runs."""

    assert len(_pipeline(tmp_path, monkeypatch, family="pi0")) == 5
    zero = "rl:model.initial_noise_scale=0"
    fork = ["--out", str(tmp_path / "fork"), "--sft-from", str(tmp_path / "out")]
    assert _pipeline(tmp_path, monkeypatch, *fork, "rl:actor.lr=1e-5", family="pi0") == ["rl_seed0", "eval_rl_seed0"]
    assert _pipeline(tmp_path, monkeypatch, *fork, "rl:actor.lr=1e-5", zero, family="pi0") == \
        ["eval_sft", "rl_seed0", "eval_rl_seed0"]
    assert _pipeline(tmp_path, monkeypatch, *fork, "rl:actor.lr=1e-5", zero, family="pi0") == []
    pipeline = _miniature("pi0", "--out", str(tmp_path / "fork"), zero)
    eval_sft = next(phase for phase in pipeline.pipeline.phases if phase.name == "eval_sft")
    assert pipeline._rl_model_values(pipeline.family.rule_keys) == ["model.initial_noise_scale=0"]
    assert pipeline.settings(eval_sft)["rule"] == ["model.initial_noise_scale=0"]
    # without such a key the evaluation's settings are those of earlier pipelines (their results stand)
    assert "rule" not in _miniature("pi0", "--out", str(tmp_path / "x")).settings(eval_sft)


def test_bad_input_is_refused_in_one_line(tmp_path):
    proc = _run("octo", "--out", str(tmp_path / "x"), timeout=120)
    assert proc.returncode == 2 and "unknown family 'octo'" in proc.stderr and "openvla" in proc.stderr
    proc = _run("openvla", "--out", str(tmp_path / "y"), "env.num_envs", timeout=120)
    assert proc.returncode == 2 and "sft:key=value" in proc.stderr


def test_more_rl_updates_continue_the_earlier_run_from_its_last_checkpoint(tmp_path, monkeypatch):
    """--rl-updates above an earlier RL run's, all else the same: the run resumes from that run's
    last checkpoint (runner.resume_dir) in its own folder, kept, and its time adds to the earlier
    one's; its evaluation runs again. Any other change starts the run afresh, and so does a run
    whose checkpoint is gone."""
    from embodied_async.miniature import Miniature
    from embodied_async.pipeline import Pipeline

    trained = []

    def command(self, phase, label, arguments):  # the training command Miniature._train builds, run as a stub
        value = {item.split("=", 1)[0]: item.split("=", 1)[1] for item in arguments if "=" in item}
        steps, log = int(value.get("runner.max_steps", 7)), value["runner.logger.log_path"]  # 7: "the recipe's"
        os.makedirs(os.path.join(log, "checkpoints", f"global_step_{steps}"))
        trained.append((label, steps, [item for item in arguments if item.startswith("runner.resume_dir=")]))
        root = os.path.join(log, "checkpoints")
        latest = max(os.listdir(root), key=lambda name: int(name.rsplit("_", 1)[1]))
        return {"log": log, "checkpoint": os.path.join(root, latest)}

    monkeypatch.setattr(Pipeline, "command", command)
    monkeypatch.setattr(Miniature, "_collect", lambda self, phase: {"dataset": "demos"})
    monkeypatch.setattr(Miniature, "_sft", lambda self, phase: {"checkpoint": "sft_checkpoint"})
    evaluated = []
    monkeypatch.setattr(Miniature, "_evaluate", lambda self, phase, *args: (
        evaluated.append(phase.seed) if phase.kind == "eval_rl" else None) or {})
    _stub_record(monkeypatch)

    def pipeline(*argv):
        trained.clear(), evaluated.clear()
        _miniature("pi0", "--out", str(tmp_path / "out"), *argv).run()
        with open(tmp_path / "out" / "pipeline.json") as f:
            return list(trained), list(evaluated), json.load(f)["phases"]

    log = str(tmp_path / "out" / "rl_seed0")
    first_checkpoint = os.path.join(log, "checkpoints", "global_step_4")
    assert pipeline("--rl-updates", "4")[:2] == ([("rl_seed0", 4, [])], [0])
    ran, evaluated_seeds, phases = pipeline("--rl-updates", "10")
    assert ran == [("rl_seed0", 10, [f"runner.resume_dir={first_checkpoint}"])] and evaluated_seeds == [0]
    assert os.path.isdir(first_checkpoint)  # its folder was kept
    rl = phases["rl_seed0"]
    assert rl["continued_from"]["checkpoint"] == first_checkpoint and rl["continued_from"]["updates"] == 4
    assert rl["seconds"] >= rl["continued_from"]["seconds"] and rl["checkpoint"].endswith("global_step_10")
    assert pipeline("--rl-updates", "10")[:2] == ([], [])
    # fewer updates, or another RL setting: afresh
    assert pipeline("--rl-updates", "6")[0] == [("rl_seed0", 6, [])]
    assert os.listdir(os.path.join(log, "checkpoints")) == ["global_step_6"]  # the earlier run's folder went
    assert pipeline("--rl-updates", "8", "rl:actor.lr=1e-5")[0] == [("rl_seed0", 8, [])]
    # the earlier run's checkpoint is gone: afresh
    import shutil
    shutil.rmtree(os.path.join(log, "checkpoints"))
    assert pipeline("--rl-updates", "12", "rl:actor.lr=1e-5")[0] == [("rl_seed0", 12, [])]
    # a run of the recipe's own count (no --rl-updates) is continued from the updates it made
    assert pipeline()[0] == [("rl_seed0", 7, [])]
    recipes_run = os.path.join(log, "checkpoints", "global_step_7")
    assert pipeline("--rl-updates", "9")[0] == [("rl_seed0", 9, [f"runner.resume_dir={recipes_run}"])]
    assert pipeline("--rl-updates", "9")[0] == []
