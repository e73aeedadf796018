"""Soak test: run a recipe for N minutes and watch for leaks and pile-ups.

    .venv/bin/python benchmarks/soak.py --minutes 20
    .venv/bin/python benchmarks/soak.py --minutes 5 --config maniskill_ppo_mlp runner.val_check_interval=20

Starts the training entry point in its own process session (runner.max_steps set out of reach),
and every ``--interval`` seconds samples, for every process of that session (the driver, Ray's
daemons, every worker and channel actor): its resident memory; plus the number of live Ray actor
processes and the channel queue sizes the runner logs each step (``channel/*_qsize`` in
metrics.jsonl). After ``--minutes`` it stops the run with Ctrl-C (SIGINT to the session) and prints
each process's RSS growth from the end of the warm-up to the last sample, and the range of the
queue sizes and actor counts after warm-up. Everything sampled is written to ``<log>/soak.json``.
Exit status: 0 when the run lived to the end and stopped cleanly, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from typing import Dict, List, Optional

import psutil

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = os.path.join(REPO_ROOT, "examples", "embodiment", "train_async.py")
# Ray's own per-node helpers and idle pooled workers: not actors of the run
RAY_HELPERS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::IDLE")


def process_label(proc: psutil.Process) -> str:
    """A stable name: Ray workers retitle themselves "ray::Class.method", keep "ray::Class"."""
    try:
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"
    title = " ".join(cmdline) if cmdline else proc.name()
    if title.startswith("ray::"):
        return title.split()[0].split(".")[0].rstrip("()")
    if ENTRY in title:
        return "driver"
    for daemon in ("gcs_server", "raylet", "dashboard", "log_monitor", "runtime_env", "monitor.py"):
        if daemon in title:
            return daemon
    return os.path.basename(cmdline[0]) if cmdline else proc.name()


def session_processes(sid: int) -> List[psutil.Process]:
    out = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return out


def latest_record(metrics_path: str) -> Dict:
    """The last complete line of metrics.jsonl (empty before the first step)."""
    if not os.path.exists(metrics_path):
        return {}
    with open(metrics_path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 65536))
        lines = f.read().decode(errors="replace").splitlines()
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return {}


def take_sample(sid: int, metrics_path: str, start: float) -> Dict:
    rss: Dict[str, float] = {}
    actors = 0
    for proc in session_processes(sid):
        label = process_label(proc)
        try:
            mb = proc.memory_info().rss / 2**20
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss[f"{label}[{proc.pid}]"] = mb
        actors += label.startswith("ray::") and label not in RAY_HELPERS
    record = latest_record(metrics_path)
    queues = {k.split("/", 1)[1]: v for k, v in record.items() if k.startswith("channel/")}
    return {"t_s": round(time.monotonic() - start, 1), "step": record.get("step"), "rss_mb": rss,
            "total_rss_mb": sum(rss.values()), "ray_actor_processes": actors, "queues": queues}


def summarise(samples: List[Dict], warmup_s: float) -> Dict:
    after = [s for s in samples if s["t_s"] >= warmup_s] or samples[-1:]
    first, last = after[0], after[-1]
    growth = {}
    for name, mb in last["rss_mb"].items():
        if name in first["rss_mb"]:
            growth[name] = {"warm_mb": round(first["rss_mb"][name], 1), "last_mb": round(mb, 1),
                            "growth_pct": round(100.0 * (mb - first["rss_mb"][name]) / first["rss_mb"][name], 2)}
    queue_range: Dict[str, List[float]] = defaultdict(lambda: [float("inf"), float("-inf")])
    for s in after:
        for name, size in s["queues"].items():
            queue_range[name] = [min(queue_range[name][0], size), max(queue_range[name][1], size)]
    total_growth = 100.0 * (last["total_rss_mb"] - first["total_rss_mb"]) / max(first["total_rss_mb"], 1e-9)
    return {"warmup_end_t_s": first["t_s"], "last_t_s": last["t_s"], "steps": [first["step"], last["step"]],
            "rss_growth_per_process": growth, "total_rss_growth_pct": round(total_growth, 2),
            "max_process_growth_pct": max((g["growth_pct"] for g in growth.values()), default=0.0),
            "queue_size_range": dict(queue_range),
            "ray_actor_processes_range": [min(s["ray_actor_processes"] for s in after),
                                          max(s["ray_actor_processes"] for s in after)]}


def print_sample(sample: Dict) -> None:
    queues = " ".join(f"{k}={v:.0f}" for k, v in sorted(sample["queues"].items()))
    print(f"[soak] t={sample['t_s']:7.1f}s step={sample['step']} rss={sample['total_rss_mb']:8.1f} MB "
          f"actors={sample['ray_actor_processes']} queues: {queues or '-'}", flush=True)


def stop(proc: subprocess.Popen, timeout: float = 60.0) -> Optional[int]:
    """Ctrl-C to the whole session, as a terminal sends it; SIGKILL if it does not stop."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:  # every process of the session: the run's driver has a group of its own
            subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)
            proc.wait()
    return proc.returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0, help="how long to run (default 20)")
    parser.add_argument("--warmup-minutes", type=float, default=3.0,
                        help="growth is measured from the first sample after this (default 3)")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples (default 30)")
    parser.add_argument("--config", default="maniskill_async_ppo_mlp", help="recipe in configs/")
    parser.add_argument("--log-path", default=None, help="run folder (default logs/soak-<time>)")
    parser.add_argument("overrides", nargs="*", help="Hydra key=value overrides for the recipe")
    args = parser.parse_args(argv)

    log_path = os.path.abspath(args.log_path or os.path.join(REPO_ROOT, "logs", time.strftime("soak-%Y%m%d-%H%M%S")))
    os.makedirs(log_path, exist_ok=True)
    command = [sys.executable, ENTRY, "--config-name", args.config, "runner.max_steps=100000000",
               f"runner.logger.log_path={log_path}", *args.overrides]
    print(f"[soak] {args.minutes:g} min of {args.config}; output and soak.json in {log_path}", flush=True)
    with open(os.path.join(log_path, "train.log"), "w") as train_log:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=train_log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        start, samples = time.monotonic(), []
        try:
            while time.monotonic() - start < args.minutes * 60 and proc.poll() is None:
                samples.append(take_sample(proc.pid, os.path.join(log_path, "metrics.jsonl"), start))
                print_sample(samples[-1])
                time.sleep(max(0.0, min(args.interval, args.minutes * 60 - (time.monotonic() - start))))
            died_early = proc.poll() is not None
            samples.append(take_sample(proc.pid, os.path.join(log_path, "metrics.jsonl"), start))
        finally:
            returncode = stop(proc)
    summary = summarise(samples, args.warmup_minutes * 60)
    summary.update(returncode=returncode, died_early=died_early, minutes=args.minutes, config=args.config)
    with open(os.path.join(log_path, "soak.json"), "w") as f:
        json.dump({"summary": summary, "samples": samples}, f, indent=1)
    print(json.dumps(summary, indent=1), flush=True)
    if died_early:
        print(f"[soak] the run ended before {args.minutes:g} min (exit {returncode}); see {log_path}/train.log",
              file=sys.stderr, flush=True)
    return 1 if died_early or returncode not in (0, 130) else 0


if __name__ == "__main__":
    sys.exit(main())
