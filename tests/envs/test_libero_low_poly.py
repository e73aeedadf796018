"""Reduced copies of a LIBERO scene's visual meshes (env.mesh_fraction): which meshes are
replaced, and what a reduced mesh keeps (its surface, its texture coordinates), for each of the
three file kinds LIBERO's scenes use. Numpy and fast-simplification only: runs in our venv too."""

import xml.etree.ElementTree as ET

import numpy as np
import pytest
import trimesh

from envs.libero.low_poly_scene import _msh_bytes, _read_binary_stl, _read_msh, _read_obj, low_poly_xml, reduced_copy


def sphere_soup(subdivisions=4):
    """A sphere stored as LIBERO's scanned objects are: a vertex per corner, each with its own
    texture coordinate (here the corner's longitude and latitude)."""
    sphere = trimesh.creation.icosphere(subdivisions)
    corners = sphere.vertices[sphere.faces.reshape(-1)]
    uvs = np.stack([np.arctan2(corners[:, 1], corners[:, 0]), np.arcsin(np.clip(corners[:, 2], -1, 1))], axis=1)
    faces = np.arange(len(corners)).reshape(-1, 3)
    return corners, uvs, faces


def area(vertices, faces):
    a, b, c = (vertices[faces[:, i]] for i in range(3))
    return 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1).sum()


def test_a_scanned_mesh_keeps_its_surface_and_texture_coordinates(tmp_path):
    corners, uvs, faces = sphere_soup()
    source = tmp_path / "bowl_vis.msh"
    source.write_bytes(_msh_bytes(corners, uvs, faces))
    copy = reduced_copy(source, 0.25, tmp_path / "cache")
    assert copy.suffix == ".msh" and copy.parent == tmp_path / "cache"
    vertices, new_uvs, new_faces, _ = _read_msh(copy)
    assert 0.2 * len(faces) <= len(new_faces) <= 0.3 * len(faces)
    # no holes: the corners were joined before reducing (reducing the soup would drop triangles)
    assert area(vertices, new_faces) == pytest.approx(area(corners, faces), rel=0.05)
    # each vertex's texture coordinate is one of the originals
    known = {tuple(uv) for uv in uvs.astype(np.float32).tolist()}
    assert all(tuple(uv) in known for uv in new_uvs.astype(np.float32).tolist())
    assert reduced_copy(source, 0.25, tmp_path / "cache") == copy  # read from the cache after


def test_obj_and_stl_meshes_are_reduced_into_obj_files(tmp_path):
    sphere = trimesh.creation.icosphere(4)
    obj = tmp_path / "link.obj"
    obj.write_text("".join(f"v {x} {y} {z}\n" for x, y, z in sphere.vertices)
                   + "".join(f"vt {u} {v}\n" for u, v in sphere.vertices[:, :2])
                   + "".join(f"f {a + 1}/{a + 1} {b + 1}/{b + 1} {c + 1}/{c + 1}\n" for a, b, c in sphere.faces))
    stl = tmp_path / "mount.stl"
    sphere.export(stl)  # binary STL: a vertex per corner
    for source in (obj, stl):
        copy = reduced_copy(source, 0.1, tmp_path / "cache")
        vertices, new_uvs, new_faces, _ = _read_obj(copy)
        assert copy.suffix == ".obj" and len(new_faces) <= 0.15 * len(sphere.faces), source
        assert area(vertices, new_faces) == pytest.approx(sphere.area, rel=0.1), source
        assert (new_uvs is not None) == (source == obj)
    assert len(_read_binary_stl(stl)[0]) == len(sphere.vertices)  # the STL's corners joined up


def test_only_meshes_no_colliding_geom_uses_are_replaced(tmp_path):
    corners, uvs, faces = sphere_soup()
    (tmp_path / "visual.msh").write_bytes(_msh_bytes(corners, uvs, faces))
    (tmp_path / "shared.msh").write_bytes(_msh_bytes(corners, uvs, faces))
    (tmp_path / "screw.msh").write_bytes(_msh_bytes(*sphere_soup(0)))  # too small to reduce
    xml = f"""<mujoco><asset>
      <mesh name="visual" file="{tmp_path}/visual.msh"/>
      <mesh name="shared" file="{tmp_path}/shared.msh"/>
      <mesh file="{tmp_path}/screw.msh"/>
    </asset><worldbody><body>
      <geom type="mesh" mesh="visual" contype="0" conaffinity="0" group="1"/>
      <geom type="mesh" mesh="shared" contype="0" conaffinity="0" group="1"/>
      <geom type="mesh" mesh="shared" group="0"/>
      <geom type="mesh" mesh="screw" contype="0" conaffinity="0" group="1"/>
    </body></worldbody></mujoco>"""
    files = {(m.get("name") or "screw"): m.get("file")
             for m in ET.fromstring(low_poly_xml(xml, 0.25, tmp_path / "cache")).iter("mesh")}
    assert files["visual"].startswith(str(tmp_path / "cache"))  # collision-free: reduced
    assert files["shared"] == f"{tmp_path}/shared.msh"  # a colliding geom uses it: the physics stays
    assert files["screw"] == f"{tmp_path}/screw.msh"


def test_a_fraction_outside_0_to_1_is_refused(tmp_path):
    with pytest.raises(ValueError, match="a fraction of its triangles in \\(0, 1\\), got 1.5"):
        reduced_copy(tmp_path / "any.msh", 1.5)
