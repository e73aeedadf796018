"""The places a run keeps what other local users must not reach: private folders (refused when
someone else made them or may enter them), the log folder, Ray's session folder and its token."""

import os
import stat

import pytest
from local_users import NOBODY

from embodied_async.private_files import FolderRefused, make_log_folder, private_folder, private_ray_token, ray_temp_dir

as_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user (CI runs as root)")


@as_root
def test_a_folder_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(FolderRefused, match=f"uid {NOBODY}"):
        private_folder(str(theirs))
    with pytest.raises(FolderRefused, match="log folder"):
        make_log_folder(str(theirs))
    their_link = tmp_path / "their-link"
    private_folder(str(tmp_path / "mine"))
    their_link.symlink_to(tmp_path / "mine")
    os.lchown(their_link, NOBODY, NOBODY)  # they could point it elsewhere after we looked
    with pytest.raises(FolderRefused, match=f"a link of uid {NOBODY}"):
        make_log_folder(str(their_link))


@as_root
def test_rays_folder_made_first_by_another_user_is_avoided(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    planted = tmp_path / f"embodied_async-{os.getuid()}"
    planted.mkdir(mode=0o777)
    os.chown(planted, NOBODY, NOBODY)
    chosen = ray_temp_dir()
    parent = os.path.dirname(chosen)
    assert parent != str(planted) and os.path.basename(parent).startswith(f"embodied_async-{os.getuid()}-")
    assert stat.S_IMODE(os.lstat(parent).st_mode) == 0o700 and os.lstat(parent).st_uid == os.getuid()
    assert str(planted) in capfd.readouterr().err


def test_a_log_folder_others_can_write_to_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(FolderRefused, match="runner.logger.log_path"):
        make_log_folder(str(shared))
    os.chmod(shared, 0o775)  # a group's folder is the user's choice
    make_log_folder(str(shared))
    make_log_folder(str(tmp_path / "not-yet" / "run"))
    assert (tmp_path / "not-yet" / "run").is_dir()  # made now: nobody can plant it before the run writes


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_rays_token_is_made_readable_by_this_user_alone(home, capfd, monkeypatch):
    token = home / ".ray" / "auth_token"
    private_ray_token()
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) == 64
    int(token.read_text(), 16)
    made = token.read_text()
    os.chmod(token, 0o644)  # as Ray writes it under the usual umask
    private_ray_token()
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and token.read_text() == made
    assert "could be read by other users (mode 0644)" in capfd.readouterr().err
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(home / "elsewhere"))  # the user's own choice: left alone
    os.chmod(token, 0o644)
    private_ray_token()
    assert stat.S_IMODE(token.stat().st_mode) == 0o644


@pytest.mark.slow  # starts Ray
def test_a_local_ray_instance_keeps_its_session_in_a_private_folder():
    import ray

    from embodied_async.scheduler.worker_group import init_ray

    # this user's real token: Ray's client keeps the token it read first in this process
    token = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    init_ray(1)
    try:
        session = ray._private.worker._global_node.get_session_dir_path()
        parent = os.path.dirname(os.path.dirname(session))  # <tmp>/embodied_async-<uid>/ray/session_...
        assert os.path.basename(parent) == f"embodied_async-{os.getuid()}"
        assert stat.S_IMODE(os.lstat(parent).st_mode) == 0o700
        assert os.environ["RAY_AUTH_MODE"] == "token"  # Ray turned token authentication on
        if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
            assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
    finally:
        ray.shutdown()
