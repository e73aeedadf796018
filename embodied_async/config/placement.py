"""Component placement: which device ids each component (env, rollout, actor) runs on.

A placement is written in the config as ``cluster.component_placement``, a mapping whose keys
name one component or several joined by commas and whose values are device-id specs::

    {"env,rollout,actor": "0-3"}                      # co-located on GPUs 0-3
    {"actor": "0-3", "env": "4-5", "rollout": "6-7"}  # disaggregated

On a CPU machine the ids are CPU process slots instead of GPUs. Every mistake is reported at
start-up with a message naming the offending entry, so a run never fails halfway through.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

__all__ = [
    "PlacementError",
    "detect_num_gpus",
    "parse_device_ids",
    "parse_placement",
]

DEFAULT_COMPONENTS = ("env", "rollout", "actor")
_SOURCE = "cluster.component_placement"
_EXAMPLES = 'valid examples: 0, "0", "0-3", "0,2,4-7", "all"'
# ASCII digits only: str.isdigit() would also accept characters such as "²".
_NUMBER = re.compile(r"[0-9]+", re.ASCII)


class PlacementError(ValueError):
    """A placement (or device-id spec) that cannot be honoured; the message says how to fix it."""


def _bad_spec(spec, why: str) -> PlacementError:
    return PlacementError(f"invalid device ids {spec!r}: {why}; {_EXAMPLES}")


def _parse_id(text: str, spec) -> int:
    text = text.strip()
    if text.startswith("-") and _NUMBER.fullmatch(text[1:].strip()):
        raise _bad_spec(spec, f"negative id {text!r}")
    if not _NUMBER.fullmatch(text):
        raise _bad_spec(spec, f"{text!r} is not a non-negative integer")
    return int(text)


def parse_device_ids(spec, num_devices: Optional[int] = None) -> List[int]:
    """Parse a device-id spec into a list of ids, in the order written.

    ``spec`` is an int (``3``), a string (``"0"``, ``"0-3"``, ``"0,2,4-7"``, ``" 1 , 3 "``,
    ``"all"``) or a list of such items. ``"all"`` means ``range(num_devices)`` and needs
    ``num_devices``. Duplicates, negative ids, empty pieces, reversed ranges (``"3-1"``) and
    non-numbers raise :class:`PlacementError`. Ids are not checked against ``num_devices`` here
    (see :func:`parse_placement`, which knows which component asked for them).
    """
    if isinstance(spec, bool):  # bool is an int subclass, but True as a GPU id is surely a typo
        raise _bad_spec(spec, "a boolean is not a device id")
    if isinstance(spec, int):
        if spec < 0:
            raise _bad_spec(spec, f"negative id {spec}")
        return [spec]
    if isinstance(spec, (list, tuple)):  # YAML lists: [0, "2-3"]
        ids = [i for piece in spec for i in parse_device_ids(piece, num_devices)]
    elif isinstance(spec, str):
        text = spec.strip()
        if text.lower() == "all":
            if num_devices is None:
                raise _bad_spec(spec, '"all" needs the number of devices, which is unknown here')
            if num_devices <= 0:
                raise _bad_spec(spec, '"all" selects nothing: there are no devices')
            return list(range(num_devices))
        ids = []
        for piece in text.split(","):
            if not piece.strip():
                raise _bad_spec(spec, "empty piece (stray comma or empty string)")
            low, dash, high = piece.partition("-")
            if dash and low.strip():  # "a-b"; a leading "-" is a negative number instead
                first, last = _parse_id(low, spec), _parse_id(high, spec)
                if last < first:
                    raise _bad_spec(spec, f"reversed range {piece.strip()!r}")
                ids.extend(range(first, last + 1))
            else:
                ids.append(_parse_id(piece, spec))
    else:
        raise _bad_spec(spec, f"expected an int or a string, got {type(spec).__name__}")
    if not ids:
        raise _bad_spec(spec, "no ids given")
    seen = set()
    for i in ids:
        if i in seen:
            raise _bad_spec(spec, f"id {i} is listed twice")
        seen.add(i)
    return ids


def _describe_count(n: int) -> str:
    if n == 1:
        return "1 GPU (id 0)"
    return f"{n} GPUs (ids 0-{n - 1})"


def _component_groups(mapping: Mapping, required: Sequence[str], allowed: List[str], source: str) -> list:
    """``(key, component names, spec)`` per entry of ``mapping``, each component placed exactly once."""
    groups = []
    placed: Dict[str, str] = {}  # component -> the key that placed it, for duplicate messages
    for key, spec in mapping.items():
        if not isinstance(key, str):
            raise PlacementError(f"{source} key {key!r} must be a string of component names")
        names = [name.strip() for name in key.split(",")]
        for name in names:
            if not name:
                raise PlacementError(f"{source} key {key!r} has an empty component name")
            if name not in allowed:
                raise PlacementError(f"{source} key {key!r} names unknown component {name!r}; "
                                     f"allowed components: {', '.join(allowed)}")
            if name in placed:
                raise PlacementError(f"{source} places component {name!r} twice (in {placed[name]!r} and "
                                     f"{key!r}); each component must be placed exactly once")
            placed[name] = key
        groups.append((key, names, spec))
    missing = [name for name in required if name not in placed]
    if missing:
        raise PlacementError(f"{source} does not place component(s) {', '.join(missing)}; add e.g. "
                             f"{{'{','.join(missing)}': '0'}} (required components: {', '.join(required)})")
    return groups


def parse_placement(
    mapping: Mapping,
    num_devices: Optional[int] = None,
    device_kind: str = "gpu",
    required: Sequence[str] = DEFAULT_COMPONENTS,
    allowed: Optional[Iterable[str]] = None,
    source: str = _SOURCE,
) -> Dict[str, List[int]]:
    """Parse a component placement into ``{component: [device ids]}``.

    Keys of ``mapping`` are a component name or several joined by commas (``"env,rollout"``);
    values are specs accepted by :func:`parse_device_ids`. Each ``required`` component must be
    placed exactly once; names outside ``allowed`` (default: ``required``) are rejected.

    With ``device_kind="gpu"`` and a known ``num_devices``, every id must be below it (and a
    machine with 0 GPUs is rejected outright). With ``device_kind="cpu"`` the ids are CPU
    process slots: any non-negative id is fine and ``"all"`` means ``num_devices`` slots
    (default ``os.cpu_count()``). ``source`` names the config entry in error messages.
    """
    if device_kind not in ("gpu", "cpu"):
        raise PlacementError(f"device kind must be 'gpu' or 'cpu', got {device_kind!r}")
    if not isinstance(mapping, Mapping) or not mapping:
        raise PlacementError(
            f"{source} must be a non-empty mapping like {{'env,rollout,actor': '0-3'}}, "
            f"got {mapping!r}"
        )
    allowed_names = list(allowed) if allowed is not None else list(required)
    if device_kind == "cpu" and num_devices is None:
        num_devices = os.cpu_count() or 1

    # Check the names first: a misspelt component is the likeliest mistake and the cheapest fix.
    groups = _component_groups(mapping, required, allowed_names, source)

    if device_kind == "gpu" and num_devices == 0:
        raise PlacementError(
            f"{source} asks for GPUs but this machine has none; "
            "use cluster.device_type=cpu or a CPU recipe"
        )
    result: Dict[str, List[int]] = {}
    for key, names, spec in groups:
        try:
            ids = parse_device_ids(spec, num_devices)
        except PlacementError as err:
            raise PlacementError(f"{source}[{key!r}]: {err}") from None
        if device_kind == "gpu" and num_devices is not None:
            too_big = [i for i in ids if i >= num_devices]
            if too_big:
                raise PlacementError(
                    f"{source} places {key} on GPU {too_big[0]}, but this machine has "
                    f"{_describe_count(num_devices)}; change {source} so that every id is "
                    f"below {num_devices}"
                )
        for name in names:
            result[name] = list(ids)
    return result


def detect_num_gpus() -> int:
    """Number of visible CUDA GPUs, or 0 when torch is missing or has no CUDA.

    ``torch.cuda.device_count()`` asks NVML when it can and does not create a CUDA context,
    so worker processes forked afterwards can still use CUDA.
    """
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:  # broken driver installs raise here; treat as "no GPUs" rather than crash
        return 0
