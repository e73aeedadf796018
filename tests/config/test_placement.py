"""Placement parsing: accepted forms, and error messages that say what to fix."""

import pytest

from embodied_async.config.placement import (
    PlacementError,
    detect_num_gpus,
    parse_device_ids,
    parse_placement,
)


@pytest.mark.parametrize(
    "spec, expected",
    [
        (3, [3]),
        ("0", [0]),
        ("0-3", [0, 1, 2, 3]),
        ("0,2,4-7", [0, 2, 4, 5, 6, 7]),
        (" 1 , 3 ", [1, 3]),
        ("3,1", [3, 1]),  # written order is kept
        ("all", [0, 1, 2, 3]),
        ([0, "2-3"], [0, 2, 3]),
    ],
)
def test_parse_device_ids_forms(spec, expected):
    assert parse_device_ids(spec, num_devices=4) == expected


@pytest.mark.parametrize(
    "spec, fact",
    [
        ("3-1", "reversed range '3-1'"),
        ("-1", "negative id"),
        (-2, "negative id"),
        ("0,,2", "empty piece"),
        ("", "empty piece"),
        ("0,1,1", "id 1 is listed twice"),
        ("0-2,1", "id 1 is listed twice"),
        ("gpu0", "'gpu0' is not a non-negative integer"),
        ("1.5", "is not a non-negative integer"),
        (True, "boolean"),
        (None, "expected an int or a string"),
    ],
)
def test_parse_device_ids_errors(spec, fact):
    with pytest.raises(PlacementError) as err:
        parse_device_ids(spec, num_devices=8)
    message = str(err.value)
    assert fact in message
    assert repr(spec) in message  # names the bad spec
    assert '"0,2,4-7"' in message  # shows valid examples


def test_all_needs_device_count():
    with pytest.raises(PlacementError, match="needs the number of devices"):
        parse_device_ids("all")


def test_colocated():
    placement = parse_placement({"env,rollout,actor": "0-3"}, num_devices=4)
    assert placement == {"env": [0, 1, 2, 3], "rollout": [0, 1, 2, 3], "actor": [0, 1, 2, 3]}


def test_disaggregated_with_lists_all_and_ints():
    placement = parse_placement(
        {"actor": "0,2,4-7", "env": 1, " rollout ": "3"}, num_devices=8
    )
    assert placement == {"actor": [0, 2, 4, 5, 6, 7], "env": [1], "rollout": [3]}
    assert parse_placement({"env, rollout": "all", "actor": 0}, num_devices=2) == {
        "env": [0, 1],
        "rollout": [0, 1],
        "actor": [0],
    }


def test_gpu_ids_beyond_count():
    with pytest.raises(PlacementError) as err:
        parse_placement({"env,rollout": "0-1", "actor": "1-3"}, num_devices=2)
    message = str(err.value)
    assert "cluster.component_placement places actor on GPU 2" in message
    assert "this machine has 2 GPUs (ids 0-1)" in message
    assert "change cluster.component_placement" in message


def test_gpus_on_machine_without_gpus():
    with pytest.raises(PlacementError) as err:
        parse_placement({"env,rollout,actor": "0"}, num_devices=0)
    message = str(err.value)
    assert "asks for GPUs but this machine has none" in message
    assert "cluster.device_type=cpu" in message


def test_cpu_slots_accept_any_id_and_all_means_cpu_count():
    placement = parse_placement({"env": "0-15", "rollout,actor": "all"}, device_kind="cpu",
                                num_devices=3)
    assert placement == {"env": list(range(16)), "rollout": [0, 1, 2], "actor": [0, 1, 2]}
    default = parse_placement({"env,rollout,actor": "all"}, device_kind="cpu")
    assert len(default["env"]) >= 1


def test_missing_component():
    with pytest.raises(PlacementError) as err:
        parse_placement({"env": "0", "actor": "1"}, num_devices=2)
    assert "does not place component(s) rollout" in str(err.value)


def test_duplicated_component():
    with pytest.raises(PlacementError) as err:
        parse_placement({"env,rollout": "0", "rollout,actor": "1"}, num_devices=2)
    message = str(err.value)
    assert "places component 'rollout' twice" in message
    assert "'env,rollout'" in message and "'rollout,actor'" in message


def test_unknown_component():
    with pytest.raises(PlacementError) as err:
        parse_placement({"env,rollout,actor": "0", "critic": "1"}, num_devices=2)
    message = str(err.value)
    assert "unknown component 'critic'" in message
    assert "allowed components: env, rollout, actor" in message
    extra = parse_placement(
        {"env,rollout,actor": "0", "critic": "1"},
        num_devices=2,
        allowed=("env", "rollout", "actor", "critic"),
    )
    assert extra["critic"] == [1]


def test_bad_syntax_names_the_entry():
    with pytest.raises(PlacementError) as err:
        parse_placement({"env,rollout,actor": "0-"}, num_devices=2)
    message = str(err.value)
    assert "cluster.component_placement['env,rollout,actor']" in message
    assert "'0-'" in message
    with pytest.raises(PlacementError, match="empty component name"):
        parse_placement({"env,,rollout": "0", "actor": "0"}, num_devices=1)
    with pytest.raises(PlacementError, match="non-empty mapping"):
        parse_placement({}, num_devices=1)


@pytest.mark.parametrize("count", [0, 1, 4])
def test_detect_num_gpus_returns_the_visible_count_as_an_int(monkeypatch, count):
    import numpy as np
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: np.int64(count))  # a count that is not an int
    detected = detect_num_gpus()
    assert detected == count and type(detected) is int


def test_detect_num_gpus_is_0_without_a_working_torch(monkeypatch):
    import sys

    import torch

    def broken_driver():
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setattr(torch.cuda, "device_count", broken_driver)
    assert detect_num_gpus() == 0
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert detect_num_gpus() == 0
