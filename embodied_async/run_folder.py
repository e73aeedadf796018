"""The run folder, known here alone: where a run's checkpoints lie, how one is written, pruned and
found again, what makes a folder a checkpoint, which policy it holds, its weights, and the run's
composed config. The runner, the trainer ranks, the config checks and every script go through it.

    <runner.logger.log_path>/
        .hydra/config.yaml       the run's composed config (Hydra writes it at launch)
        metrics.jsonl, tensorboard/, videos/step_<N>/
        checkpoints/
            latest               the name of the newest checkpoint, replaced atomically
            global_step_<N>/     one checkpoint (written as global_step_<N>.tmp, then renamed):
                runner.json      the runner's counters: step, version, env steps, clocks
                model.*, optimizer.*, actor_state.*   trees of ``checkpoint_io`` (JSON + safetensors)
                model_info.json  the policy family, the base checkpoint, "trainable" or "full" contents
                manifest.json    size and sha256 of every file, written last: it seals the folder

Nothing here unpickles: a checkpoint is JSON and safetensors only, verified against its manifest
before anything in it is used.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from embodied_async.checkpoint_io import MANIFEST, CheckpointError, assert_no_pickle, verify_checkpoint, write_manifest

CHECKPOINTS = "checkpoints"
LATEST = "latest"
RUNNER_STATE = "runner.json"
MODEL_INFO = "model_info.json"
MODEL_TREE = "model"  # the policy's weights: model.json + model.safetensors
RUN_CONFIG = os.path.join(".hydra", "config.yaml")
STEP_FOLDER = re.compile(r"global_step_(\d+)")
EXAMPLE = "logs/<run>/checkpoints/global_step_<N>"
# what a folder that cannot take a run's files answers (a full disk, a quota, a read-only or
# foreign folder), as an errno and as the text it reaches us in from another process (safetensors'
# Rust errors say "os error N")
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
# only these are taken from an error's text (a worker's traceback names many files: a permission
# error there may be anyone's, a full disk is this run's as soon as its own write failed)
FULL = (errno.ENOSPC, errno.EDQUOT)
ERRNO_IN_TEXT = re.compile(r"os error (\d+)|\[Errno (\d+)\]")
WHAT_TO_DO = {errno.ENOSPC: "make room", errno.EDQUOT: "make room within the quota (or raise it)",
              errno.EROFS: "mount the folder writable (or choose runner.logger.log_path elsewhere)",
              errno.EACCES: "make the folder writable (or choose runner.logger.log_path elsewhere)",
              errno.EPERM: "make the folder writable (or choose runner.logger.log_path elsewhere)"}


class StorageError(RuntimeError):
    """The run's folder cannot take what the run writes: one line naming the folder, the free
    space and the checkpoint to resume from."""


def checkpoints_root(log_path: str) -> str:
    return os.path.join(log_path, CHECKPOINTS)


def step_folder(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def is_checkpoint(folder: str) -> bool:
    """A checkpoint a run wrote and finished: the runner's counters and the sealing manifest
    (whether its files are whole is ``verify``'s question)."""
    return all(os.path.isfile(os.path.join(folder, name)) for name in (RUNNER_STATE, MANIFEST))


def not_a_checkpoint(folder: str, key: str) -> Optional[str]:
    """Why ``folder`` (given as ``key``) is not a checkpoint, naming the fix; None when it is one."""
    if not os.path.isdir(folder):
        return f"{key}={folder!r} is not a folder; point it at a checkpoint folder such as {EXAMPLE}"
    if is_checkpoint(folder):
        return None
    held = checkpoints_held(folder)
    hint = f" (this looks like {held[1]}: its newest checkpoint is {held[0]!r})" if held else ""
    return (f"{key}={folder!r} is a folder but not a checkpoint (it holds no {RUNNER_STATE} and {MANIFEST})"
            f"{hint}; point it at one checkpoint folder such as {EXAMPLE}")


def checkpoints_held(folder: str) -> Optional[Tuple[str, str]]:
    """``(its newest checkpoint, what the folder is)`` when ``folder`` is a checkpoints root or a
    run's log folder; None otherwise."""
    for root, what in ((folder, "a checkpoints root"), (checkpoints_root(folder), "a run's log folder")):
        newest = latest_checkpoint(root)
        if newest:
            return newest, what
    return None


def latest_checkpoint(root: str) -> Optional[str]:
    """The checkpoint the ``latest`` pointer of a checkpoints root names, or None (no pointer, or it
    names no finished checkpoint)."""
    try:
        with open(os.path.join(root, LATEST)) as f:
            name = f.read().strip()
    except OSError:
        return None
    path = os.path.join(root, name)
    return path if STEP_FOLDER.fullmatch(name) and is_checkpoint(path) else None


def videos_folder(log_path: str, step: int) -> str:
    """Where the evaluation launched at ``step`` writes its videos."""
    return os.path.join(log_path, "videos", f"step_{step}")


def log_folder(checkpoint: str) -> str:
    """The run's log folder a checkpoint lies in (``<log>/checkpoints/global_step_<N>``)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(checkpoint)))


def run_config_path(checkpoint: str) -> str:
    return os.path.join(log_folder(checkpoint), RUN_CONFIG)


def log_config(log_path: str) -> Dict:
    """A run's composed config as plain data, from its log folder ({} when it has none)."""
    from omegaconf import OmegaConf

    path = os.path.join(log_path, RUN_CONFIG)
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False) if os.path.isfile(path) else {}


