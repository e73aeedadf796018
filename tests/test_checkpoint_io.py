"""checkpoint_io: exact pickle-free round trips and refusal of damaged checkpoint folders."""

import json
import math
import os
import pickle

import pytest
import torch
from torch import nn

from embodied_async.checkpoint_io import (
    CheckpointError,
    assert_no_pickle,
    load_tree,
    save_tree,
    verify_checkpoint,
    write_manifest,
)


def realistic_tree():
    """What a trainer checkpoint holds: model + Adam state (int param ids), RNG state, misc."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model.register_buffer("running_stat", torch.randn(3, dtype=torch.float64))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": torch.Generator().get_state(),
        "meta": {"global_step": 7, "loss": float("nan"), "best": float("inf"), "worst": -float("inf"),
                 "note": "hello / world", "flags": [True, False, None],
                 "nested": [[1, 2.5], [], {"a": None}]},
        "extras": {3: torch.tensor(1.5), "3": torch.tensor([1, 2], dtype=torch.int64)},
        "dtypes": {str(dt): torch.arange(6).reshape(2, 3).to(dt) for dt in
                   (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64,
                    torch.float16, torch.bfloat16, torch.float32, torch.float64)},
        "scalar0d": torch.tensor(True),
        "empty": torch.zeros(0, 3),
    }


def assert_same(a, b, path="<root>"):
    """Exact equality: types (tuples may become lists), dict key types, dtype, shape, bits."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert b.is_contiguous(), path
        assert torch.equal(a.cpu(), b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict), path
        assert list(a) == list(b), path
        assert [type(k) for k in a] == [type(k) for k in b], path
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}/{i}")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert type(a) is type(b) and a == b, path


def make_checkpoint(folder):
    tree = realistic_tree()
    save_tree(tree, str(folder), "trainer")
    save_tree({"w": torch.ones(2)}, str(folder), "policy")
    write_manifest(str(folder), extra={"global_step": 7})
    return tree


