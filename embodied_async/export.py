"""A trained policy leaves the repository: one of our checkpoints written in its family's own
published format (OpenVLA's Hugging Face layout, LeRobot's policy layout, ...), with a model card.

The framework's part is family-blind: find the run's config, build the policy and load the
checkpoint's weights exactly as an evaluation does, hand them to the family's ``exporter``
(its ``exporter`` hook, ``config/family_hooks.py``), write the card, and put the folder in place only once it is whole.
``scripts/export.py`` is the command.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from embodied_async.config.family_hooks import hook
from embodied_async.run_folder import log_folder


class ExportError(Exception):
    """Bad input to an export (not our checkpoint, an occupied folder, a family without a format):
    one line, exit code 2."""


@dataclass
class ExportRequest:
    """What a family's exporter gets.

    policy: the built policy with the checkpoint's weights, in eval mode on the CPU (LoRA
        adapters still injected: the exporter merges them).
    model_cfg: the run's validated model config (``model.path`` names the base checkpoint).
    base_folder: the base checkpoint's local folder (hub ids resolved from the cache), None for a
        family trained from scratch.
    folder: the empty folder to write into.
    stats_key: the name the action statistics are filed under (OpenVLA's ``unnorm_key``).
    dataset_stats: the SFT dataset's statistics per policy input (``actions``, ``states``, ...: what
        ``set_input_statistics`` was given), when the run (or the run it started from) trained on
        one and it is still there; None otherwise. dataset_episodes / dataset_frames: its size.
    env_spec: the env the policy acts in (observation shapes, action size, chunk).
    """

    policy: Any
    model_cfg: Any
    base_folder: Optional[str]
    folder: str
    stats_key: str
    dataset_stats: Optional[Dict[str, Dict[str, Any]]]
    env_spec: Any
    dataset_episodes: Optional[int] = None
    dataset_frames: Optional[int] = None


@dataclass
class ExportResult:
    """What an exporter wrote. format: the layout's name; load_with: markdown lines showing how
    the format's own code loads it (for the card); notes: anything a user must know (written to
    the card and printed)."""

    format: str
    load_with: str
    notes: List[str] = field(default_factory=list)


# ---- the export ------------------------------------------------------------------------------------

def export_checkpoint(checkpoint: str, out: str, stats_key: Optional[str] = None, overwrite: bool = False,
                      say: Callable[[str], None] = print) -> ExportResult:
    """Write ``checkpoint`` (one of our runs') in its family's published format to ``out``, with a
    model card; ExportError (one line) on bad input. The folder appears only once it is whole."""
    out = os.path.abspath(out)
    cfg = _checked_inputs(checkpoint, out, overwrite)
    exporter = _exporter(cfg.model)
    base = _base_folder(cfg.model)
    _check_out_apart(out, [("the checkpoint", checkpoint, True), ("its run's folder", log_folder(checkpoint), False),
                           ("the base checkpoint", base, True)])
    say(f"[export] building the {cfg.model.name} policy of {checkpoint} on the CPU")
    policy, spec = _load_policy(cfg, checkpoint)
    dataset = training_dataset(checkpoint, spec)
    stats_key = stats_key or _default_stats_key(cfg)
    tmp = out + ".export-tmp"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        request = ExportRequest(policy=policy, model_cfg=cfg.model, base_folder=base, folder=tmp, stats_key=stats_key,
                                env_spec=spec, dataset_stats=dataset and dataset["stats"],
                                dataset_episodes=dataset and dataset["episodes"],
                                dataset_frames=dataset and dataset["frames"])
        result = exporter(request)
        from embodied_async.model_card import write_model_card

        write_model_card(tmp, checkpoint, cfg, result, dataset, stats_key, code_version())
        _put_in_place(tmp, out)
    except (OSError, ValueError, KeyError) as err:  # a full disk, a folder we may not write, an exporter's refusal
        raise ExportError(f"could not write the export to {out}: {type(err).__name__}: {err}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def _checked_inputs(checkpoint: str, out: str, overwrite: bool):
    """The checkpoint's run config (validated for this CPU) after the cheap refusals."""
    from embodied_async.checkpoint_io import CheckpointError
    from embodied_async.config import ConfigError
    from embodied_async.config.recipes import checkpoint_config
    from embodied_async.config.validate import to_eval_config
    from embodied_async.run_folder import not_a_checkpoint, verify

    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise ExportError(f"--out {out} exists and is not empty: choose a new folder, or pass --overwrite to "
                          "replace it")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"--out {out} is a file: name a folder")
    problem = not_a_checkpoint(checkpoint, "CHECKPOINT")
    if problem:
        raise ExportError(f"{problem} (only checkpoints written by embodied_async runs can be exported)")
    try:
        verify(checkpoint, "CHECKPOINT")
        raw = checkpoint_config(checkpoint, ())
        raw.cluster.device_type = "cpu"
        raw.runner.dry_run = False
        return to_eval_config(raw)
    except (CheckpointError, ConfigError) as err:
        raise ExportError(str(err)) from None


