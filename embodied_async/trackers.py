"""Experiment trackers beside metrics.jsonl (``runner.logger.backends``): TensorBoard, Weights &
Biases and SwanLab. Each gets every record's finite scalars under metrics.jsonl's names with
``step`` as the step, the evaluation videos (looping GIFs), and the run's resolved config once at
start. Each tracker is one small class with ``log(record)``, ``log_videos(videos, step, fps)`` and
``close()``; ``metrics.MetricLogger`` fans out to them.

wandb and swanlab go online only where their credentials are set (or their mode is set
explicitly); otherwise they write offline under the run's log folder, to be uploaded later with
their sync command, so a run never waits on a network it may not have.
"""

from __future__ import annotations

import contextlib
import io
import math
import netrc
import os
import sys
from typing import Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

# where wandb logs in when WANDB_BASE_URL is unset (a netrc entry for either is used)
DEFAULT_WANDB_HOSTS = ("api.wandb.ai", "api.forge.coreweave.com")


def finite_scalars(record: Dict) -> Iterator[Tuple[str, float]]:
    """The record's finite numbers but ``step`` (the x-axis they are plotted against); metrics.jsonl
    writes a non-finite value as null, a tracker leaves it out."""
    for key, value in record.items():
        if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
            yield key, value


def run_name(log_path: str) -> str:
    """The run's name in a tracker: the last folder of its log path (``logs/<time>-<recipe>``)."""
    return os.path.basename(os.path.abspath(log_path))


def animated_gif(frames, fps: int) -> bytes:
    """uint8 frames ``[T, H, W, 3]`` -> the bytes of a looping GIF."""
    from PIL import Image

    images = [Image.fromarray(frame) for frame in frames]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return buffer.getvalue()


def _announce(line: str) -> None:
    print(f"[logger] {line}", flush=True)


def _shown(path: str) -> str:
    """``path`` as a user would type it here: relative below the working directory, else absolute."""
    relative = os.path.relpath(path)
    return os.path.abspath(path) if relative.startswith("..") else relative


def _command(name: str) -> str:
    """A console script of this interpreter's environment (``.venv/bin/wandb``)."""
    return _shown(os.path.join(os.path.dirname(sys.executable), name))