def load_run_config(checkpoint: str):
    """The composed config (an OmegaConf ``DictConfig``, not yet validated) of the run that wrote
    ``checkpoint``; CheckpointError when it is missing."""
    from omegaconf import OmegaConf

    path = run_config_path(checkpoint)
    if not os.path.isfile(path):
        raise CheckpointError(f"{checkpoint} is a checkpoint, but its run's config {path} is missing: name the "
                              "recipe it was trained with (--recipe) and its overrides instead")
    return OmegaConf.load(path)


# ---- writing -------------------------------------------------------------------------------------

def write_checkpoint(root: str, step: int, write_contents: Callable[[str], int], state: Dict,
                     resumed_from: Optional[str] = None) -> str:
    """Write ``root/global_step_<step>``; a crash at any point leaves every earlier checkpoint whole.

    ``write_contents(folder)`` writes the trainer's files and returns the version they hold (the
    truth: an update the runner had not counted yet is in them); ``state`` holds the runner's
    counters. Everything goes to a temporary folder first, sealed by the manifest; a folder of the
    same step is moved aside before the rename and deleted only after it; then ``latest`` names it.
    A folder that cannot take it (full, over quota, read-only) raises StorageError, the partial
    folder removed and ``latest`` still naming the last complete checkpoint.
    """
    final = step_folder(root, step)
    try:
        return _write_checkpoint(root, final, write_contents, state)
    except Exception as err:
        shutil.rmtree(final + ".tmp", ignore_errors=True)
        with contextlib.suppress(OSError):
            os.remove(os.path.join(root, LATEST + ".tmp"))
        code = storage_errno(err)
        if code is None:
            raise
        raise storage_error(f"the checkpoint {final}", root, code, resumed_from) from err