def _base_folder(model_cfg) -> Optional[str]:
    """The base checkpoint's local folder (fetched from the hub when it is not cached)."""
    try:
        model_cfg.fetch()
        return model_cfg.checkpoint_folder()
    except FileNotFoundError as err:  # a hub id neither cached nor reachable
        raise ExportError(f"the run's base checkpoint is not here: {err}") from None


def _check_out_apart(out: str, folders) -> None:
    """``--out`` may neither be nor hold what the export reads (a replaced folder is deleted), nor
    lie inside a checkpoint (a file there breaks its manifest): ``(what, folder, sealed)``, where
    ``sealed`` says whether a folder inside it is refused too (a run's log folder may hold exports)."""
    real = os.path.realpath(out)
    for what, folder, sealed in folders:
        if not folder:
            continue
        folder = os.path.realpath(folder)
        if real == folder or folder.startswith(real + os.sep) or (sealed and real.startswith(folder + os.sep)):
            raise ExportError(f"--out {out} overlaps {what} ({folder}): export to a folder of its own, outside it")


def _exporter(model_cfg) -> Callable[[ExportRequest], ExportResult]:
    import importlib

    spec = hook(model_cfg, "exporter")
    if not spec:
        raise ExportError(f"the '{model_cfg.name}' policy family has no published format to export to (its config "
                          "names no exporter): use the checkpoint itself (model.init_from, scripts/eval.py)")
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _load_policy(cfg, checkpoint: str):
    """The policy with the checkpoint's weights (as scripts/eval.py builds it) and the env's spec."""
    import torch

    from embodied_async.checkpoint_io import CheckpointError
    from embodied_async.registry import build_env, build_policy
    from embodied_async.run_folder import load_policy_weights

    try:
        env = build_env(cfg.env, 1, cfg.runner.seed)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        raise ExportError(f"cannot build the run's env to learn its observation and action shapes: {err}") from None
    spec = env.spec
    env.close()
    try:
        policy = build_policy(cfg.model, spec, device=torch.device("cpu")).eval()
        load_policy_weights(policy, checkpoint, "export")
    except (CheckpointError, ValueError, FileNotFoundError, KeyError, RuntimeError) as err:  # incl. a damaged base
        raise ExportError(f"cannot load the policy of {checkpoint}: {err}") from None
    return policy, spec


def _default_stats_key(cfg) -> str:
    """The name statistics are filed under when the user names none: the task's."""
    return str(cfg.env.task_name())


def _put_in_place(tmp: str, out: str) -> None:
    """The finished folder replaces ``out``; the old one is removed only once the new one is in
    place (and comes back should the second rename not happen)."""
    old = out + ".export-old"
    if os.path.exists(out):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(old) and not os.path.exists(out):
            os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


# ---- what the card says ----------------------------------------------------------------------------

def training_dataset(checkpoint: str, spec) -> Optional[Dict[str, Any]]:
    """The dataset the policy's statistics came from: the SFT run's, or the one of the run its run
    started from (``model.init_from``), followed back; None when there is none or it is gone."""
    from omegaconf import OmegaConf

    from embodied_async.config.recipes import checkpoint_config
    from embodied_async.datasets.batches import open_dataset

    seen = set()
    while checkpoint and checkpoint not in seen:
        seen.add(checkpoint)
        try:
            raw = checkpoint_config(checkpoint, ())
        except Exception:  # the run's folder is gone: nothing more to learn
            return None
        if raw.runner.mode == "sft":
            data = OmegaConf.to_container(raw.dataset, resolve=True)
            try:
                # its statistics are what the card needs, whether or not its videos are still there
                reader, keys = open_dataset(data["root"], data["keys"], spec, 1, data.get("recorded_hz"),
                                            check_videos=False)
            except Exception:  # moved or deleted since: the exporter says what it could not write
                return None
            return {"root": str(data["root"]), "episodes": reader.num_episodes, "frames": len(reader),
                    "stats": {name: reader.stats[key] for name, key in keys.items()}}
        checkpoint = raw.model.get("init_from")
    return None


def code_version() -> str:
    """The commit of this checkout (``-dirty`` with uncommitted changes), or the package version."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return f"git {out.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"embodied-async {version('embodied-async')}"
    except PackageNotFoundError:
        return "unknown"