def test_round_trip_realistic_tree(tmp_path):
    tree = make_checkpoint(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["manifest.json", "policy.json", "policy.safetensors",
                                            "trainer.json", "trainer.safetensors"]
    assert verify_checkpoint(str(tmp_path))["extra"] == {"global_step": 7}
    assert_no_pickle(str(tmp_path))
    loaded = load_tree(str(tmp_path), "trainer")
    assert_same(tree, loaded)
    # Adam keys its state by int param id: they must stay ints for load_state_dict
    assert all(type(k) is int for k in loaded["optimizer"]["state"])
    assert set(loaded["extras"]) == {3, "3"}
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model.register_buffer("running_stat", torch.zeros(3, dtype=torch.float64))
    model.load_state_dict(loaded["model"])
    torch.optim.Adam(model.parameters()).load_state_dict(loaded["optimizer"])
    torch.Generator().set_state(loaded["rng"])


def test_tensor_keys_are_tree_paths(tmp_path):
    from safetensors.torch import load_file

    make_checkpoint(tmp_path)
    keys = set(load_file(str(tmp_path / "trainer.safetensors")))
    assert {"optimizer/state/0/exp_avg", "model/0.weight", "rng", "scalar0d"} <= keys


def test_shared_storage_views_noncontiguous_and_tuples(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    tree = {"base": base, "view": base[1], "t": base.t(), "same": [base, base],
            "tup": (1, (2, torch.tensor(3))), "a/b": torch.ones(1), "a": {"b": torch.zeros(1)},
            "param": nn.Parameter(torch.ones(2))}
    save_tree(tree, str(tmp_path), "x")
    out = load_tree(str(tmp_path), "x")
    assert_same(tree, out)
    assert out["tup"] == [1, [2, torch.tensor(3)]]  # tuples come back as lists
    assert out["a/b"].item() == 1 and out["a"]["b"].item() == 0  # colliding paths kept apart


def test_root_tensor_and_scalar_trees(tmp_path):
    save_tree(torch.tensor(2.0, dtype=torch.float64), str(tmp_path), "t")
    assert_same(torch.tensor(2.0, dtype=torch.float64), load_tree(str(tmp_path), "t"))
    save_tree({"x": -0.0, "big": 2 ** 70}, str(tmp_path), "s")
    out = load_tree(str(tmp_path), "s")
    assert math.copysign(1, out["x"]) == -1 and out["big"] == 2 ** 70


@pytest.mark.parametrize("bad", [{True: 1}, {1.5: 1}, {"x": object()}, {"x": torch.zeros(2).numpy()},
                                 {"x": torch.zeros(2, 2).to_sparse()}])
def test_unsupported_values_rejected(tmp_path, bad):
    with pytest.raises(TypeError):
        save_tree(bad, str(tmp_path), "x")


def test_bad_name_rejected(tmp_path):
    with pytest.raises(ValueError):
        save_tree({}, str(tmp_path), "../escape")


def test_no_temp_files_left(tmp_path):
    make_checkpoint(tmp_path)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_tampered_byte_detected(tmp_path):
    make_checkpoint(tmp_path)
    path = tmp_path / "trainer.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # flip a byte in the tensor data: size unchanged, content not
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256") as e:
        verify_checkpoint(str(tmp_path))
    assert "trainer.safetensors" in str(e.value) and "tampered or corrupted" in str(e.value)
    assert "resume from an earlier checkpoint" in str(e.value)


def test_truncation_detected(tmp_path):
    make_checkpoint(tmp_path)
    path = tmp_path / "trainer.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=f"truncated: 100 bytes, expected {size}") as e:
        verify_checkpoint(str(tmp_path))
    assert "trainer.safetensors" in str(e.value)
    # without the manifest check, load_tree still refuses it and names the file
    with pytest.raises(CheckpointError, match="trainer.safetensors"):
        load_tree(str(tmp_path), "trainer")


def test_extra_file_detected(tmp_path):
    make_checkpoint(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "evil.pt").write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(CheckpointError, match="sub/evil.pt: not listed in the manifest"):
        verify_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointError, match="evil.pt"):
        assert_no_pickle(str(tmp_path))


def test_missing_file_detected(tmp_path):
    make_checkpoint(tmp_path)
    os.remove(tmp_path / "policy.json")
    with pytest.raises(CheckpointError, match="policy.json: missing"):
        verify_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointError, match="policy.json"):
        load_tree(str(tmp_path), "policy")


def test_missing_manifest(tmp_path):
    make_checkpoint(tmp_path)
    os.remove(tmp_path / "manifest.json")
    with pytest.raises(CheckpointError, match="not a checkpoint folder written by embodied_async"):
        verify_checkpoint(str(tmp_path))


def test_manifest_entry_outside_folder_rejected(tmp_path):
    make_checkpoint(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["files"]["../outside"] = {"size": 1, "sha256": "0" * 64}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="bad entry"):
        verify_checkpoint(str(tmp_path))


