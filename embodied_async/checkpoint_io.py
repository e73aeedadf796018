"""Checkpoint files that can be loaded without unpickling.

A pickled checkpoint (``torch.save``/``torch.load``) can run arbitrary code when it is
loaded, and checkpoints get downloaded and shared. So a checkpoint here is only:

* ``<name>.safetensors``: every tensor of a nested structure (safetensors holds raw bytes
  and a JSON header, nothing executable), and
* ``<name>.json``: the structure itself, with each tensor replaced by a reference,
* ``manifest.json``: size and sha256 of every file, written last, so a damaged,
  truncated or tampered folder is refused before anything in it is used.

Loading uses only ``safetensors.torch.load_file`` and ``json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Callable, Dict, List, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

MANIFEST = "manifest.json"
TREE_FORMAT = "embodied_async.tree"
MANIFEST_FORMAT = "embodied_async.checkpoint"
FORMAT_VERSION = 1
ALLOWED_SUFFIXES = (".json", ".safetensors")
# In the encoded JSON every object is a tag; user dicts are pair lists, so nothing is ambiguous.
_DICT, _TENSOR = "__dict__", "__tensor__"
_FIX = ("the checkpoint folder {folder} is damaged; resume from an earlier checkpoint "
        "(logs/<run>/checkpoints/global_step_<N>)")


class CheckpointError(ValueError):
    """A checkpoint folder or file is missing, damaged, tampered with or not ours."""


# ----------------------------------------------------------------------------- tree files

def save_tree(tree: Any, folder: str, name: str) -> None:
    """Write ``tree`` as ``folder/<name>.safetensors`` (tensors) + ``folder/<name>.json`` (structure).

    ``tree`` nests dicts (str or int keys), lists/tuples, torch tensors and JSON scalars
    (int, float incl. nan/inf, bool, None, str). Tensors are stored detached, on CPU,
    contiguous and cloned (so views sharing storage are fine), keyed by their path into the
    tree, e.g. ``state/0/exp_avg``. Dict key types survive the round trip (int stays int);
    tuples come back as lists, and ``nn.Parameter`` comes back as a plain tensor.
    Raises TypeError for anything else (numpy arrays, objects, bool or float dict keys).
    """
    _check_name(name)
    os.makedirs(folder, exist_ok=True)
    tensors: Dict[str, torch.Tensor] = {}
    encoded = _encode(tree, [], tensors)
    doc = {"format": TREE_FORMAT, "version": FORMAT_VERSION, "tensors": f"{name}.safetensors",
           "tree": encoded}
    _atomic_write(os.path.join(folder, f"{name}.safetensors"),
                  lambda path: save_file(tensors, path, metadata={"format": "pt"}))
    _atomic_write(os.path.join(folder, f"{name}.json"), lambda path: _write_json(path, doc))


def load_tree(folder: str, name: str) -> Any:
    """Inverse of :func:`save_tree`: tensors come back on CPU with exact dtype, shape and values.

    Reads only JSON and safetensors; any unreadable or inconsistent file raises
    CheckpointError naming it.
    """
    _check_name(name)
    json_path = os.path.join(folder, f"{name}.json")
    doc = _read_json(json_path)
    if not isinstance(doc, dict) or doc.get("format") != TREE_FORMAT or "tree" not in doc:
        raise CheckpointError(f"{json_path}: not a tree file written by embodied_async.checkpoint_io")
    if doc.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{json_path}: unsupported version {doc.get('version')!r}")
    st_path = os.path.join(folder, f"{name}.safetensors")
    tensors = _read_safetensors(st_path)
    used: set = set()
    try:
        tree = _decode(doc["tree"], tensors, used)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise CheckpointError(f"{json_path}: malformed tree structure ({e})") from e
    unused = sorted(set(tensors) - used)
    if unused:  # the two files do not belong together
        raise CheckpointError(f"{st_path}: tensors not referenced by {json_path}: {unused[:5]}")
    return tree


def _encode(node: Any, path: List[str], tensors: Dict[str, torch.Tensor]) -> Any:
    """Turn ``node`` into JSON-able data; tensors go into ``tensors`` under their path key."""
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, torch.Tensor):
        return {_TENSOR: _store_tensor(node, path, tensors)}
    if isinstance(node, (list, tuple)):
        return [_encode(v, path + [str(i)], tensors) for i, v in enumerate(node)]
    if isinstance(node, dict):
        for key in node:
            # bool is an int subclass but would come back as 0/1; other types can't be JSON keys
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise TypeError(f"save_tree: dict key {key!r} at {'/'.join(path) or '<root>'} "
                                f"must be str or int, not {type(key).__name__}")
        return {_DICT: [[k, _encode(v, path + [str(k)], tensors)] for k, v in node.items()]}
    raise TypeError(f"save_tree: unsupported type {type(node).__name__} at {'/'.join(path) or '<root>'}")


def _store_tensor(t: torch.Tensor, path: List[str], tensors: Dict[str, torch.Tensor]) -> str:
    """Add a standalone copy of ``t`` (safetensors refuses shared storage) and return its key."""
    if t.layout != torch.strided:
        raise TypeError(f"save_tree: {t.layout} tensor at {'/'.join(path)} is not supported")
    base = "/".join(path) or "<root>"
    key, n = base, 1
    while key in tensors:  # "a/b" as one key and as a nested path would collide
        key, n = f"{base}#{n}", n + 1
    tensors[key] = t.detach().cpu().clone(memory_format=torch.contiguous_format)
    return key


def _decode(node: Any, tensors: Dict[str, torch.Tensor], used: set) -> Any:
    """Inverse of :func:`_encode`."""
    if isinstance(node, list):
        return [_decode(v, tensors, used) for v in node]
    if not isinstance(node, dict):
        return node
    if set(node) == {_TENSOR}:
        key = node[_TENSOR]
        if key not in tensors:
            raise KeyError(f"tensor {key!r} is not in the safetensors file")
        used.add(key)
        return tensors[key]
    if set(node) == {_DICT}:
        return {k: _decode(v, tensors, used) for k, v in node[_DICT]}
    raise ValueError(f"unknown object with keys {sorted(node)}")


def _read_safetensors(path: str) -> Dict[str, torch.Tensor]:
    """``load_file`` with its errors turned into CheckpointError naming the file."""
    try:
        return load_file(path, device="cpu")
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: missing") from e
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: unreadable safetensors file ({e})") from e


# ----------------------------------------------------------------------------- manifest

def write_manifest(folder: str, extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Write ``folder/manifest.json``: size and sha256 of every other file (recursive, sorted).

    Call it last, after every file of the checkpoint is written: the manifest is what marks
    the folder complete. ``extra`` (JSON-able) is stored as is, e.g. the global step.
    Returns the manifest.
    """
    files = {rel: {"size": os.path.getsize(os.path.join(folder, rel)),
                   "sha256": _sha256(os.path.join(folder, rel))} for rel in _list_files(folder)}
    manifest = {"format": MANIFEST_FORMAT, "version": FORMAT_VERSION, "files": files,
                "extra": extra}
    _atomic_write(os.path.join(folder, MANIFEST), lambda path: _write_json(path, manifest))
    return manifest


