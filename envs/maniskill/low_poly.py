"""Robot visual meshes with fewer triangles, for cameras rendered on a CPU.

On a CPU, SAPIEN renders through Mesa's lavapipe, whose cost per frame is almost all vertex work:
the Panda's visual meshes hold ~140k triangles, which made a 64x64 PushCube frame cost ~27 ms
against ~5 ms for everything else in the scene. At the 64-128 px a VLA sees, that detail does not
show; a copy of the robot whose visual meshes keep a few per cent of their triangles renders the
same picture about 5x faster. Collision meshes, joints and inertias are untouched, so physics is
the same.

``low_poly_urdf`` writes such a copy once per robot and fraction into a cache directory and
returns the path of its URDF; ``robot_mesh_fraction`` of the ManiSkill env config turns it on.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional

import numpy as np

from envs.cache import cache_folder

# Bump when the way meshes are reduced changes: the cache key includes it.
FORMAT_VERSION = 2
# Parts this small (screws, decals) are kept whole: reducing them saves nothing and can erase them.
MIN_FACES_TO_REDUCE = 200


def low_poly_urdf(urdf_path: str, fraction: float, root: Optional[Path] = None) -> Path:
    """The URDF of a copy of ``urdf_path`` whose visual meshes keep ``fraction`` of their
    triangles; built on the first call, then read from the cache (keyed by the URDF's text and
    folder, the fraction and ``FORMAT_VERSION``). Collision meshes stay the originals."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"a low-poly robot keeps a fraction of its triangles in (0, 1), got {fraction}")
    source = Path(urdf_path)
    if not source.is_file():
        raise FileNotFoundError(f"robot URDF not found: {source}")
    text = source.read_bytes()
    # the copy names the collision meshes by absolute path: a copy made from the same URDF in
    # another installation (a moved or rebuilt virtual environment) would name files that are gone
    where = str(source.resolve().parent)
    key = hashlib.sha256(text + f"|{where}|{fraction!r}|{FORMAT_VERSION}".encode()).hexdigest()[:16]
    target = (root or cache_folder("low_poly_robots")) / f"{source.stem}-{key}"
    urdf = target / source.name
    if urdf.is_file():
        _check_collision_meshes(urdf, target)
        return urdf
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: env processes starting together may race here, and a
    # half-written copy must never be read.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _write_copy(source, staging / source.name, staging, fraction)
        try:
            os.rename(staging, target)
        except OSError:
            if not urdf.is_file():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return urdf


def _check_collision_meshes(urdf: Path, target: Path) -> None:
    """A cached copy whose collision meshes are gone would load a robot that passes through things
    (SAPIEN only logs each missing file): refused, naming the folder to remove."""
    missing = [m.get("filename") for c in ET.parse(urdf).getroot().iter("collision") for m in c.iter("mesh")
               if m.get("filename") and not Path(m.get("filename")).is_file()]
    if missing:
        raise FileNotFoundError(f"the low-poly robot copy {target} names {len(missing)} collision meshes that are "
                                f"gone (first: {missing[0]}); remove that folder and it is built again")


def _write_copy(source: Path, out_urdf: Path, out_dir: Path, fraction: float) -> None:
    tree = ET.parse(source)
    reduced: dict = {}
    for element in tree.getroot().iter():
        if element.tag not in ("visual", "collision"):
            continue
        for mesh in element.iter("mesh"):
            name = mesh.get("filename")
            if not name:
                continue
            path = _resolve(source, name)
            if element.tag == "visual":
                if path not in reduced:
                    reduced[path] = out_dir / f"{len(reduced):03d}_{path.stem}.glb"
                    _reduce_mesh(path, reduced[path], fraction)
                mesh.set("filename", reduced[path].name)  # beside the URDF, which moves into place
            else:
                mesh.set("filename", str(path))
    tree.write(out_urdf, encoding="utf-8", xml_declaration=True)
    # SAPIEN reads the collision pairs to ignore from the SRDF beside the URDF: without it the
    # copy's links would collide with their neighbours (it names links only, no files).
    srdf = source.with_suffix(".srdf")
    if srdf.is_file():
        shutil.copyfile(srdf, out_urdf.with_suffix(".srdf"))


def _resolve(urdf: Path, filename: str) -> Path:
    if filename.startswith("package://"):
        raise ValueError(f"{urdf}: mesh '{filename}' is a ROS package path, which a low-poly copy cannot resolve; "
                         "set env.robot_mesh_fraction=1.0 for this robot")
    path = Path(filename)
    return path if path.is_absolute() else (urdf.parent / path).resolve()


def _reduce_mesh(source: Path, target: Path, fraction: float) -> None:
    """Every part of the mesh file reduced to ``fraction`` of its triangles, keeping its material
    (the robots' visual meshes colour their parts by material, not by texture)."""
    import fast_simplification
    import trimesh

    scene = trimesh.load(source, force="scene")
    for name, part in list(scene.geometry.items()):
        if not isinstance(part, trimesh.Trimesh):
            continue
        # Mesh files store a vertex per corner; reduction needs the triangles joined up.
        part.merge_vertices(merge_tex=True, merge_norm=True)
        if len(part.faces) < MIN_FACES_TO_REDUCE:
            continue
        vertices, faces = fast_simplification.simplify(part.vertices.astype(np.float32),
                                                       part.faces.astype(np.int32), target_reduction=1.0 - fraction)
        smaller = trimesh.Trimesh(vertices, faces, process=False)
        material = getattr(part.visual, "material", None)
        if material is not None:
            if getattr(material, "baseColorTexture", None) is not None or getattr(material, "image", None) is not None:
                # the reduced mesh has no texture coordinates: paint the part its texture's mean colour
                material = trimesh.visual.material.PBRMaterial(baseColorFactor=material.main_color)
            smaller.visual = trimesh.visual.TextureVisuals(material=material)
        scene.geometry[name] = smaller
    scene.export(target)