def storage_errno(err: BaseException) -> Optional[int]:
    """The errno of a storage failure behind ``err`` (its causes followed, and the worker's own
    error inside Ray's wrapper): any of STORAGE_ERRNOS from an OSError, only a full disk or quota
    from text (an error that crossed a process as text); None for any other error."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS:
            return err.errno
        codes = [int(a or b) for a, b in ERRNO_IN_TEXT.findall(str(err))]
        codes += [code for code in FULL if os.strerror(code) in str(err)]
        found = [code for code in codes if code in FULL]
        if found:
            return found[0]
        err = getattr(err, "cause", None) or err.__cause__ or err.__context__
    return None


def storage_error(what: str, log_or_root: str, code: int, resumed_from: Optional[str] = None) -> StorageError:
    """StorageError for ``what`` that could not be written: why, the free space, where to resume
    (the newest checkpoint of the run's folder, else the one it resumed from)."""
    root = log_or_root if os.path.basename(log_or_root) == CHECKPOINTS else checkpoints_root(log_or_root)
    place = next(p for p in (root, os.path.dirname(root), "/") if os.path.exists(p))
    free = shutil.disk_usage(place).free
    latest = latest_checkpoint(root) or resumed_from
    todo = WHAT_TO_DO[code]
    then = (f"the last complete checkpoint, {latest}, is whole: {todo} and resume with runner.resume_dir={latest}"
            if latest else f"no checkpoint was completed yet: {todo} and start the run again")
    return StorageError(f"cannot write {what}: {os.strerror(code)} ({free / 2**20:.1f} MiB free where the run "
                        f"writes, {os.path.dirname(root)}); {then}")


@contextlib.contextmanager
def storage_errors_end_the_run(what: str, log_path: str, file: Optional[str] = None, silent_writer: bool = False):
    """Inside the block, a write the run's folder cannot take (full, over quota, read-only) raises
    StorageError naming ``what`` and the file (the error's own, else ``file``). ``silent_writer``:
    the writer is another process (ffmpeg) whose full disk reaches us only as a broken pipe, so an
    almost full disk says it."""
    try:
        yield
    except OSError as err:
        code = storage_errno(err)
        if code is None and silent_writer and shutil.disk_usage(log_path).free < 2**20:
            code = errno.ENOSPC
        if code is None:
            raise
        named = f"{what} ({err.filename or file})" if err.filename or file else what
        raise storage_error(named, log_path, code) from None


def _write_checkpoint(root: str, final: str, write_contents: Callable[[str], int], state: Dict) -> str:
    tmp, old = final + ".tmp", final + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    version = write_contents(tmp)
    state = dict(state, version=version, step=max(state["step"], version))
    with open(os.path.join(tmp, RUNNER_STATE), "w") as f:
        json.dump(state, f)
    write_manifest(tmp)
    if os.path.exists(final):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:  # the same step's earlier checkpoint goes back in place
        if os.path.exists(old) and not os.path.exists(final):
            os.replace(old, final)
        raise
    shutil.rmtree(old, ignore_errors=True)
    with open(os.path.join(root, LATEST + ".tmp"), "w") as f:
        f.write(os.path.basename(final) + "\n")
    os.replace(os.path.join(root, LATEST + ".tmp"), os.path.join(root, LATEST))
    return final


def write_model_info(folder: str, model_cfg, full: bool) -> None:
    """Which policy a checkpoint holds: its family, the base checkpoint its weights apply to, and
    whether it holds every weight (``full``) or the trainable ones only."""
    with open(os.path.join(folder, MODEL_INFO), "w") as f:
        json.dump({"family": model_cfg.name, "base": getattr(model_cfg, "path", None),
                   "contents": "full" if full else "trainable"}, f, indent=1)


def prune_checkpoints(root: str, keep: Optional[int], current_step: int, protect: Sequence[Optional[str]] = ()
                      ) -> List[str]:
    """Delete the oldest ``global_step_<N>`` folders with ``N <= current_step`` until ``keep`` of
    those remain (None: keep all). Folders of later steps (left by an earlier run that went
    further before this one resumed from an older checkpoint) are neither counted nor deleted,
    and neither is anything in ``protect`` (the checkpoint just written, the resume source)."""
    if keep is None:
        return []
    steps = []
    for name in os.listdir(root):
        match = STEP_FOLDER.fullmatch(name)
        if match and int(match.group(1)) <= current_step and os.path.isdir(os.path.join(root, name)):
            steps.append((int(match.group(1)), os.path.join(root, name)))
    steps.sort()
    protected = {os.path.realpath(p) for p in protect if p}
    deleted = []
    for _, path in steps[:max(0, len(steps) - keep)]:
        if os.path.realpath(path) not in protected:
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
    return deleted


# ---- reading -------------------------------------------------------------------------------------

def verify(folder: str, key: str) -> None:
    """Every file of the checkpoint ``folder`` (given as ``key``) is JSON or safetensors and
    matches its manifest; CheckpointError naming the key and the problem otherwise."""
    try:
        assert_no_pickle(folder)
        verify_checkpoint(folder)
    except CheckpointError as err:
        raise CheckpointError(f"{key}={folder!r}: {err}") from None


def model_info(folder: str) -> Dict:
    """``model_info.json`` of a checkpoint: family, base, contents ({} when it has none)."""
    path = os.path.join(folder, MODEL_INFO)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def checkpoint_family(folder: str) -> Optional[str]:
    """The policy family a checkpoint of ours was written by (None when it does not say)."""
    return model_info(folder).get("family")


def read_runner_state(resume_dir: Optional[str]) -> Dict:
    """The runner's counters from ``runner.resume_dir``, after checking every file of it is whole
    (a fresh run's counters without one)."""
    if not resume_dir:
        return {"step": 0, "env_steps": 0, "version": 0}
    verify(resume_dir, "runner.resume_dir")
    with open(os.path.join(resume_dir, RUNNER_STATE)) as f:
        return json.load(f)


def check_resume_model(resume_dir: str, model_cfg) -> None:
    """A checkpoint resumes only into the policy family it was written by; one holding only the
    trainable weights (adapters, value head) names the base they were trained on, and a different
    ``model.path`` is reported (the same base may live under another path, e.g. the tiny
    recipe's, made afresh in each run's folder)."""
    info = model_info(resume_dir)
    if not info:
        return
    if info.get("family") != model_cfg.name:
        raise CheckpointError(f"runner.resume_dir={resume_dir!r} holds a '{info.get('family')}' policy, but this run's "
                              f"model.name is '{model_cfg.name}': resume it with the model config it was trained with")
    base = getattr(model_cfg, "path", None)
    if info.get("contents") == "trainable" and info.get("base") != base:
        print(f"[runner] warning: {resume_dir} holds trainable weights for the base {info.get('base')!r}, and this "
              f"run's model.path is {base!r}; they only fit the base they were trained on", flush=True)


def check_init_from(folder: str, model_cfg) -> None:
    """Start-up check of ``model.init_from`` (in the launcher, before any worker): a whole
    checkpoint of ours, written by a policy of this family."""
    family = checkpoint_family(folder)
    if family is not None and family != model_cfg.name:
        raise CheckpointError(f"model.init_from={folder!r} holds a '{family}' policy and this run's model.name is "
                              f"'{model_cfg.name}': start from a checkpoint of the same family")
    verify(folder, "model.init_from")


def rl_only_prefixes(policy) -> Tuple[str, ...]:
    """The name prefixes of the heads only RL trains (``Policy.rl_only_parameter_prefixes``; the
    value head's when a family declares none)."""
    declared = getattr(policy, "rl_only_parameter_prefixes", None)
    return tuple(declared if declared is not None else getattr(policy, "value_parameter_prefixes", ()))


def fit_rl_only_heads(policy, state: Dict, folder: str, source: str) -> Tuple[Dict, set]:
    """A checkpoint's tensors as they fit ``policy``'s RL-only heads (value head, noise head): a
    supervised checkpoint lacks them, or holds one of another shape (another
    ``model.value_input``), or one this policy does not build (a value-free run). Per head: held
    in this policy's names and shapes, it is loaded; otherwise it keeps the builder's
    initialisation (seeded alike on every rank) and one line says so; one this policy lacks is
    dropped. Returns the tensors to load and the names of the parameters left as built."""
    own_tensors = {n: tuple(t.shape) for n, t in [*policy.named_parameters(), *policy.named_buffers()]}
    left_as_built: set = set()
    for prefix in rl_only_prefixes(policy):
        own = {n: shape for n, shape in own_tensors.items() if n.startswith(prefix)}
        theirs = {n: tuple(t.shape) for n, t in state.items() if n.startswith(prefix)}
        if own == theirs:
            continue
        state = {n: t for n, t in state.items() if not n.startswith(prefix)}
        left_as_built |= set(own)
        head = prefix.rstrip(".").replace("_", " ")
        if not own:
            print(f"[{source}] the {head} in {folder} is left out: this policy has none", flush=True)
        elif not theirs:
            print(f"[{source}] {folder} has no {head} (only RL trains it): it starts fresh as the policy's builder "
                  "makes it, the rest of the weights come from the checkpoint", flush=True)
        else:
            print(f"[{source}] the {head} in {folder} has another shape than this policy's: it starts fresh as "
                  "the policy's builder makes it, the rest of the weights come from the checkpoint", flush=True)
    return state, left_as_built


def load_policy_weights(policy, folder: str, source: str = "load") -> None:
    """A checkpoint's policy weights (and observation statistics) into a built, unsharded
    ``policy``, after verifying the folder; every trainable parameter must be in it but those of
    the RL-only heads (``fit_rl_only_heads``)."""
    from embodied_async.checkpoint_io import load_tree
    from embodied_async.workers.sharding import load_model_state

    verify_checkpoint(folder)
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    state, left_as_built = fit_rl_only_heads(policy, load_tree(folder, MODEL_TREE), folder, source)
    load_model_state(policy, state, trainable - left_as_built)
