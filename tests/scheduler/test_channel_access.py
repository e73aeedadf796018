"""Only the run's own processes can deliver items on a direct channel: a local user of another uid
cannot reach its sockets (a private folder) nor pass the uid check, a process of our uid without
the run's secret is refused before anything it sent is read, and what an authenticated producer
sends is loaded by an unpickler that admits only the graph's message types. Each intruder sends a
frame whose unpickling would create a file; the file must never appear, and the run's own
producer must still connect afterwards."""

import os
import pickle
import stat
import threading

import numpy as np
import pytest
from local_users import NOBODY, intrude, outcomes, start_intruder

from embodied_async.data import ActionMessage
from embodied_async.private_files import FolderRefused, private_folder
from embodied_async.scheduler import channel_access
from embodied_async.scheduler.direct_channel import DirectChannel

pytestmark = pytest.mark.slow  # starts intruder processes

KEY = (0, 0)
as_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a process as another user (CI runs as root)")


def channel_socket(channel) -> str:
    return os.path.join(channel._folder, f"{channel._index[KEY]}.sock")


def produce_later(channel, item):
    """The run's own producer: a copy of the channel (as a worker receives it) putting ``item``."""
    producer = pickle.loads(pickle.dumps(channel))
    thread = threading.Thread(target=producer.put, args=(item,), kwargs={"key": KEY})
    thread.start()
    return producer, thread


def assert_own_producer_gets_through(channel, marker):
    producer, thread = produce_later(channel, ActionMessage(np.full((2, 1, 3), 7.0, np.float32)))
    got = channel.get(key=KEY, timeout=30)
    thread.join(10)
    assert float(got.actions[0, 0, 0]) == 7.0
    assert not os.path.exists(marker), "an intruder's pickle was executed"
    producer.close()


@pytest.fixture
def channel():
    made = DirectChannel.create("guarded", [KEY], maxsize=2)
    made.listen([KEY])
    yield made
    made.destroy()


def test_the_sockets_live_in_a_folder_only_we_can_enter(channel):
    folder = os.lstat(channel._folder)
    assert stat.S_ISDIR(folder.st_mode) and folder.st_uid == os.getuid() and stat.S_IMODE(folder.st_mode) == 0o700
    assert stat.S_IMODE(os.stat(channel_socket(channel)).st_mode) == 0o600
    with open("/proc/net/unix") as table:  # a path any user can read, not an abstract name
        assert channel_socket(channel) in table.read()


@as_root
def test_another_user_cannot_reach_the_socket(channel, tmp_path):
    marker = tmp_path / "executed"
    attempts = intrude(marker, "frame", channel._folder, uid=NOBODY)
    assert attempts == {channel_socket(channel): ["PermissionError"]}  # found it, could not connect
    assert_own_producer_gets_through(channel, marker)
    assert channel.pop_traffic()["refused_connections"] == 0  # the kernel refused it: nothing reached us


@as_root
def test_another_user_is_refused_by_uid_where_the_folder_would_let_it_in(channel, tmp_path, capfd):
    marker = tmp_path / "executed"
    os.chmod(channel._folder, 0o711)  # as if the folder did not keep others out
    os.chmod(channel_socket(channel), 0o777)
    attempts = intrude(marker, "frame", channel._folder, uid=NOBODY)
    assert attempts == {channel_socket(channel): ["sent"]}  # connected and sent its frame
    os.chmod(channel._folder, 0o700)  # our producer checks the folder before it connects
    assert_own_producer_gets_through(channel, marker)
    assert channel.pop_traffic()["refused_connections"] == 1
    assert f"uid {NOBODY}" in capfd.readouterr().err


def test_our_uid_without_the_secret_is_refused_before_a_frame_is_read(channel, tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(channel_access, "PROOF_TIMEOUT_S", 0.5)
    marker = tmp_path / "executed"
    assert intrude(marker, "frame", channel._folder) == {channel_socket(channel): ["sent"]}
    assert intrude(marker, "forged", channel._folder) == {channel_socket(channel): ["sent"]}
    silent = start_intruder(marker, "silent", 0, channel._folder)  # holds its connection, sends nothing
    assert silent.stdout.readline().split() == ["connected", channel_socket(channel)]
    assert_own_producer_gets_through(channel, marker)
    assert outcomes(silent) == {channel_socket(channel): ["sent"]}
    assert channel.pop_traffic()["refused_connections"] == 3
    err = capfd.readouterr().err
    assert err.count("refused a connection") == 1  # logged once per key, counted every time
    # the real producer was accepted: the key stops listening and its socket's name is gone
    assert not os.path.exists(channel_socket(channel))
    assert intrude(marker, "frame", channel._folder) == {channel_socket(channel): ["FileNotFoundError"]}  # listed, gone


def test_another_run_of_the_same_user_cannot_cross_wires(channel, tmp_path):
    other_run = DirectChannel(channel.name, [KEY], channel.maxsize, channel._folder, os.urandom(32))
    other_run.put(ActionMessage(np.zeros((2, 1, 3), np.float32)), key=KEY)  # into the socket's buffer
    assert_own_producer_gets_through(channel, tmp_path / "unused")
    assert channel.pop_traffic()["refused_connections"] == 1
    other_run.close()


def test_a_frame_naming_code_is_refused_even_from_our_producer(channel, tmp_path):
    marker = tmp_path / "executed"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    producer = pickle.loads(pickle.dumps(channel))
    producer.put(Payload(), key=KEY)
    with pytest.raises(pickle.UnpicklingError, match="names posix.system, which is refused"):
        channel.get(key=KEY, timeout=10)
    assert not marker.exists()
    producer.close()


def test_a_folder_someone_else_could_use_is_refused(tmp_path):
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    os.chmod(open_folder, 0o755)
    with pytest.raises(FolderRefused, match="mode 0755"):
        private_folder(str(open_folder))
    link = tmp_path / "link"
    private_folder(str(tmp_path / "mine"))
    link.symlink_to(tmp_path / "mine")
    with pytest.raises(FolderRefused, match="a link"):
        private_folder(str(link))
    channel = DirectChannel.create("swapped", [KEY], maxsize=2)
    try:
        os.chmod(channel._folder, 0o755)  # e.g. made by another user under the expected name
        with pytest.raises(FolderRefused, match=channel._folder):
            channel.listen([KEY])
        with pytest.raises(FolderRefused, match=channel._folder):
            channel.put(1, key=KEY, timeout=1)  # the producer will not connect into it either
    finally:
        channel.destroy()
    assert not os.path.exists(channel._folder)
