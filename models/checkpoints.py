"""Where a pretrained checkpoint comes from, for the families that fine-tune one: a local folder
or a Hugging Face repo id (downloaded into the hub's cache, or found there when offline)."""

from __future__ import annotations

import os
import re
import shutil
from typing import Callable, Optional

from embodied_async.config.checks import ConfigError

HUB_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
LOCAL_PREFIXES = ("/", "./", "../", "~")


def check_checkpoint_path(path: Optional[str], tiny_random_init: bool, example: str, what: str) -> None:
    """Start-up check of ``model.path``: an existing folder or a hub repo id (looked up by the
    workers). A path that looks local must exist, unless ``tiny_random_init`` creates it there.
    ``example``: a repo id to suggest; ``what``: the checkpoint's kind, for the messages."""
    if path is None:
        raise ConfigError(f"model.path is not set: give {what} checkpoint folder or a Hugging Face repo id such "
                          f"as '{example}'")
    local = os.path.expanduser(path)
    if tiny_random_init or os.path.isdir(local):
        return
    if os.path.exists(local):
        raise ConfigError(f"model.path={path!r} is a file, not a checkpoint folder: point model.path at the "
                          "folder that holds config.json and the weights")
    if path.startswith(LOCAL_PREFIXES) or path in (".", "..") or not HUB_REPO_ID.fullmatch(path):
        raise ConfigError(
            f"model.path={path!r} is neither an existing folder nor a Hugging Face repo id ('owner/name'): "
            "fix the path (relative paths are relative to the working directory), give a repo id such as "
            f"'{example}', or set model.tiny_random_init=true to create a tiny random checkpoint there")


def resolve_checkpoint(path: str, what: str = "the", key: str = "model.path", files: Optional[list] = None,
                       cache_first: bool = True) -> str:
    """A local folder as it is; otherwise a Hugging Face repo id: its copy in the hub's cache, or
    (not cached, or ``cache_first=False``) downloaded into the cache with a progress bar (the hub
    falls back to the cache when it cannot be reached). ``files``: only these patterns (e.g. a
    tokenizer out of a model repo); ``key``: the config key, for the messages.

    Workers take the cache first: the launcher fetched the checkpoint already (``fetch_checkpoint``),
    so on its node they start without a request to the hub; on another node they download it."""
    path = os.path.expanduser(path)  # the validation accepted "~/..." the same way
    if os.path.isdir(path):
        return path
    if os.path.exists(path) or path.count("/") != 1:
        raise FileNotFoundError(f"{key}={path!r} is neither a checkpoint folder nor a Hugging Face repo id "
                                "('owner/name')")
    from huggingface_hub import snapshot_download

    if cache_first:
        try:
            return snapshot_download(repo_id=path, allow_patterns=files, local_files_only=True)
        except Exception:  # not cached (or not all of ``files``): download below
            pass
    try:
        return snapshot_download(repo_id=path, allow_patterns=files)
    except Exception as err:  # offline, unknown repo, gated repo, missing files
        include = "".join(f" --include '{f}'" for f in files or ())
        raise FileNotFoundError(
            f"could not get {what} checkpoint '{path}' from the Hugging Face hub ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200] if str(err) else 'no detail'}). On a machine with access run:  "
            f"hf download {path}{include}  (then copy the hub cache, ~/.cache/huggingface, here, or set {key} to "
            "the downloaded folder)") from err


def fetch_checkpoint(path: str, tiny_random_init: bool, what: str, key: str = "model.path",
                     files: Optional[list] = None) -> None:
    """Download the hub repo ``model.path`` names into the cache (the launcher does this once,
    before any worker starts, so that the hub's progress bar is on the terminal and the workers
    find the cache). ``model.path`` keeps the repo id: checkpoints and the saved config name it,
    not this machine's cache folder. A local folder, or a tiny checkpoint still to be made, needs
    nothing."""
    if tiny_random_init and not os.path.isdir(os.path.expanduser(path)):
        return
    resolve_checkpoint(path, what, key, files, cache_first=False)


def make_once(path: str, make: Callable[[str], None]) -> None:
    """Create the folder ``path`` with ``make(folder)`` once, even when several workers ask at the
    same time: each writes a private folder (same seed, same bytes) and renames it into place; the
    first rename wins and the others discard theirs."""
    tmp = f"{path}.tmp-{os.getpid()}"
    make(tmp)
    try:
        os.rename(tmp, path)
    except OSError:  # another worker was first
        shutil.rmtree(tmp, ignore_errors=True)
