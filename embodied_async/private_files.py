"""Folders that only the run's user may enter: where the run keeps its sockets and Ray's session,
and the checks that refuse a folder another local user could use to reach into the run.

On a shared machine every local user can list /tmp and /dev/shm, and create names there before
we do. A folder made here is a directory (not a link) owned by our uid with mode 0700; one that
already exists is accepted only if it is exactly that, so a folder planted under the expected
name is refused by name instead of being used.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import tempfile

__all__ = ["FolderRefused", "make_log_folder", "private_folder", "private_ray_token", "ray_temp_dir"]


class FolderRefused(RuntimeError):
    """A folder the run would use is not safe from other local users."""


def _describe(info: os.stat_result) -> str:
    kind = ("a directory" if stat.S_ISDIR(info.st_mode) else
            "a link" if stat.S_ISLNK(info.st_mode) else "not a directory")
    return f"{kind} of uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}"


def private_folder(path: str, create: bool = True) -> bool:
    """Make ``path`` for this user alone (mode 0700), or check that it already is: a directory,
    not a link, owned by our uid, that nobody else may enter. False when it does not exist and
    ``create`` is off; ``FolderRefused`` naming the folder and the fix when it is not private."""
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except FileNotFoundError:
            raise FolderRefused(f"cannot make {path}: {os.path.dirname(path)} does not exist on this node") from None
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise FolderRefused(
            f"refusing {path}: it must be a directory of uid {os.getuid()} that only its owner may use (mode 0700), "
            f"and it is {_describe(info)}. Another local user may have made it to reach into this run: remove it "
            "(or have it removed), then start again")
    return True


def ray_temp_dir() -> str:
    """Where a Ray instance started by this run keeps its session (sockets, logs, runtime envs):
    ``<tmp>/embodied_async-<uid>/ray``. Ray makes its own folders world-writable (mode 0777, so
    that users can share /tmp/ray); inside our private folder nobody else can reach them. <tmp> is
    Ray's own choice: $RAY_TMPDIR, else $TMPDIR, else /tmp. Anyone can make that name first (and
    in a sticky /tmp we could not remove theirs): then a fresh private folder of a random name."""
    system_tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or (
        "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir())
    parent = os.path.join(system_tmp, f"embodied_async-{os.getuid()}")
    try:
        private_folder(parent)
    except FolderRefused as err:
        parent = tempfile.mkdtemp(prefix=f"embodied_async-{os.getuid()}-", dir=system_tmp)  # mode 0700
        print(f"[runner] warning: {err}. Ray's session goes to {parent} instead", file=sys.stderr, flush=True)
    return os.path.join(parent, "ray")


def private_ray_token() -> None:
    """Before a local Ray instance starts: its token file (``~/.ray/auth_token``, Ray's default
    place) readable by this user alone. Ray writes it with the umask's mode, often 0644, where
    any user who can enter the home folder reads the token, and with it may run code in the
    cluster. A missing one is made here the way Ray makes it (64 hex digits), with mode 0600; one
    of ours that others may read is made 0600, with a note. A token Ray gets from
    $RAY_AUTH_TOKEN or $RAY_AUTH_TOKEN_PATH is the user's to keep."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return
    path = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and info.st_mode & 0o077:
            os.chmod(path, 0o600)
            print(f"[runner] note: Ray's token {path} could be read by other users (mode "
                  f"{stat.S_IMODE(info.st_mode):04o}); it is now 0600. If others may have read it, "
                  "`ray get-auth-token --generate` makes a new one", file=sys.stderr, flush=True)
        return
    with os.fdopen(descriptor, "w") as token:
        token.write(secrets.token_hex(32))


def make_log_folder(path: str) -> None:
    """Make the run's log folder (with the user's umask), or check the one that is there: the run
    writes metrics and checkpoints into it and a later run may resume from them, so it must be
    ours and not writable by other users, who could otherwise swap a checkpoint or plant a link
    that our next write follows. A link to it must be ours too."""
    os.makedirs(path, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) and info.st_uid == os.getuid():
        info = os.stat(path)  # a link the user made to a folder of theirs
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & stat.S_IWOTH:
        raise FolderRefused(
            f"refusing the log folder {path}: it must be a directory of uid {os.getuid()} that other users cannot "
            f"write to, and it is {_describe(info)}. Choose another runner.logger.log_path, or fix the folder "
            "(chmod o-w, or make it yourself)")
