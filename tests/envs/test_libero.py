"""The LIBERO family: its simulators in child processes under ``.venv-libero`` (built by
``bash scripts/setup.sh --python-env libero``, which scripts/test.sh runs), checked at start-up
by asking LIBERO there."""

import dataclasses
import os

import numpy as np
import pytest
from conftest import REPO_ROOT
from hydra import compose, initialize_config_dir

from embodied_async.config import ConfigError, resolve
from embodied_async.config.hydra_schema import register_schema
from embodied_async.datasets.batches import open_dataset
from embodied_async.datasets.lerobot_format import DatasetError
from embodied_async.datasets.writer import DatasetWriter
from embodied_async.isolated.child import query
from embodied_async.registry import build_env, family_config
from embodied_async.serial_env import SerialEnv
from envs.libero.libero_env import LiberoEnv, task_places


def slow(test):
    """Starts LIBERO in child processes under .venv-libero (built on first use; a scene builds in
    3-15 s on a CPU)."""
    return pytest.mark.slow(pytest.mark.usefixtures("libero_python_env")(test))


FIRST_SPATIAL = "pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate"


def config(**overrides):
    settings = dict(task=FIRST_SPATIAL, image_size=[32, 32], max_episode_steps=2, settle_steps=1)
    return family_config("env", "libero")(**{**settings, **overrides})


@slow
def test_two_sub_envs_reset_from_the_official_initial_states_step_and_auto_reset():
    env = build_env(config(render_video=True, video_size=[48, 40]), 2, 0)
    try:
        spec = env.spec
        assert spec.action_dim == 7 and spec.reports_success and spec.control_hz == 20.0
        assert spec.obs_shapes["main_images"] == (32, 32, 3) and spec.obs_shapes["wrist_images"] == (32, 32, 3)
        assert spec.obs_shapes["states"] == (8,) and spec.instruction.startswith("pick up the black bowl")
        first = env.reset(seed=[3, 3])  # one seed, one initial state
        assert first.obs["video_frames"].shape == (2, 48, 40, 3)  # the agent view at env.video_size
        np.testing.assert_allclose(first.obs["states"][0], first.obs["states"][1], atol=1e-6)
        other = env.reset(seed=[3, 4])
        assert not np.allclose(other.obs["states"][0], other.obs["states"][1], atol=1e-6) or \
            not np.array_equal(other.obs["main_images"][0], other.obs["main_images"][1])
        out = None
        for _ in range(2):  # the time limit of 2 steps: truncated, bootstrapped, auto-reset
            out = env.step(np.zeros((2, 1, 7), np.float32))
        assert out.dones.all() and out.bootstrap.all() and not out.successes.any()
        assert out.final_obs is not None and out.obs["main_images"].dtype == np.uint8
    finally:
        env.close()


@slow
def test_episodes_go_through_the_official_initial_states_and_images_are_turned_upright():
    """Sub-env 1 of a task's 2 takes states 1, 3, 5 (the task's sub-envs together: 0, 1, 2, ...);
    a seed starts from that state; init_state fixes it. Images: LIBERO renders upside down, and
    OpenVLA's and openpi's LIBERO evaluations and datasets turn both cameras by 180 degrees."""
    settings = {**config().child_config(), "place": 1, "count": 2}
    seen = query("libero", "libero", "tests.support.libero_child_checks:reset_sequence_and_images", settings)
    assert seen["plain"] == [1, 3, 5] and seen["seeded"] == [7, 9] and seen["fixed"] == [4, 4]
    for camera in ("main", "wrist"):
        assert seen[camera].shape == (32, 32, 3) and seen[camera].std() > 0
        np.testing.assert_array_equal(seen[camera], seen[f"{camera}_raw"][::-1, ::-1])
        assert not np.array_equal(seen[camera], seen[f"{camera}_raw"])
    np.testing.assert_array_equal(seen["main_again"], seen["main_raw"])  # rendering repeats exactly
    assert not np.array_equal(seen["main_no_reflections"], seen["main_raw"])  # env.reflections=false shows


