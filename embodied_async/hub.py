"""Pushing a finished folder (an exported policy, a dataset of demonstrations) to the Hugging Face
hub with ``huggingface_hub``'s own upload; the token comes from where ``huggingface_hub`` looks
(``HF_TOKEN``, ``hf auth login``). A failure is one line naming the repo and the cause, and the
local folder stays as it is: complete, ready to push again."""

from __future__ import annotations

import os


class HubError(Exception):
    """The upload did not happen: one line, the local folder untouched."""


def push_folder(folder: str, repo_id: str, repo_type: str, private: bool = True) -> str:
    """Create ``repo_id`` (private unless told otherwise; an existing repo is kept) and upload
    ``folder`` into it in one commit; returns the repo's address."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
        api.upload_folder(folder_path=folder, repo_id=repo_id, repo_type=repo_type,
                          commit_message="Upload from embodied_async")
    except Exception as err:  # offline, no token, no rights, a bad repo id: all end the same way
        raise HubError(f"could not push {folder} to the {repo_type} repo '{repo_id}' on the Hugging Face hub "
                       f"({_reason(err)}); the folder is complete: "
                       f"{_push_again(folder, repo_id, repo_type, private)} when the hub can be reached") from None
    prefix = "datasets/" if repo_type == "dataset" else ""
    return f"https://huggingface.co/{prefix}{repo_id}"


def _push_again(folder: str, repo_id: str, repo_type: str, private: bool) -> str:
    """The command that pushes the folder later, creating the repo as this push would have."""
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    return f"push it with  hf upload {repo_id} {folder}{kind}{' --private' if private else ''}"


def push_and_report(folder: str, repo_id: str, repo_type: str, private: bool, command: str) -> int:
    """A script's ``--push-to-hub``: push, print where it went or the one-line error under
    ``command``'s name; the exit code (0, or 1 when the folder stayed local)."""
    import sys

    try:
        url = push_folder(folder, repo_id, repo_type, private)
    except HubError as err:
        print(f"{command} error: {err}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        again = _push_again(folder, repo_id, repo_type, private)
        print(f"[{command}] push stopped by Ctrl-C; {folder} is complete: {again}", file=sys.stderr, flush=True)
        return 130
    print(f"[{command}] pushed {folder} to {url}", flush=True)
    return 0


def add_push_arguments(parser, repo_type: str) -> None:
    """``--push-to-hub REPO_ID`` and ``--public`` for a script that writes a ``repo_type`` folder."""
    parser.add_argument("--push-to-hub", default=None, metavar="REPO_ID",
                        help=f"upload the finished folder to this Hugging Face {repo_type} repo (created private)")
    parser.add_argument("--public", action="store_true", help="with --push-to-hub: create the repo public")


def _reason(err: Exception) -> str:
    """The cause in a few words: offline, no token, or the hub's own first line."""
    from huggingface_hub.errors import LocalTokenNotFoundError

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "", "false", "no"):
        return "offline: HF_HUB_OFFLINE is set, so the hub is not contacted"
    if not _hub_reachable():
        return f"offline: {_hub_host()} cannot be reached from this machine"
    if isinstance(err, LocalTokenNotFoundError):
        return "no token: run `hf auth login` or set HF_TOKEN"
    text = str(err).splitlines()[0][:200] if str(err) else "no detail"
    return f"{type(err).__name__}: {text}"


def _hub_host() -> str:
    from urllib.parse import urlparse

    from huggingface_hub import constants

    return urlparse(constants.ENDPOINT).hostname or "huggingface.co"


def _hub_reachable(timeout_s: float = 5.0) -> bool:
    """Whether a connection to the hub opens (asked only after an upload failed: a proxy that
    carried a successful upload is never second-guessed)."""
    import socket

    try:
        socket.create_connection((_hub_host(), 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False
