"""The experiment trackers (``runner.logger.backends``): each writes the scalars metrics.jsonl has,
under the same names, plus the evaluation videos and the run's config; wandb and swanlab offline
when no credentials are set, under the run's log folder; and the start-up checks of the key."""

import glob
import json
import os
import struct
import time

import numpy as np
import pytest
from conftest import SMALL, build_config
from omegaconf import OmegaConf

from embodied_async.config import ConfigError
from embodied_async.config.recipes import compose_recipe
from embodied_async.config.validate import resolve, to_eval_config
from embodied_async.evaluation import EpisodeVideo
from embodied_async.metrics import MetricLogger, read_metrics
from embodied_async.trackers import swanlab_mode, wandb_credentials, wandb_mode

RECORDS = [{"step": step, "env_steps": 64 * step, "wall_time_s": 1.5 * step, "train/actor/policy_loss": 0.1 * step,
            "train/critic/value_loss": 2.0 / step, "env/success_rate": 0.25 * step, "time/env": 0.3}
           for step in (1, 2, 3)]
RUN_CONFIG = {"runner": {"max_steps": 3, "logger": {"backends": ["tensorboard", "wandb", "swanlab"]}}}
# what would let wandb or swanlab go online, or write outside the test's folder
TRACKER_ENV = ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "NETRC",
               "SWANLAB_API_KEY", "SWANLAB_MODE", "SWANLAB_ROOT", "SWANLAB_SAVE_DIR", "SWANLAB_LOG_DIR")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No credentials, and every tracker's own folders (home, cache, wandb's dir) inside tmp_path."""
    for name in TRACKER_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, folder in (("HOME", "home"), ("WANDB_DIR", "wandb_dir"), ("WANDB_CACHE_DIR", "wandb_cache"),
                         ("WANDB_CONFIG_DIR", "wandb_config"), ("WANDB_DATA_DIR", "wandb_data")):
        os.makedirs(tmp_path / folder)
        monkeypatch.setenv(name, str(tmp_path / folder))
    monkeypatch.chdir(tmp_path)  # swanlab also reads credentials from ./.swanlab
    return tmp_path


def log_records(root, fps=5) -> str:
    log = str(root / "logs" / "run-a")
    logger = MetricLogger(log, ["tensorboard", "wandb", "swanlab"], run_config=RUN_CONFIG)
    frames = np.random.default_rng(0).integers(0, 255, (3, 8, 10, 3), dtype=np.uint8)
    for record in RECORDS:
        logger.log(record)
    logger.log_videos([EpisodeVideo(0, True, "reach", frames, [0.0, 1.0])], step=2, fps=fps)
    logger.close()
    return log


def log_file_records(path: str):
    """The records of a wandb or swanlab run file: both are LevelDB logs (a 7-byte file header, then
    32 KiB blocks of chunks, each with a 7-byte header: CRC, length, type full/first/middle/last)."""
    with open(path, "rb") as f:
        data = f.read()
    position, pending = 7, b""
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a header is padding
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            yield pending
            pending = b""


def wandb_items(items) -> dict:
    """wandb's key/value items as a dict: a key is ``key`` or, where it holds a "/", ``nested_key``
    (a media value is split into one item per field: ``[key, field]``)."""
    out = {}
    for item in items:
        key, *field = item.nested_key or [item.key]
        value = json.loads(item.value_json)
        if field:
            out.setdefault(key, {})[field[0]] = value
        else:
            out[key] = value
    return out


def wandb_run(log: str, settle_s: float = 20.0):
    """(history rows, the run's config) from the one offline run under ``<log>/wandb``. wandb's own
    service process writes the file: read again until its history has arrived (once, in a full
    suite's run, a read right after ``finish()`` found none), up to ``settle_s``."""
    from wandb.proto.wandb_internal_pb2 import Record

    (path,) = glob.glob(os.path.join(log, "wandb", "offline-run-*", "run-*.wandb"))
    deadline = time.monotonic() + settle_s
    while True:
        rows, config = [], {}
        for data in log_file_records(path):
            record = Record.FromString(data)
            if record.WhichOneof("record_type") == "history":
                rows.append(wandb_items(record.history.item))
            elif record.WhichOneof("record_type") == "run":
                config = wandb_items(record.run.config.update)
        if rows or time.monotonic() > deadline:
            return rows, config
        time.sleep(0.5)


def swanlab_run(log: str):
    """(scalar key -> steps, media keys) from the one offline run under ``<log>/swanlog``."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record

    (path,) = glob.glob(os.path.join(log, "swanlog", "run-*", "run-*.swanlab"))
    scalars, media = {}, set()
    for data in log_file_records(path):
        record = Record.FromString(data)
        if record.WhichOneof("record_type") == "scalar":
            scalars.setdefault(record.scalar.key, []).append(record.scalar.step)
        elif record.WhichOneof("record_type") == "media":
            media.add(record.media.key)
    return scalars, media


def test_every_tracker_writes_the_scalars_of_metrics_jsonl_offline_under_the_log_folder(offline, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = log_records(offline)
    names = set().union(*read_metrics(log))
    assert names == set(RECORDS[0])
    scalars = names - {"step"}  # the step is each tracker's own x-axis

    board = EventAccumulator(os.path.join(log, "tensorboard"), size_guidance={"images": 0, "tensors": 0}).Reload()
    assert set(board.Tags()["scalars"]) == scalars
    assert [e.step for e in board.Scalars("train/actor/policy_loss")] == [1, 2, 3]
    assert board.Tags()["images"] == ["eval_video/episode000_env0_success"]
    assert "config/text_summary" in board.Tags()["tensors"]

    rows, config = wandb_run(log)
    scalar_rows = [row for row in rows if "train/actor/policy_loss" in row]
    assert {key for row in scalar_rows for key in row if not key.startswith("_")} == names
    assert [row["step"] for row in scalar_rows] == [1, 2, 3]
    (video_row,) = [row for row in rows if "eval_video/episode000_env0_success" in row]
    assert video_row["step"] == 2 and video_row["eval_video/episode000_env0_success"]["_type"] == "video-file"
    assert config["runner"] == RUN_CONFIG["runner"]

    steps, media = swanlab_run(log)
    assert set(steps) == scalars and steps["train/actor/policy_loss"] == [1, 2, 3]
    assert media == {"eval_video/episode000_env0_success"}
    (swan_config,) = glob.glob(os.path.join(log, "swanlog", "run-*", "files", "config.yaml"))
    assert "max_steps" in open(swan_config).read()

    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[logger]")]
    assert len(lines) == 2 and "wandb sync logs/run-a/wandb/offline-run-" in lines[0]
    assert "swanlab sync logs/run-a/swanlog/run-" in lines[1]
    assert not os.listdir(offline / "wandb_dir")  # the run went to its own log folder


def test_wandb_goes_online_only_with_credentials(offline, monkeypatch):
    netrc = offline / "home" / ".netrc"
    assert not wandb_credentials() and wandb_mode() == "offline"
    for host in ("api.wandb.ai", "api.forge.coreweave.com"):  # W&B's API host; the default address of wandb 0.31
        netrc.write_text(f"machine {host}\n  login user\n  password secret\n")
        assert wandb_credentials() and wandb_mode() is None
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")  # a server of one's own: its entry only
    assert not wandb_credentials()
    netrc.unlink()
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    assert wandb_credentials()
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_MODE", "disabled")  # a mode the user set is wandb's to follow
    assert wandb_mode() is None


@pytest.mark.parametrize("name, value", [("SWANLAB_API_KEY", "secret"), ("SWANLAB_MODE", "disabled")])
def test_swanlab_goes_offline_unless_it_has_credentials_or_a_mode(offline, monkeypatch, name, value):
    assert swanlab_mode() == "offline"
    monkeypatch.setenv(name, value)
    assert swanlab_mode() is None


def test_an_unknown_tracker_is_refused_naming_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown tracker 'mlflow'; use any of: tensorboard, wandb, swanlab"):
        build_config(tmp_path, "runner.logger.backends=[tensorboard,mlflow]")


def test_a_tracker_not_installed_is_refused_naming_the_install_command(tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "swanlab"
                        else find_spec(name, *args))
    with pytest.raises(ConfigError, match=r"swanlab package is not installed: run \.venv/bin/pip install swanlab"):
        build_config(tmp_path, "runner.logger.backends=[swanlab]")


@pytest.mark.parametrize("old, new", [("false", "[]"), ("true", "[tensorboard]")])
def test_the_former_tensorboard_switch_is_refused_naming_the_new_key(tmp_path, old, new):
    with pytest.raises(ConfigError) as err:
        build_config(tmp_path, f"runner.logger.tensorboard={old}")
    message = str(err.value)
    assert "\n" not in message and message.endswith(f"write runner.logger.backends={new}")
    assert "runner.logger.tensorboard is replaced by runner.logger.backends" in message


def test_the_former_switch_on_the_command_line_composes_and_is_refused_in_one_line():
    raw = compose_recipe("maniskill_async_ppo_mlp", ["runner.logger.tensorboard=false", "cluster.device_type=cpu"])
    with pytest.raises(ConfigError, match=r"^runner\.logger\.tensorboard is replaced .*backends=\[\]$"):
        resolve(raw)


def test_an_old_runs_saved_config_still_loads_for_an_evaluation(tmp_path):
    """A run's saved config names every key of its day, the former switch too; an evaluation (or an
    export) of its checkpoint logs to no tracker, so the switch is no reason to refuse it."""
    saved = OmegaConf.merge(OmegaConf.create(SMALL), OmegaConf.from_dotlist(
        [f"runner.logger.log_path={tmp_path}/logs", "runner.logger.tensorboard=true"]))
    assert to_eval_config(saved).runner.logger.tensorboard is True


def test_the_project_name_must_suit_both_services(tmp_path):
    assert build_config(tmp_path, "runner.logger.backends=[]").runner.logger.backends == []
    with pytest.raises(ConfigError, match="runner.logger.project='my project'"):
        build_config(tmp_path, "runner.logger.project=my project")


@pytest.mark.parametrize("switch, backends", [(True, ["tensorboard"]), (False, [])])
def test_a_run_saved_with_the_former_switch_keeps_its_choice_through_its_checkpoint(tmp_path, switch, backends):
    """A run's saved config from before the backends key: read through its checkpoint (evaluation,
    export, a teacher for demonstrations), its switch becomes the list it meant."""
    from teacher_checkpoints import make_teacher

    from embodied_async.config.recipes import checkpoint_config
    from embodied_async.config.validate import to_train_config

    checkpoint = make_teacher(str(tmp_path / "run"))
    saved = os.path.join(tmp_path, "run", ".hydra", "config.yaml")
    raw = OmegaConf.load(saved)
    del raw.runner.logger["backends"]
    raw.runner.logger.tensorboard = switch
    OmegaConf.save(raw, saved)
    loaded = checkpoint_config(checkpoint)
    loaded.cluster.device_type = "cpu"
    assert to_train_config(loaded).runner.logger.backends == backends