def verify_checkpoint(folder: str) -> Dict[str, Any]:
    """Check every file against ``folder/manifest.json``; return the manifest if all match.

    Raises CheckpointError listing each missing, truncated, resized, tampered or unlisted
    file (an unlisted file is refused too, since a loader might read it).
    """
    manifest = _read_manifest(folder)
    problems = [f"{rel}: {p}" for rel, entry in manifest["files"].items()
                for p in [_check_file(folder, rel, entry)] if p]
    problems += [f"{rel}: not listed in the manifest"
                 for rel in _list_files(folder) if rel not in manifest["files"]]
    if problems:
        raise CheckpointError("; ".join(problems) + "; " + _FIX.format(folder=folder))
    return manifest


def assert_no_pickle(folder: str) -> None:
    """Raise CheckpointError unless every file under ``folder`` is .json or .safetensors."""
    if not os.path.isdir(folder):
        raise CheckpointError(f"checkpoint folder {folder} does not exist")
    bad = [rel for rel in _list_files(folder, keep_manifest=True) if not rel.endswith(ALLOWED_SUFFIXES)]
    if bad:
        raise CheckpointError(f"{folder}: files other than .json/.safetensors (could be pickles, "
                              f"which are never loaded): {bad}")


def _read_manifest(folder: str) -> Dict[str, Any]:
    """Parse and sanity-check ``manifest.json``; its absence means the folder isn't ours."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing; {folder} is not a checkpoint folder written by "
                              f"embodied_async (or it was never completed)")
    manifest = _read_json(path)
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT \
            or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{path}: not a checkpoint manifest written by embodied_async")
    for rel, entry in manifest["files"].items():
        # a listed name must stay inside the folder, and each entry needs size + sha256
        if os.path.isabs(rel) or ".." in rel.split("/") or not isinstance(entry, dict) \
                or not isinstance(entry.get("size"), int) or not isinstance(entry.get("sha256"), str):
            raise CheckpointError(f"{path}: bad entry {rel!r}; " + _FIX.format(folder=folder))
    return manifest


def _check_file(folder: str, rel: str, entry: Dict[str, Any]) -> Optional[str]:
    """The problem with one listed file, or None if its size and sha256 match."""
    path = os.path.join(folder, rel)
    if not os.path.isfile(path):
        return "missing"
    size = os.path.getsize(path)
    if size < entry["size"]:
        return f"truncated: {size} bytes, expected {entry['size']}"
    if size > entry["size"]:
        return f"wrong size: {size} bytes, expected {entry['size']}"
    if _sha256(path) != entry["sha256"]:
        return "tampered or corrupted: sha256 mismatch"
    return None


def _list_files(folder: str, keep_manifest: bool = False) -> List[str]:
    """Every file under ``folder`` as sorted '/'-separated relative names."""
    out = []
    for root, _dirs, names in os.walk(folder):
        for n in names:
            out.append(os.path.relpath(os.path.join(root, n), folder).replace(os.sep, "/"))
    return sorted(rel for rel in out if keep_manifest or rel != MANIFEST)


def _sha256(path: str) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (checkpoints can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- small helpers

def _check_name(name: str) -> None:
    """``name`` is a bare file stem, so files land inside ``folder``."""
    if not name or "/" in name or os.sep in name or name in (".", ".."):
        raise ValueError(f"checkpoint file name must be a bare name, got {name!r}")


def _atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Write via a temp file in the same folder + os.replace: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.",
                               suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _write_json(path: str, obj: Any) -> None:
    """Python's json writes nan/inf as NaN/Infinity and reads them back exactly."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, allow_nan=True)


def _read_json(path: str) -> Any:
    """``json.load`` with its errors turned into CheckpointError naming the file."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: missing") from e
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable JSON ({e})") from e