@slow
def test_fewer_triangles_change_the_picture_a_little_and_the_physics_not_at_all(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_ASYNC_CACHE", str(tmp_path))  # the reduced meshes' cache (the child inherits it)
    settings = {**config(image_size=[64, 64], mesh_fraction=0.25).child_config(), "place": 0, "count": 1}
    seen = query("libero", "libero", "tests.support.libero_child_checks:scene_at_two_mesh_fractions", settings)
    full, reduced = seen["full"], seen["reduced"]
    assert reduced["triangles"] < 0.4 * full["triangles"]  # the scene's ~300,000: most are visual
    for key in ("masses", "inertias", "state"):  # collision meshes and inertias untouched: the same episode
        np.testing.assert_array_equal(reduced[key], full[key], err_msg=key)
    difference = np.abs(reduced["image"].astype(int) - full["image"].astype(int))
    assert 0 < difference.mean() < 8, difference.mean()  # the same picture, coarser outlines
    assert list(tmp_path.glob("libero_low_poly/*.msh"))  # the scanned objects' copies, cached


@slow
def test_bad_names_are_refused_at_start_up_listing_the_valid_ones():
    with pytest.raises(ConfigError, match="env.suite='libero_nowhere' is not a LIBERO suite; the suites: .*goal"):
        config(suite="libero_nowhere").check()
    with pytest.raises(ConfigError, match=f"env.task='fly' is not a task of libero_spatial; its tasks: "
                                          f"{FIRST_SPATIAL},"):
        config(task="fly").check()
    with pytest.raises(ConfigError, match="env.wrist_camera='hand' is not a camera of LIBERO's scenes"):
        config(wrist_camera="hand").check()
    with pytest.raises(ConfigError, match=r"env.mesh_fraction=0 must be in \(0, 1\]; use 1.0 for the published scenes"):
        config(mesh_fraction=0).check()
    with pytest.raises(ConfigError, match=f"env.init_state=50 is out of range: {FIRST_SPATIAL} has 50 initial "
                                          "states, 0 to 49"):
        config(init_state=50).check()
    config().check()


def test_each_sub_env_has_its_place_among_its_tasks_sub_envs():
    assert task_places(["a", "a", "a"]) == [0, 1, 2]
    assert task_places(["a", "b", "a", "b"]) == [0, 0, 1, 1]  # env.tasks spreads tasks round robin


# LeRobot's LIBERO datasets on the hub (lerobot/libero_spatial, ...): LeRobot v3.0, the two cameras
# as videos at 256x256, LIBERO's 8-value robot state and 7-value action, a header of 10 fps
HUB_LAYOUT = {"observation.images.image": {"dtype": "video", "shape": [256, 256, 3]},
              "observation.images.wrist_image": {"dtype": "video", "shape": [256, 256, 3]},
              "observation.state": {"dtype": "float32", "shape": [8]},
              "action": {"dtype": "float32", "shape": [7]}}


def hub_layout_dataset(root: str) -> str:
    rng = np.random.default_rng(0)
    with DatasetWriter(root, 10, HUB_LAYOUT) as writer:
        for _ in range(2):
            frames = {key: rng.integers(0, 256, (4, *f["shape"]), dtype=np.uint8) if f["dtype"] == "video"
                      else rng.uniform(-1, 1, (4, *f["shape"])).astype(np.float32) for key, f in HUB_LAYOUT.items()}
            writer.add_episode(frames, FIRST_SPATIAL.replace("_", " "))
    return root


def recipe(name: str):
    register_schema()
    with initialize_config_dir(config_dir=os.path.join(REPO_ROOT, "configs"), version_base=None):
        return resolve(compose(config_name=name), num_gpus=8)[0]


@slow
def test_the_sft_recipes_read_a_dataset_laid_out_as_the_hubs_libero_datasets(tmp_path):
    """The recipes' dataset.keys and dataset.recorded_hz fit the hub's layout and the env's
    observations (built here at the recipes' 256x256), so SFT runs on the hub dataset unchanged."""
    root = hub_layout_dataset(str(tmp_path / "libero_spatial"))
    pi0, openvla = recipe("libero_sft_pi0"), recipe("libero_sft_openvla")
    env = build_env(pi0.env, 1, 0)
    try:
        spec = env.spec
    finally:
        env.close()
    assert spec.obs_shapes["main_images"] == (256, 256, 3) and spec.obs_shapes["states"] == (8,)
    _, keys = open_dataset(root, pi0.dataset.keys, spec, recorded_hz=pi0.dataset.recorded_hz)
    assert keys == {"main_images": "observation.images.image", "wrist_images": "observation.images.wrist_image",
                    "states": "observation.state", "actions": "action"}
    agent_view_only = dataclasses.replace(spec, obs_shapes={k: v for k, v in spec.obs_shapes.items()
                                                            if k != "wrist_images"})  # env.wrist_camera=none
    assert openvla.env.wrist_camera == "none"
    _, keys = open_dataset(root, openvla.dataset.keys, agent_view_only, recorded_hz=openvla.dataset.recorded_hz)
    assert keys == {"main_images": "observation.images.image", "states": "observation.state", "actions": "action"}
    # the header's 10 fps alone is refused: the env acts at LIBERO's 20 Hz
    with pytest.raises(DatasetError, match="recorded at 10 Hz \\(its header: 10 fps\\), the env acts at 20 Hz"):
        open_dataset(root, pi0.dataset.keys, spec)


class SeedRecorder:
    instruction = "a task"

    def __init__(self):
        self.seeds = []

    def reset(self, seed=None):
        self.seeds.append(seed)

    def observe(self):
        return {"states": np.zeros((1, 8), np.float32)}


def test_an_int_seed_starts_each_tasks_sub_envs_at_consecutive_initial_states():
    """eval.py --seed 0 with env.tasks: each task's sub-envs start from states 0, 1, ... (and go on by
    their count in the child), the published protocol; a list of seeds passes through."""
    env = object.__new__(LiberoEnv)
    SerialEnv.__init__(env, [SeedRecorder() for _ in range(4)], -np.ones(7), np.ones(7), True)
    env.places = task_places(["a", "b", "a", "b"])
    env.reset(seed=0)
    assert [sub.seeds[-1] for sub in env.subs] == [0, 0, 1, 1]
    env.reset(seed=[5, 6, 7, 8])
    assert [sub.seeds[-1] for sub in env.subs] == [5, 6, 7, 8]


def test_a_dataset_with_its_images_inside_the_parquet_files_is_refused_naming_them(tmp_path):
    import json

    root = hub_layout_dataset(str(tmp_path / "stills"))  # as HuggingFaceVLA/libero keeps its cameras
    path = os.path.join(root, "meta", "info.json")
    with open(path) as f:
        info = json.load(f)
    info["features"]["observation.images.image"]["dtype"] = "image"
    with open(path, "w") as f:
        json.dump(info, f)
    with pytest.raises(DatasetError, match=r"cameras \['observation.images.image'\] are images kept inside the "
                                           r"parquet files \(dtype image\).*dataset's video version"):
        open_dataset(root, {}, None)