def test_parse_errors_name_the_file(tmp_path):
    save_tree({"w": torch.ones(2)}, str(tmp_path), "p")
    (tmp_path / "p.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="p.json"):
        load_tree(str(tmp_path), "p")
    save_tree({"w": torch.ones(2)}, str(tmp_path), "q")
    (tmp_path / "q.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="q.safetensors"):
        load_tree(str(tmp_path), "q")
    save_tree({"w": torch.ones(2)}, str(tmp_path), "r")
    (tmp_path / "r.json").write_text(json.dumps({"format": "embodied_async.tree", "version": 1,
                                                 "tree": {"__tensor__": "nope"}}))
    with pytest.raises(CheckpointError, match="r.json"):
        load_tree(str(tmp_path), "r")


def test_mismatched_pair_rejected(tmp_path):
    save_tree({"w": torch.ones(2), "v": torch.ones(1)}, str(tmp_path), "a")
    save_tree({"w": torch.ones(2)}, str(tmp_path), "b")
    os.replace(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    with pytest.raises(CheckpointError, match="not referenced"):
        load_tree(str(tmp_path), "b")


def test_assert_no_pickle_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        assert_no_pickle(str(tmp_path / "nope"))


def test_loading_never_unpickles(tmp_path, monkeypatch):
    tree = make_checkpoint(tmp_path)

    def forbidden(*args, **kwargs):
        raise AssertionError("checkpoint loading must not unpickle")

    class ForbiddenUnpickler:
        def __init__(self, *args, **kwargs):
            forbidden()

    for mod, attr in [(pickle, "loads"), (pickle, "load"), (torch, "load")]:
        monkeypatch.setattr(mod, attr, forbidden)
    monkeypatch.setattr(pickle, "Unpickler", ForbiddenUnpickler)
    verify_checkpoint(str(tmp_path))
    assert_no_pickle(str(tmp_path))
    assert_same(tree, load_tree(str(tmp_path), "trainer"))
    with pytest.raises(AssertionError):  # the patches are live
        pickle.loads(pickle.dumps(1))


def test_prune_keeps_the_newest_by_step_number_and_the_resume_source(tmp_path):
    from embodied_async.run_folder import prune_checkpoints

    for step in (1, 2, 10, 20):
        (tmp_path / f"global_step_{step}").mkdir()
    (tmp_path / "global_step_3.tmp").mkdir()  # a save in progress is not a checkpoint
    assert prune_checkpoints(str(tmp_path), None, 20) == []
    deleted = prune_checkpoints(str(tmp_path), 2, 20, protect=[str(tmp_path / "global_step_1")])
    assert sorted(os.path.basename(p) for p in deleted) == ["global_step_2"]
    assert sorted(os.listdir(tmp_path)) == ["global_step_1", "global_step_10", "global_step_20", "global_step_3.tmp"]
    prune_checkpoints(str(tmp_path), 1, 20)
    assert sorted(os.listdir(tmp_path)) == ["global_step_20", "global_step_3.tmp"]


def test_prune_after_resuming_from_an_older_step_keeps_what_this_run_wrote(tmp_path):
    """A run resumed from step 5 in a folder where an earlier run reached step 20: its new
    step-6 checkpoint survives, and the later leftovers are not counted."""
    from embodied_async.run_folder import prune_checkpoints

    for step in (5, 6, 20):
        (tmp_path / f"global_step_{step}").mkdir()
    saved = str(tmp_path / "global_step_6")
    prune_checkpoints(str(tmp_path), 1, 6, protect=[saved, str(tmp_path / "global_step_5")])
    assert sorted(os.listdir(tmp_path)) == ["global_step_20", "global_step_5", "global_step_6"]
    prune_checkpoints(str(tmp_path), 1, 6, protect=[saved])
    assert sorted(os.listdir(tmp_path)) == ["global_step_20", "global_step_6"]


def _policy_checkpoint(folder, family="mlp", hidden=8):
    """A checkpoint folder as a run writes it: the policy's tensors, model_info.json, a manifest."""
    from embodied_async.checkpoint_io import write_manifest

    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(4, hidden), nn.Linear(hidden, 2))
    os.makedirs(folder)
    save_tree({k: v.detach().clone() for k, v in policy.state_dict().items()}, str(folder), "model")
    with open(os.path.join(folder, "model_info.json"), "w") as f:
        json.dump({"family": family, "base": None, "contents": "trainable"}, f)
    write_manifest(str(folder))
    return policy


def test_init_from_takes_weights_and_refuses_another_family_or_shape(tmp_path):
    from types import SimpleNamespace

    from embodied_async.run_folder import check_init_from
    from embodied_async.workers.trainer_core import load_initial_weights

    source = _policy_checkpoint(tmp_path / "sft")
    check_init_from(str(tmp_path / "sft"), SimpleNamespace(name="mlp"))
    target = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    load_initial_weights(target, str(tmp_path / "sft"), SimpleNamespace(name="mlp"))
    for a, b in zip(source.parameters(), target.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(CheckpointError, match="holds a 'mlp' policy and this run's model.name is 'pi0'"):
        check_init_from(str(tmp_path / "sft"), SimpleNamespace(name="pi0"))
    wider = nn.Sequential(nn.Linear(4, 16), nn.Linear(16, 2))
    with pytest.raises(CheckpointError, match=r"does not fit this mlp policy.*shape \(8, 4\), policy \(16, 4\)"):
        load_initial_weights(wider, str(tmp_path / "sft"), SimpleNamespace(name="mlp"))
    with open(tmp_path / "sft" / "model.safetensors", "ab") as f:
        f.write(b"x")
    with pytest.raises(CheckpointError, match="model.init_from="):
        check_init_from(str(tmp_path / "sft"), SimpleNamespace(name="mlp"))


class _WithValueHead(nn.Module):
    """A policy shape with a trunk and a value head (``value_parameter_prefixes``)."""

    value_parameter_prefixes = ("value_head.",)

    def __init__(self, value_in: int):
        super().__init__()
        self.trunk = nn.Linear(4, 8)
        self.value_head = nn.Linear(value_in, 1)


def test_init_from_starts_a_value_head_of_another_shape_fresh_and_takes_the_rest(tmp_path, capsys):
    """A supervised run never trains the value head: an RL run whose value head reads another input
    (model.value_input) takes the checkpoint's other weights and a fresh value head."""
    from types import SimpleNamespace

    from embodied_async.checkpoint_io import write_manifest
    from embodied_async.workers.trainer_core import load_initial_weights

    torch.manual_seed(0)
    source = _WithValueHead(8)
    os.makedirs(tmp_path / "sft")
    save_tree({k: v.detach().clone() for k, v in source.state_dict().items()}, str(tmp_path / "sft"), "model")
    write_manifest(str(tmp_path / "sft"))
    target = _WithValueHead(31)
    fresh = target.value_head.weight.detach().clone()
    load_initial_weights(target, str(tmp_path / "sft"), SimpleNamespace(name="openvla"))
    assert torch.equal(target.trunk.weight, source.trunk.weight) and torch.equal(target.value_head.weight, fresh)
    assert "value head" in capsys.readouterr().out
    # the same shape: the value head comes from the checkpoint too
    same = _WithValueHead(8)
    load_initial_weights(same, str(tmp_path / "sft"), SimpleNamespace(name="openvla"))
    assert torch.equal(same.value_head.weight, source.value_head.weight)
    # another trunk is still refused
    other = _WithValueHead(8)
    other.trunk = nn.Linear(4, 16)
    with pytest.raises(CheckpointError, match="does not fit"):
        load_initial_weights(other, str(tmp_path / "sft"), SimpleNamespace(name="openvla"))


class _ValueFree(nn.Module):
    """A value-free policy (algorithm.adv_type=grpo): it names the prefix and has no value head."""

    value_parameter_prefixes = ("value_head.",)

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(4, 8)


def test_init_from_leaves_the_value_head_out_of_a_value_free_policy(tmp_path, capsys):
    from types import SimpleNamespace

    from embodied_async.checkpoint_io import write_manifest
    from embodied_async.workers.trainer_core import load_initial_weights

    torch.manual_seed(0)
    source = _WithValueHead(8)
    os.makedirs(tmp_path / "sft")
    save_tree({k: v.detach().clone() for k, v in source.state_dict().items()}, str(tmp_path / "sft"), "model")
    write_manifest(str(tmp_path / "sft"))
    target = _ValueFree()
    load_initial_weights(target, str(tmp_path / "sft"), SimpleNamespace(name="openvla"))
    assert torch.equal(target.trunk.weight, source.trunk.weight)
    out = capsys.readouterr().out
    assert "is left out: this policy has none" in out and "starts fresh" not in out