class TensorBoardTracker:
    """Event files under ``<log_path>/tensorboard``; videos in the Images tab as animated GIFs (what
    ``add_video`` makes, without the moviepy dependency it needs for that)."""

    def __init__(self, log_path: str, project: str, run_config: Dict):
        import yaml
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(os.path.join(log_path, "tensorboard"))
        if run_config:  # indented: TensorBoard renders text as Markdown, and this keeps YAML's layout
            text = yaml.safe_dump(run_config, sort_keys=False)
            self._writer.add_text("config", "".join(f"    {line}\n" for line in text.splitlines()), 0)

    def log(self, record: Dict) -> None:
        step = int(record["step"])
        for key, value in finite_scalars(record):
            self._writer.add_scalar(key, value, step)
        self._writer.flush()  # a write its thread could not do surfaces here, at this step

    def log_videos(self, videos, step: int, fps: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        for index, video in enumerate(videos):
            height, width = video.frames.shape[1:3]
            image = Summary.Image(height=height, width=width, colorspace=3,
                                  encoded_image_string=animated_gif(video.frames, fps))
            tag = f"eval_video/{video.file_stem(index)}"
            self._writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def wandb_credentials() -> bool:
    """Whether ``wandb.init`` would find credentials, looked up as wandb does: ``WANDB_API_KEY`` (or
    an identity token file), else a netrc entry (what ``wandb login`` writes) for ``WANDB_BASE_URL``'s
    host, by default W&B's own API host or the CoreWeave address wandb 0.31 puts in front of it."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    base_url = os.environ.get("WANDB_BASE_URL")
    hosts = [urlsplit(base_url).netloc] if base_url else list(DEFAULT_WANDB_HOSTS)
    try:
        entries = netrc.netrc(os.path.expanduser(os.environ.get("NETRC", "~/.netrc")))
    except (OSError, netrc.NetrcParseError):
        return False
    return any(entries.authenticators(host) is not None for host in hosts)


def wandb_mode() -> Optional[str]:
    """"offline" where wandb has no credentials and ``WANDB_MODE`` is unset; None: wandb decides."""
    return None if "WANDB_MODE" in os.environ or wandb_credentials() else "offline"


class WandbTracker:
    """A W&B run under ``<log_path>/wandb/``; offline where no credentials or ``WANDB_MODE`` are set."""

    def __init__(self, log_path: str, project: str, run_config: Dict):
        import wandb

        self._wandb = wandb
        # silent: the one line below says where the run goes; wandb's banner would repeat it
        self._run = wandb.init(project=project, name=run_name(log_path), dir=log_path, config=run_config,
                               mode=wandb_mode(), settings=wandb.Settings(silent=True))
        # plotted against the run's own step: an evaluation's videos arrive after later steps' scalars,
        # which wandb's internal step (only ever increasing) would drop
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")
        if self._run.offline:
            folder = _shown(self._run.settings.sync_dir)
            _announce(f"wandb is offline (no WANDB_API_KEY or ~/.netrc login): the run is written to {folder}; "
                      f"upload it with: {_command('wandb')} sync {folder}")
        else:  # online, or whatever WANDB_MODE says
            _announce(f"wandb run {self._run.name} ({self._run.settings.mode}): {self._run.url or 'not uploaded'}")

    def log(self, record: Dict) -> None:
        self._run.log({"step": int(record["step"]), **dict(finite_scalars(record))})

    def log_videos(self, videos, step: int, fps: int) -> None:
        items = {f"eval_video/{video.file_stem(index)}":
                 self._wandb.Video(io.BytesIO(animated_gif(video.frames, fps)), format="gif")
                 for index, video in enumerate(videos)}
        self._run.log({"step": step, **items})

    def close(self) -> None:
        self._run.finish()


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """swanlab prints its banner and sync hint on stdout with no setting to silence them (our one
    line says the same); what it printed comes out on stderr when the call fails."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            yield
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise


def swanlab_mode() -> Optional[str]:
    """"offline" where swanlab finds no API key (``SWANLAB_API_KEY``, or the netrc ``swanlab login``
    writes) and no mode set (``SWANLAB_MODE``, its settings files); None: swanlab decides."""
    import swanlab

    found = swanlab.Settings()  # what swanlab itself reads from its environment, files and netrc
    return None if "mode" in found.model_fields_set or found.api_key else "offline"


class SwanLabTracker:
    """A SwanLab run under ``<log_path>/swanlog/``; offline where no credentials (``SWANLAB_API_KEY``,
    ``swanlab login``) or mode are set."""

    def __init__(self, log_path: str, project: str, run_config: Dict):
        import swanlab

        self._swanlab = swanlab
        # never a login prompt; no capture of stdout (it would wrap the stream _quiet_stdout swaps)
        settings = swanlab.Settings(interactive=False, terminal=swanlab.Settings.Terminal(proxy_type="none"))
        with _quiet_stdout():
            self._run = swanlab.init(project=project, name=run_name(log_path), mode=swanlab_mode(),
                                     log_dir=os.path.join(log_path, "swanlog"), config=run_config, settings=settings)
        folder = _shown(str(self._run.dir))
        if self._run.mode == "offline":
            _announce(f"swanlab is offline (no SWANLAB_API_KEY or swanlab login): the run is written to {folder}; "
                      f"upload it with: {_command('swanlab')} sync {folder}")
        else:
            _announce(f"swanlab run {self._run.name} ({self._run.mode}): {folder}")

    def log(self, record: Dict) -> None:
        self._run.log(dict(finite_scalars(record)), step=int(record["step"]))

    def log_videos(self, videos, step: int, fps: int) -> None:
        self._run.log({f"eval_video/{video.file_stem(index)}": self._swanlab.Video(animated_gif(video.frames, fps))
                       for index, video in enumerate(videos)}, step=step)

    def close(self) -> None:
        if self._run.alive:  # its own Ctrl-C handler may have finished it already
            with _quiet_stdout():
                self._run.finish()


TRACKERS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "swanlab": SwanLabTracker}


def open_trackers(names: Sequence[str], log_path: str, project: str, run_config: Optional[Dict]) -> List:
    """The trackers ``names`` (``runner.logger.backends``) for a run logging under ``log_path``; those
    already opened are closed again when a later one fails to start."""
    opened: List = []
    try:
        for name in names:
            opened.append(TRACKERS[name](log_path, project, run_config or {}))
    except BaseException:
        close_trackers(opened)
        raise
    return opened


def close_trackers(trackers: List) -> None:
    """Close each, newest first (each may have wrapped what an older one wrapped); a failure is only
    reported, as closing runs while the run ends, maybe from an error that must not be hidden."""
    for tracker in reversed(trackers):
        try:
            tracker.close()
        except Exception as err:
            print(f"[logger] warning: closing {type(tracker).__name__} failed: {err}", file=sys.stderr, flush=True)
