"""A robot copy with reduced visual meshes (env.robot_mesh_fraction): the same physics, nearly
the same pictures, far fewer triangles, built once."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mani_skill")
pytest.importorskip("fast_simplification")
pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning")

from embodied_async.config.checks import ConfigError  # noqa: E402
from embodied_async.registry import build_env  # noqa: E402
from envs.maniskill import ManiSkillConfig  # noqa: E402
from envs.maniskill.low_poly import low_poly_urdf  # noqa: E402

pytestmark = pytest.mark.slow  # builds simulators


def panda_urdf() -> str:
    from mani_skill.agents.robots.panda.panda import Panda

    return Panda.urdf_path


def visual_triangles(urdf: Path) -> int:
    import trimesh

    total = 0
    for mesh in ET.parse(urdf).getroot().iter("visual"):
        for element in mesh.iter("mesh"):
            path = Path(element.get("filename"))
            path = path if path.is_absolute() else urdf.parent / path
            total += sum(len(g.faces) for g in trimesh.load(path, force="scene").geometry.values())
    return total


def test_copy_keeps_the_fraction_of_triangles_and_the_collision_meshes(tmp_path):
    copy = low_poly_urdf(panda_urdf(), 0.05, root=tmp_path)
    original = Path(panda_urdf())
    full, reduced = visual_triangles(original), visual_triangles(copy)
    assert full > 100_000  # the reason for the copy
    assert reduced < 0.08 * full  # small parts (< 200 faces) stay whole
    # Collision meshes: the originals, by absolute path.
    originals = [(original.parent / m.get("filename")).resolve() for c in ET.parse(original).getroot().iter("collision")
                 for m in c.iter("mesh")]
    copies = [Path(m.get("filename")) for c in ET.parse(copy).getroot().iter("collision") for m in c.iter("mesh")]
    assert copies == originals and all(p.is_file() for p in copies)
    # The collision pairs to ignore come along (SAPIEN reads them from beside the URDF).
    assert copy.with_suffix(".srdf").read_text() == original.with_suffix(".srdf").read_text()
    # Built once: a second call reads the cache; another fraction is another copy.
    mtime = os.stat(copy).st_mtime_ns
    assert low_poly_urdf(panda_urdf(), 0.05, root=tmp_path) == copy and os.stat(copy).st_mtime_ns == mtime
    assert low_poly_urdf(panda_urdf(), 0.1, root=tmp_path).parent != copy.parent
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_a_copy_follows_its_installation_and_a_copy_whose_collision_meshes_are_gone_is_refused(tmp_path):
    """The copy names the collision meshes by absolute path: the same URDF in another folder (a
    moved or rebuilt virtual environment) gets a copy of its own, whose collision meshes exist;
    a cached copy naming files that are gone is refused, not loaded as a robot without collisions."""
    import shutil

    original = Path(panda_urdf())
    moved = tmp_path / "elsewhere" / original.parent.name
    shutil.copytree(original.parent / "franka_description", moved / "franka_description")
    for name in (original.name, original.with_suffix(".srdf").name):
        shutil.copyfile(original.parent / name, moved / name)
    cache = tmp_path / "cache"
    here = low_poly_urdf(str(original), 0.05, root=cache)
    there = low_poly_urdf(str(moved / original.name), 0.05, root=cache)
    assert here.parent != there.parent
    named = [Path(m.get("filename")) for c in ET.parse(there).getroot().iter("collision") for m in c.iter("mesh")]
    assert named and all(p.is_file() and moved in p.parents for p in named)
    shutil.rmtree(moved / "franka_description" / "meshes" / "collision")
    with pytest.raises(FileNotFoundError, match="collision meshes that are gone.*remove that folder"):
        low_poly_urdf(str(moved / original.name), 0.05, root=cache)


def test_same_physics_and_nearly_the_same_pictures(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_ASYNC_CACHE", str(tmp_path))
    common = dict(task="PushCube-v1", obs_mode="rgb", image_size=[64, 64], control_mode="pd_ee_delta_pos",
                  max_episode_steps=50)
    full = build_env(ManiSkillConfig(**common), num_envs=2, seed=5)
    low = build_env(ManiSkillConfig(**common, robot_mesh_fraction=0.05), num_envs=2, seed=5)
    try:
        actions = np.random.default_rng(0).uniform(-1, 1, (6, 2, 1, full.spec.action_dim)).astype(np.float32)
        for chunk in actions:
            a, b = full.step(chunk), low.step(chunk)
        np.testing.assert_array_equal(a.obs["states"], b.obs["states"])
        diff = np.abs(a.obs["main_images"].astype(np.int16) - b.obs["main_images"].astype(np.int16))
        assert diff.mean() < 4.0, diff.mean()  # the robot's silhouette shifts by a pixel here and there
        # The copy was built under the cache named by the environment.
        assert any(tmp_path.rglob("*.urdf"))
        # The full robot was built from ManiSkill's own URDF again: the class attribute was restored.
        from mani_skill.agents.robots.panda.panda import Panda

        assert Panda.urdf_path == panda_urdf() and str(tmp_path) not in Panda.urdf_path
    finally:
        full.close()
        low.close()


@pytest.mark.parametrize("fraction", [0.0, 1.5])
def test_fraction_out_of_range_is_refused(fraction):
    cfg = ManiSkillConfig(task="PushCube-v1", robot_mesh_fraction=fraction)
    with pytest.raises(ConfigError, match="env.robot_mesh_fraction"):
        cfg.check()
