"""A process that wrote and read video can still start processes from any thread: Ray starts a
raylet (fork, then a preexec_fn, then exec) from whichever thread adds a node, and that child frees
the state Python kept for the process's other threads, PyAV's per-thread scaler among them. A scaler
with a thread pool waits there, in the child, for threads that were not forked: the child never
reaches exec and the parent waits for it forever (seen in the test suite's lost-node drill)."""

import contextlib
import os
import signal
import subprocess
import sys

from conftest import REPO_ROOT

# in a process of its own: a child that hangs would hold the test's output open
SCENARIO = """
import subprocess, sys, threading
import numpy as np
from embodied_async.datasets.video import VideoFileWriter, decode_frames

path = sys.argv[1]
writer = VideoFileWriter(path, fps=10, codec="h264", height=64, width=64)
writer.add(np.random.default_rng(0).integers(0, 255, (6, 64, 64, 3), dtype=np.uint8))
writer.close()
assert decode_frames(path, np.arange(6) / 10).shape == (6, 64, 64, 3)  # in the main thread
exit_codes = []
starter = threading.Thread(target=lambda: exit_codes.append(subprocess.run(["true"], preexec_fn=lambda: None)
                                                            .returncode), daemon=True)
starter.start()
starter.join(timeout=20)
print("started" if exit_codes == [0] else "hung", flush=True)
"""


def test_a_child_forked_from_another_thread_after_video_work_starts(tmp_path):
    printed = tmp_path / "printed.txt"
    with open(printed, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", SCENARIO, str(tmp_path / "camera.mp4")], cwd=REPO_ROOT,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):  # with it a child that never reached exec
                os.killpg(proc.pid, signal.SIGKILL)
    assert printed.read_text().strip().splitlines()[-1:] == ["started"], printed.read_text()
