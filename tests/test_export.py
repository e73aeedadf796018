"""The export command (python -m embodied_async export): a run's checkpoint in its family's
published format (OpenVLA's Hugging Face layout, the state policies' safetensors + config.json),
loaded back through ``model.path`` to act exactly as the checkpoint did; the layout against the
fixture OpenVLA's own code wrote; the model card; the refusals; a push to the hub that cannot
reach it."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, reference_fixture
from omegaconf import OmegaConf
from safetensors.torch import load_file

from embodied_async.checkpoint_io import save_tree, write_manifest
from embodied_async.cli.export import export_command
from embodied_async.config.recipes import compose_recipe
from embodied_async.config.validate import to_eval_config
from embodied_async.registry import build_env, build_policy

FIXTURE_DATA_FILES = {"README.md", "expected_outputs.json", "input_ids.json", "intermediates.npz", "logits.npz",
                      "pixel_values.npz", "raw_images.npz"}


def make_run(log_dir, recipe, overrides, change_weights, evaluation=None):
    """A run's log folder as a run leaves it (Hydra's files, metrics.jsonl, a sealed checkpoint of
    the policy's trainable weights after ``change_weights(policy)``), made without training.
    Returns (checkpoint folder, the policy it holds, the env's spec)."""
    overrides = [f"runner.logger.log_path={log_dir}", *overrides]
    raw = compose_recipe(recipe, overrides)
    hydra_dir = os.path.join(log_dir, ".hydra")
    os.makedirs(hydra_dir, exist_ok=True)
    OmegaConf.save(raw, os.path.join(hydra_dir, "config.yaml"))
    OmegaConf.save(OmegaConf.create({"hydra": {"job": {"config_name": recipe}}}), os.path.join(hydra_dir, "hydra.yaml"))
    OmegaConf.save(OmegaConf.create(overrides), os.path.join(hydra_dir, "overrides.yaml"))
    raw.cluster.device_type = "cpu"
    cfg = to_eval_config(raw)
    env = build_env(cfg.env, 1, 0)
    spec = env.spec
    env.close()
    torch.manual_seed(0)
    policy = build_policy(cfg.model, spec, device=torch.device("cpu")).eval()
    change_weights(policy)
    trainable = {k: v for k, v in policy.state_dict().items()
                 if k in {n for n, p in policy.named_parameters() if p.requires_grad} or "statistics" in k
                 or "normalizer" in k}
    folder = os.path.join(log_dir, "checkpoints", "global_step_3")
    save_tree(trainable, folder, "model")
    with open(os.path.join(folder, "runner.json"), "w") as f:
        json.dump({"step": 3, "env_steps": 96, "version": 3}, f)
    with open(os.path.join(folder, "model_info.json"), "w") as f:
        json.dump({"family": cfg.model.name, "base": getattr(cfg.model, "path", None), "contents": "trainable"}, f)
    write_manifest(folder)
    with open(os.path.join(log_dir, "metrics.jsonl"), "w") as f:
        for record in evaluation or []:
            f.write(json.dumps(record) + "\n")
    return folder, policy, spec


# a hub that cannot be reached, wherever the tests run: nothing listens on port 9 of this machine
UNREACHABLE_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9"}


def run_export(*args):
    return subprocess.run([sys.executable, "-m", "embodied_async", "export", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, **UNREACHABLE_HUB})


def observations(spec, n=3, seed=0):
    rng = np.random.default_rng(seed)
    obs = {key: (rng.integers(0, 256, (n, *shape), dtype=np.uint8) if spec.obs_dtypes.get(key) == "uint8"
                 else rng.normal(size=(n, *shape)).astype(np.float32))
           for key, shape in spec.obs_shapes.items()}
    obs["task_descriptions"] = ["push the cube to the goal"] * n
    return obs


# ---- OpenVLA -------------------------------------------------------------------------------------

def _train_lora_openvla(policy):
    """Stand-in for training: the adapters, the value head and the action range all move, so an
    export that dropped the adapters or kept the base's range would act (or say) otherwise."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn(param.shape, generator=generator))
    stats = policy.action_stats
    policy.set_input_statistics({"actions": {"q01": stats["q01"] - 0.05, "q99": stats["q99"] + 0.1}})


@pytest.fixture(scope="module")
def openvla_run(tmp_path_factory):
    log = tmp_path_factory.mktemp("openvla_run")
    evaluation = [{"step": 2, "eval/success_rate": 0.25, "eval/episodes": 8.0},
                  {"step": 3, "train/actor/policy_loss": 0.1}]
    checkpoint, policy, spec = make_run(
        str(log), "maniskill_async_ppo_openvla_tiny", [f"model.path={log}/tiny_openvla"], _train_lora_openvla,
        evaluation)
    out = str(log / "export")
    proc = run_export(checkpoint, "--out", out, "--stats-key", "pushcube")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return checkpoint, policy, spec, out, str(log / "tiny_openvla")


@pytest.mark.slow
def test_openvla_export_acts_as_the_checkpoint_with_the_same_greedy_tokens(openvla_run):
    from models.openvla.policy_openvla import OpenVLAPolicy

    _, policy, spec, out, _ = openvla_run
    exported = OpenVLAPolicy.from_pretrained(out, unnorm_key="pushcube").eval()
    obs = observations(spec, n=4)
    torch.manual_seed(0)
    expected = policy.predict(obs, mode="eval")
    got = exported.predict(obs, mode="eval")
    assert torch.equal(got.forward_inputs["action_tokens"], expected.forward_inputs["action_tokens"])
    np.testing.assert_array_equal(got.actions.numpy(), expected.actions.numpy())
    assert exported.lora_enabled is False and not any("lora_" in n for n, _ in exported.named_parameters())


@pytest.mark.slow
def test_openvla_export_is_laid_out_as_openvlas_own_checkpoint(openvla_run):
    _, policy, _, out, base = openvla_run
    fixture = reference_fixture("openvla_tiny_a")
    # the fixture's files, less its test data; vision_overrides.json is what a tiny ViT needs
    assert set(os.listdir(out)) == set(os.listdir(fixture)) - FIXTURE_DATA_FILES | {"README.md"}
    for name in ("config.json", "generation_config.json", "preprocessor_config.json"):
        with open(os.path.join(fixture, name)) as f:
            want = json.load(f)
        with open(os.path.join(out, name)) as f:
            got = json.load(f)
        # the tiny base has the fixture's architecture: every field equal but the statistics
        assert {k: v for k, v in got.items() if k != "norm_stats"} == \
            {k: v for k, v in want.items() if k != "norm_stats"}, name
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(fixture, "config.json")) as f:
        reference = json.load(f)
    assert set(config["text_config"]) == set(reference["text_config"])
    assert list(config["norm_stats"]) == ["pushcube"]
    entry, reference_entry = config["norm_stats"]["pushcube"], reference["norm_stats"]["tiny_dataset"]
    assert set(entry) == set(reference_entry) and set(entry["action"]) <= set(reference_entry["action"])
    stats = policy.action_stats  # the range the policy was trained with, not the base's
    np.testing.assert_allclose(entry["action"]["q01"], stats["q01"])
    np.testing.assert_allclose(entry["action"]["q99"], stats["q99"])
    tensors, fixture_tensors = load_file(os.path.join(out, "model.safetensors")), \
        load_file(os.path.join(fixture, "model.safetensors"))
    assert set(tensors) == set(fixture_tensors)  # the official names, no adapter, no value head
    base_tensors = load_file(os.path.join(base, "model.safetensors"))
    assert {k: v.shape for k, v in tensors.items()} == {k: v.shape for k, v in base_tensors.items()}
    assert all(t.dtype == torch.float32 for t in tensors.values())
    changed = [k for k in tensors if not torch.equal(tensors[k], base_tensors[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)  # the merged adapters' layers


@pytest.mark.slow
def test_the_model_card_says_where_the_policy_came_from(openvla_run):
    checkpoint, _, _, out, base = openvla_run
    with open(os.path.join(out, "README.md")) as f:
        card = f.read()
    for fact in (f"`{base}`", "`maniskill_async_ppo_openvla_tiny` with", "`PushCube-v1`", "3 steps, 96 env steps",
                 "success 0.250 (95% CI 0.071-0.591) over 8 episodes at step 2", "`pushcube`", "code version",
                 'unnorm_key="pushcube"', "LoRA adapters of"):
        assert fact in card, fact


@pytest.mark.slow
def test_an_sft_export_files_the_datasets_statistics_and_names_the_dataset(tmp_path):
    from demonstrations import random_demonstrations

    from embodied_async.datasets.reader import DatasetReader

    log = tmp_path / "sft_run"
    raw = compose_recipe("maniskill_sft_openvla_tiny", [f"model.path={log}/tiny_openvla"])
    raw.cluster.device_type = "cpu"
    root = random_demonstrations(str(tmp_path / "demos"), to_eval_config(raw).env, episodes=3, length=5)
    actions = DatasetReader(root).stats["action"]

    def trained_on_the_dataset(policy):  # what the SFT trainer does before its first step
        policy.set_input_statistics({"actions": actions})

    checkpoint, policy, _ = make_run(str(log), "maniskill_sft_openvla_tiny",
                                     [f"model.path={log}/tiny_openvla", f"dataset.root={root}"], trained_on_the_dataset)
    out = str(tmp_path / "export")
    assert export_command([checkpoint, "--out", out]) == 0
    with open(os.path.join(out, "config.json")) as f:
        entry = json.load(f)["norm_stats"]["PushCube-v1"]
    np.testing.assert_allclose(entry["action"]["q99"], actions["q99"])
    np.testing.assert_allclose(entry["action"]["min"], actions["min"])
    np.testing.assert_allclose(entry["action"]["std"], actions["std"])
    assert (entry["num_trajectories"], entry["num_transitions"]) == (3, 15)
    with open(os.path.join(out, "README.md")) as f:
        assert f"`{root}`: 3 episodes, 15 frames" in f.read()


# ---- the state policies --------------------------------------------------------------------------

def _train_mlp(policy):
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
        policy.normalizer.mean.add_(0.5)


@pytest.mark.slow
def test_an_mlp_export_loads_by_model_path_and_acts_the_same(tmp_path):
    checkpoint, policy, spec = make_run(str(tmp_path / "run"), "maniskill_async_ppo_mlp",
                                        ["model.hidden_sizes=[24,24]"], _train_mlp)
    out = str(tmp_path / "export")
    assert export_command([checkpoint, "--out", out]) == 0
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "model.safetensors"]
    # the recipe's default widths differ: the folder's architecture wins
    raw = compose_recipe("maniskill_async_ppo_mlp", [f"model.path={out}"])
    raw.cluster.device_type = "cpu"
    loaded = build_policy(to_eval_config(raw).model, spec, device=torch.device("cpu")).eval()
    obs = observations(spec)
    got, want = loaded.predict(obs, mode="eval"), policy.predict(obs, mode="eval")
    torch.testing.assert_close(got.actions, want.actions, rtol=0, atol=0)
    torch.testing.assert_close(got.values, want.values, rtol=0, atol=0)
    # a run that started from the export, under the recipe's widths, exports the export's architecture
    again, _, _ = make_run(str(tmp_path / "run2"), "maniskill_async_ppo_mlp", [f"model.path={out}"], lambda p: None)
    assert export_command([again, "--out", str(tmp_path / "export2")]) == 0
    with open(tmp_path / "export2" / "config.json") as f:
        assert json.load(f)["architecture"]["hidden_sizes"] == [24, 24]


# ---- refusals and the hub ------------------------------------------------------------------------

def test_what_is_not_our_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    assert export_command([reference_fixture("openvla_tiny_a"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a checkpoint" in err and "embodied_async runs" in err
    assert not os.path.exists(tmp_path / "out")


def test_an_occupied_out_folder_is_refused_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert export_command([str(tmp_path / "no_checkpoint"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--overwrite" in err and (out / "keep.txt").read_text() == "mine"


@pytest.mark.slow
def test_overwrite_replaces_an_export_and_out_may_not_overlap_what_it_reads(tmp_path, capsys):
    checkpoint, _, _ = make_run(str(tmp_path / "run"), "maniskill_async_ppo_mlp", ["model.hidden_sizes=[8]"],
                                lambda policy: None)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("an earlier export")
    assert export_command([checkpoint, "--out", str(out), "--overwrite"]) == 0
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "model.safetensors"]
    assert [p for p in os.listdir(tmp_path) if "export-" in p] == []  # no temporary folder left
    capsys.readouterr()
    for overlapping in (tmp_path / "run", os.path.join(checkpoint, "hf"), checkpoint, tmp_path):
        assert export_command([checkpoint, "--out", str(overlapping), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "overlaps" in err, err
    assert os.path.isfile(os.path.join(checkpoint, "manifest.json")) and not os.path.exists(os.path.join(checkpoint,
                                                                                                          "hf"))


@pytest.mark.slow
def test_a_pi0_run_exports_through_the_command_in_lerobots_layout(tmp_path):
    from models.pi0.policy_pi0 import build_pi0_policy  # noqa: F401  (the family the run trains)

    log = tmp_path / "pi0_run"
    checkpoint, policy, spec = make_run(str(log), "maniskill_async_ppo_pi0_tiny", [f"model.path={log}/tiny_pi0"],
                                        lambda p: None)
    out = str(tmp_path / "export")
    proc = run_export(checkpoint, "--out", out)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    fixture_files = set(os.listdir(reference_fixture("pi0_tiny_lerobot"))) - {"expected.npz", "inputs.npz"}
    assert set(os.listdir(out)) == fixture_files  # meta.json: the tiny SigLIP's head count
    raw = compose_recipe("maniskill_async_ppo_pi0_tiny", [f"model.path={out}", "model.lora.enabled=false"])
    raw.cluster.device_type = "cpu"
    loaded = build_policy(to_eval_config(raw).model, spec, device=torch.device("cpu")).eval()
    obs = observations(spec)
    torch.manual_seed(5)
    want = policy.predict(obs, mode="eval").actions
    torch.manual_seed(5)
    torch.testing.assert_close(loaded.predict(obs, mode="eval").actions, want, atol=1e-5, rtol=0)


def test_a_family_without_a_published_format_is_refused(tmp_path, capsys, monkeypatch):
    from models.mlp.configuration_mlp import MLPConfig

    checkpoint, _, _ = make_run(str(tmp_path / "run"), "maniskill_async_ppo_mlp", ["model.hidden_sizes=[8]"],
                                lambda policy: None)
    monkeypatch.setattr(MLPConfig, "exporter", None)
    assert export_command([checkpoint, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'mlp' policy family has no published format" in err
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow
def test_a_push_without_network_fails_in_one_line_and_leaves_the_folder_complete(tmp_path):
    """The hub is unreachable (UNREACHABLE_HUB): the upload is huggingface_hub's own, no stand-in."""
    checkpoint, _, _ = make_run(str(tmp_path / "run"), "maniskill_async_ppo_mlp", ["model.hidden_sizes=[8]"],
                                lambda policy: None)
    out = str(tmp_path / "export")
    proc = run_export(checkpoint, "--out", out, "--push-to-hub", "someone/pushcube-mlp")
    assert proc.returncode == 1
    error = [line for line in proc.stderr.splitlines() if line.startswith("export error")]
    assert len(error) == 1 and "'someone/pushcube-mlp'" in error[0] and "offline" in error[0], proc.stderr[-2000:]
    assert "hf upload someone/pushcube-mlp" in error[0] and "--private" in error[0]  # as the push would create it
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "model.safetensors"]
