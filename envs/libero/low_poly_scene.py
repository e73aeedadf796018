"""LIBERO scenes whose visual meshes keep a fraction of their triangles, for cameras rendered on a
CPU (``env.mesh_fraction``). Runs in the child process, under ``.venv-libero``.

On a CPU, MuJoCo renders through Mesa's llvmpipe, and a LIBERO frame's cost is its reflections and
its ~300,000 visual triangles (two bowls of 42,500 each, the robot's links, its mount); the pixels
cost almost nothing (``benchmarks/2026-12-05-libero-cpu-speed.md``). Meshes that only collision-free
geoms use (robosuite's visual geoms: ``contype="0" conaffinity="0"``) are replaced in the scene's
XML by reduced copies; every mesh a colliding geom uses stays the original, so the physics is the
same. A reduced mesh keeps its texture: each of its vertices takes the texture coordinate of one
of the vertices it was made from (seams blur a little).

Copies are written once per source file and fraction into a cache folder and read from there after.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

from envs.cache import cache_folder

# Bump when the way meshes are reduced changes: the cache key includes it.
FORMAT_VERSION = 1
# Meshes this small (screws, handles) are kept whole: reducing them saves nothing and can erase them.
MIN_FACES_TO_REDUCE = 500
STL_HEADER_BYTES, STL_TRIANGLE_BYTES = 84, 50


def low_poly_xml(xml: str, fraction: float, root: Optional[Path] = None) -> str:
    """``xml`` (a MuJoCo model) with every mesh that only collision-free geoms use replaced by a
    copy keeping ``fraction`` of its triangles."""
    model = ET.fromstring(xml)
    meshes = {(mesh.get("name") or Path(mesh.get("file", "")).stem): mesh
              for mesh in model.iter("mesh") if mesh.get("file")}
    colliding = {geom.get("mesh") for geom in model.iter("geom") if geom.get("mesh") and _collides(geom)}
    for name, mesh in meshes.items():
        if name in colliding or Path(mesh.get("file")).suffix.lower() not in READERS:
            continue
        mesh.set("file", str(reduced_copy(Path(mesh.get("file")), fraction, root)))
    return ET.tostring(model, encoding="unicode")


def _collides(geom: ET.Element) -> bool:
    """Whether a geom takes part in contacts (its class defaults unknown here: unless it says no)."""
    return geom.get("contype", "1") != "0" or geom.get("conaffinity", "1") != "0"


def reduced_copy(source: Path, fraction: float, root: Optional[Path] = None) -> Path:
    """A copy of the mesh file ``source`` keeping ``fraction`` of its triangles (the source itself
    when it is small or not read here), written once into the cache folder."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"a reduced mesh keeps a fraction of its triangles in (0, 1), got {fraction}")
    stat = source.stat()
    key = hashlib.sha256(f"{source}|{stat.st_size}|{stat.st_mtime_ns}|{fraction!r}|{FORMAT_VERSION}".encode())
    # a .msh stays a .msh (MuJoCo reads its texture coordinates as they are, an OBJ's flipped)
    suffix = ".msh" if source.suffix.lower() == ".msh" else ".obj"
    target = (root or cache_folder("libero_low_poly")) / f"{source.stem}-{key.hexdigest()[:16]}{suffix}"
    if target.is_file():
        return target
    mesh = READERS[source.suffix.lower()](source)
    if mesh is None or len(mesh[2]) < MIN_FACES_TO_REDUCE:
        return source
    reduced = _reduce(*mesh, fraction)
    content = _msh_bytes(*reduced) if suffix == ".msh" else _obj_text(*reduced).encode()
    target.parent.mkdir(parents=True, exist_ok=True)
    # written beside the target and renamed: children starting together may race here, and a
    # half-written copy must never be read
    handle, staging = tempfile.mkstemp(prefix=f".{target.stem}-", suffix=suffix, dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(content)
        os.replace(staging, target)
    finally:
        if os.path.exists(staging):
            os.remove(staging)
    return target


Mesh = Tuple[np.ndarray, Optional[np.ndarray], np.ndarray, Optional[np.ndarray]]


# Each reader gives (vertices [V, 3], texture coordinates [T, 2] or None, triangles [F, 3] of vertex
# indices, their texture-coordinate indices [F, 3] or None), or None for a file it does not take.


def _read_msh(path: Path) -> Optional[Mesh]:
    """MuJoCo's binary mesh: counts of vertices, normals, texture coordinates and faces (int32),
    then the vertices, normals and texture coordinates (float32) and the faces (int32)."""
    data = path.read_bytes()
    if len(data) < 16:
        return None
    nv, nn, nt, nf = (int(n) for n in np.frombuffer(data, np.int32, 4))
    if min(nv, nn, nt, nf) < 0 or len(data) != 16 + 4 * (3 * nv + 3 * nn + 2 * nt + 3 * nf) or nt not in (0, nv):
        return None
    floats = np.frombuffer(data, np.float32, 3 * nv + 3 * nn + 2 * nt, 16)
    faces = np.frombuffer(data, np.int32, 3 * nf, 16 + 4 * len(floats)).reshape(-1, 3).astype(np.int64)
    vertices = floats[:3 * nv].reshape(-1, 3).astype(np.float64)
    uvs = floats[3 * nv + 3 * nn:].reshape(-1, 2).astype(np.float64) if nt else None
    return vertices, uvs, faces, faces if nt else None  # a texture coordinate per vertex


def _read_binary_stl(path: Path) -> Optional[Mesh]:
    data = path.read_bytes()
    if len(data) < STL_HEADER_BYTES:
        return None
    count = int(np.frombuffer(data, np.uint32, 1, 80)[0])
    if len(data) != STL_HEADER_BYTES + STL_TRIANGLE_BYTES * count:  # an ASCII STL: kept whole
        return None
    records = np.frombuffer(data, np.dtype([("normal", "<f4", 3), ("corners", "<f4", (3, 3)), ("flags", "<u2")]),
                            count, STL_HEADER_BYTES)
    corners = records["corners"].reshape(-1, 3).astype(np.float64)
    # an STL stores each triangle's corners on their own: join the shared ones
    vertices, index = np.unique(corners, axis=0, return_inverse=True)
    return vertices, None, index.reshape(-1, 3).astype(np.int64), None


def _read_obj(path: Path) -> Optional[Mesh]:
    try:
        return _parse_obj(path)
    except (ValueError, IndexError):  # a line this reader does not take: the mesh is kept whole
        return None


def _parse_obj(path: Path) -> Optional[Mesh]:
    vertices, uvs, faces, face_uvs = [], [], [], []
    with open(path, errors="replace") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "v":
                vertices.append([float(v) for v in parts[1:4]])
            elif parts[0] == "vt":
                uvs.append([float(v) for v in parts[1:3]])
            elif parts[0] == "f":
                corners = [_obj_corner(c, len(vertices), len(uvs)) for c in parts[1:]]
                for i in range(1, len(corners) - 1):  # a polygon as a fan of triangles
                    trio = (corners[0], corners[i], corners[i + 1])
                    faces.append([c[0] for c in trio])
                    face_uvs.append([c[1] for c in trio])
    if not vertices or not faces:
        return None
    has_uvs = bool(uvs) and all(u >= 0 for trio in face_uvs for u in trio)
    return (np.asarray(vertices), np.asarray(uvs) if has_uvs else None, np.asarray(faces, np.int64),
            np.asarray(face_uvs, np.int64) if has_uvs else None)


def _obj_corner(corner: str, num_vertices: int, num_uvs: int) -> Tuple[int, int]:
    """An OBJ face corner ``v``, ``v/vt``, ``v//vn`` or ``v/vt/vn`` as 0-based (vertex, uv or -1)."""
    fields = corner.split("/")

    def index(text: str, count: int) -> int:
        value = int(text)
        return value - 1 if value > 0 else count + value  # negative: counted from the end

    uv = index(fields[1], num_uvs) if len(fields) > 1 and fields[1] else -1
    return index(fields[0], num_vertices), uv


READERS = {".msh": _read_msh, ".obj": _read_obj, ".stl": _read_binary_stl}


def _reduce(vertices: np.ndarray, uvs: Optional[np.ndarray], faces: np.ndarray, face_uvs: Optional[np.ndarray],
            fraction: float) -> Tuple[np.ndarray, Optional[np.ndarray], np.ndarray]:
    """(vertices, per-vertex texture coordinates or None, triangles) keeping ``fraction`` of them."""
    import fast_simplification

    # scanned meshes store a vertex per corner (each with its own texture coordinate): joined up
    # first, or reduction would only drop whole triangles and leave holes
    vertices, joined = np.unique(np.round(vertices, 7), axis=0, return_inverse=True)
    faces = joined.reshape(-1)[faces]
    whole = (faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 0] != faces[:, 2])
    faces = faces[whole]
    face_uvs = None if face_uvs is None else face_uvs[whole]
    _, _, collapses = fast_simplification.simplify(vertices.astype(np.float32), faces.astype(np.int32),
                                                   target_reduction=1.0 - fraction, return_collapses=True)
    new_vertices, new_faces, mapping = fast_simplification.replay_simplification(
        vertices.astype(np.float32), faces.astype(np.int32), collapses)
    if uvs is None:
        return new_vertices, None, new_faces
    # each original vertex's texture coordinate (one of its corners'), handed to the vertex it became
    corner_uv = np.zeros(len(vertices), np.int64)
    corner_uv[faces.reshape(-1)] = face_uvs.reshape(-1)
    new_uvs = np.zeros((len(new_vertices), 2))
    kept = mapping >= 0
    new_uvs[mapping[kept]] = uvs[corner_uv[kept]]
    return new_vertices, new_uvs, new_faces


def _msh_bytes(vertices: np.ndarray, uvs: Optional[np.ndarray], faces: np.ndarray) -> bytes:
    """MuJoCo's binary mesh, without normals (MuJoCo computes them)."""
    counts = np.asarray([len(vertices), 0, 0 if uvs is None else len(uvs), len(faces)], np.int32)
    parts = [counts, np.asarray(vertices, np.float32).reshape(-1)]
    if uvs is not None:
        parts.append(np.asarray(uvs, np.float32).reshape(-1))
    parts.append(np.asarray(faces, np.int32).reshape(-1))
    return b"".join(part.tobytes() for part in parts)


def _obj_text(vertices: np.ndarray, uvs: Optional[np.ndarray], faces: np.ndarray) -> str:
    lines = [f"v {x:.7g} {y:.7g} {z:.7g}" for x, y, z in vertices]
    if uvs is not None:
        lines += [f"vt {u:.7g} {v:.7g}" for u, v in uvs]
        lines += [f"f {a + 1}/{a + 1} {b + 1}/{b + 1} {c + 1}/{c + 1}" for a, b, c in faces]
    else:
        lines += [f"f {a + 1} {b + 1} {c + 1}" for a, b, c in faces]
    return "\n".join(lines) + "\n"

