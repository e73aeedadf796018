"""Soak test: run a recipe for N minutes and watch for leaks and pile-ups, with faults injected.

    .venv/bin/python benchmarks/soak.py --minutes 20
    .venv/bin/python benchmarks/soak.py --minutes 5 --config maniskill_ppo_mlp runner.val_check_interval=20
    .venv/bin/python benchmarks/soak.py --minutes 120 --fault-every 10 --faults env-kill,env-stop,rollout-kill

Starts the training entry point in its own process session (runner.max_steps set out of reach),
and every ``--interval`` seconds samples, for every process of that session (the driver, Ray's
daemons, every worker and channel actor): its resident memory; plus the number of live Ray actor
processes and the channel queue sizes the runner logs each step (``channel/*_qsize`` in
metrics.jsonl). After ``--minutes`` it stops the run with Ctrl-C (SIGINT to the session) and prints
each process's RSS growth from the end of the warm-up to the last sample, and the range of the
queue sizes and actor counts after warm-up. Everything sampled is written to ``<log>/soak.json``.

A run whose overrides set ``runner.max_steps`` (or ``runner.stop_at_eval_success``) may end on its
own before the time is up: that counts as lived to the end (exit 0), and the summary's
``evaluations`` (env steps, success rate) say where it got.

``--fault-every M``: after the warm-up, a fault about every M minutes (drawn between 0.5 M and
1.5 M, ``--seed``), of a kind drawn from ``--faults``: ``env-kill`` / ``rollout-kill`` (SIGKILL of
one such worker process), ``env-stop`` (SIGSTOP: a hung worker, found after
``runner.hang_timeout_s``), ``child-kill`` (SIGKILL of a family's simulator child, LIBERO's). The
run heals them (``runner.restarts_per_hour`` is raised to fit, unless an override sets it); the
summary lists the faults, the run's ``heal/*`` records, the success rate early and late after
warm-up (learning still progressing), and what was left once the run stopped (processes of its
session, its channels' socket folders).
Exit status: 0 when the run lived to the end, healed every fault and stopped cleanly, 1 otherwise.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
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
    # a process's memory swings with the batches it holds (the actor's by ~5 % between samples):
    # the trend compares the medians of the first and the last quarter of the samples after warm-up
    quarter = max(1, len(after) // 4)
    growth = {}
    for name, mb in last["rss_mb"].items():
        if name in first["rss_mb"]:
            early = [s["rss_mb"][name] for s in after[:quarter] if name in s["rss_mb"]]
            late = [s["rss_mb"][name] for s in after[-quarter:] if name in s["rss_mb"]]
            growth[name] = {"warm_mb": round(first["rss_mb"][name], 1), "last_mb": round(mb, 1),
                            "growth_pct": round(100.0 * (mb - first["rss_mb"][name]) / first["rss_mb"][name], 2),
                            "trend_pct": round(100.0 * (statistics.median(late) / statistics.median(early) - 1), 2)}
    queue_range: Dict[str, List[float]] = defaultdict(lambda: [float("inf"), float("-inf")])
    for s in after:
        for name, size in s["queues"].items():
            queue_range[name] = [min(queue_range[name][0], size), max(queue_range[name][1], size)]
    total_growth = 100.0 * (last["total_rss_mb"] - first["total_rss_mb"]) / max(first["total_rss_mb"], 1e-9)
    return {"warmup_end_t_s": first["t_s"], "last_t_s": last["t_s"], "steps": [first["step"], last["step"]],
            "rss_growth_per_process": growth, "total_rss_growth_pct": round(total_growth, 2),
            "max_process_growth_pct": max((g["growth_pct"] for g in growth.values()), default=0.0),
            "max_process_trend_pct": max((g["trend_pct"] for g in growth.values()), default=0.0),
            "queue_size_range": dict(queue_range),
            "ray_actor_processes_range": [min(s["ray_actor_processes"] for s in after),
                                          max(s["ray_actor_processes"] for s in after)]}


FAULTS = {  # kind -> (what the process is, the signal)
    "env-kill": ("ray::EnvWorker", signal.SIGKILL), "env-stop": ("ray::EnvWorker", signal.SIGSTOP),
    "rollout-kill": ("ray::RolloutWorker", signal.SIGKILL),
    "child-kill": ("embodied_async.isolated.server", signal.SIGKILL),
}


HEAL_MARGIN_S = 150.0  # no fault this close to the end: it would not be found (runner.hang_timeout_s) and healed


def inject_fault(sid: int, kind: str, rng: random.Random, start: float) -> Optional[Dict]:
    """Signal one process of the run's session that ``kind`` names, drawn at random; None when
    there is none now (e.g. while a restart builds its workers)."""
    what, signum = FAULTS[kind]
    targets = []
    for proc in session_processes(sid):
        try:
            title = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if (title.startswith(what) if what.startswith("ray::") else what in title) and \
                proc.status() != psutil.STATUS_STOPPED:
            targets.append(proc.pid)
    if not targets:
        return None
    pid = rng.choice(sorted(targets))
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return None
    fault = {"t_s": round(time.monotonic() - start, 1), "kind": kind, "pid": pid}
    print(f"[soak] t={fault['t_s']:7.1f}s fault: {kind} of pid {pid}", flush=True)
    return fault


def read_records(metrics_path: str) -> List[Dict]:
    records = []
    if os.path.exists(metrics_path):
        with open(metrics_path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut short by the stop
                    continue
    return records


def healing_summary(records: List[Dict], faults: List[Dict]) -> Dict:
    """The run's heal/* records against the faults injected, and its success rate in the first and
    the last quarter of its updates (nothing else measures learning over a soak)."""
    heals = [r for r in records if "heal/fault" in r]
    updates = [r for r in records if r.get("env/success_rate") is not None and "heal/fault" not in r]
    quarter = max(1, len(updates) // 4)

    def mean_success(part):
        return round(sum(r["env/success_rate"] for r in part) / len(part), 3) if part else None

    return {"faults_injected": len(faults), "heal_records": len(heals),
            "replaced_in_place": sum(1 for r in heals if "heal/replaced" in r),
            "restarts": sum(1 for r in heals if "heal/restarts" in r),
            "lost_decisions": sum(r.get("heal/lost_decisions", 0.0) for r in heals),
            "lost_steps": sum(r.get("heal/lost_steps", 0.0) for r in heals),
            "max_gap_s": round(max((r["heal/gap_s"] for r in heals), default=0.0), 1),
            "evaluations": [[r["env_steps"], r["eval/success_rate"]] for r in records
                            if r.get("eval/success_rate") is not None and "env_steps" in r],
            "success_first_quarter": mean_success(updates[:quarter]),
            "success_last_quarter": mean_success(updates[-quarter:]),
            "heals": [{k: v for k, v in r.items() if k.startswith("heal/") or k == "step"} for r in heals]}


def left_behind(sid: int, channel_dir: str) -> Dict:
    """Processes of the run's session and channel socket folders still there after it stopped
    (the folder the run's channels were made in is removed when empty)."""
    deadline = time.monotonic() + 30
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.5)
    processes = [process_label(p) for p in session_processes(sid)]
    folders = sorted(glob.glob(os.path.join(channel_dir, "*")))
    if not folders:
        os.rmdir(channel_dir)
    return {"processes": processes, "channel_folders": folders}


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


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0, help="how long to run (default 20)")
    parser.add_argument("--warmup-minutes", type=float, default=3.0,
                        help="growth is measured from the first sample after this (default 3)")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples (default 30)")
    parser.add_argument("--config", default="maniskill_async_ppo_mlp", help="recipe in configs/")
    parser.add_argument("--log-path", default=None, help="run folder (default logs/soak-<time>)")
    parser.add_argument("--fault-every", type=float, default=0.0,
                        help="minutes between injected faults, on average (default 0: none)")
    parser.add_argument("--faults", default="env-kill,env-stop",
                        help=f"kinds of fault to draw from, comma-separated: {', '.join(FAULTS)}")
    parser.add_argument("--seed", type=int, default=0, help="draws the faults' times and kinds")
    parser.add_argument("overrides", nargs="*", help="Hydra key=value overrides for the recipe")
    args = parser.parse_args(argv)
    args.fault_kinds = [kind for kind in args.faults.split(",") if kind]
    unknown = [kind for kind in args.fault_kinds if kind not in FAULTS]
    if unknown:
        parser.error(f"--faults: unknown kinds {unknown}; the kinds: {', '.join(FAULTS)}")
    return args


def soak(proc: subprocess.Popen, args, log_path: str) -> tuple:
    """Sample (and inject faults) until ``--minutes`` are over or the run ends: (samples, faults,
    whether it ended early)."""
    metrics_path = os.path.join(log_path, "metrics.jsonl")
    rng = random.Random(args.seed)
    start, samples, faults = time.monotonic(), [], []
    end, next_sample = start + args.minutes * 60, start
    next_fault = start + args.warmup_minutes * 60 + rng.uniform(0.5, 1.5) * args.fault_every * 60 \
        if args.fault_every else math.inf
    while time.monotonic() < end and proc.poll() is None:
        now = time.monotonic()
        if now >= next_sample:
            samples.append(take_sample(proc.pid, metrics_path, start))
            print_sample(samples[-1])
            next_sample = now + args.interval
        if now >= next_fault and end - now > HEAL_MARGIN_S:
            fault = inject_fault(proc.pid, rng.choice(args.fault_kinds), rng, start)
            if fault is not None:
                faults.append(fault)
            # none to hit now (a restart building its workers): try again a little later
            next_fault = now + (rng.uniform(0.5, 1.5) * args.fault_every * 60 if fault else 10.0)
        time.sleep(max(0.0, min(next_sample, next_fault, end) - time.monotonic()))
    # ending before the time is up is dying, unless the run finished its own steps or reached its
    # runner.stop_at_eval_success (exit 0)
    died_early = proc.poll() not in (None, 0)
    samples.append(take_sample(proc.pid, metrics_path, start))
    return samples, faults, died_early


def main(argv=None) -> int:
    args = parse(argv)
    log_path = os.path.abspath(args.log_path or os.path.join(REPO_ROOT, "logs", time.strftime("soak-%Y%m%d-%H%M%S")))
    os.makedirs(log_path, exist_ok=True)
    overrides = list(args.overrides)
    if args.fault_every and not any(o.startswith("runner.restarts_per_hour=") for o in overrides):
        overrides.append(f"runner.restarts_per_hour={math.ceil(1.5 * 60 / args.fault_every) + 1}")
    if not any(o.startswith("runner.max_steps=") for o in overrides):  # else: the run may end on its own
        overrides.append("runner.max_steps=100000000")
    command = [sys.executable, ENTRY, "--config-name", args.config, f"runner.logger.log_path={log_path}", *overrides]
    print(f"[soak] {args.minutes:g} min of {args.config}; output and soak.json in {log_path}", flush=True)
    # the run's channel sockets in a folder of its own: what is left there after it stopped is its own
    channel_dir = tempfile.mkdtemp(prefix="soak-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    with open(os.path.join(log_path, "train.log"), "w") as train_log:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=train_log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "EMBODIED_ASYNC_CHANNEL_DIR": channel_dir})
        try:
            samples, faults, died_early = soak(proc, args, log_path)
        finally:
            returncode = stop(proc)
    summary = summarise(samples, args.warmup_minutes * 60)
    healing = healing_summary(read_records(os.path.join(log_path, "metrics.jsonl")), faults)
    leftover = left_behind(proc.pid, channel_dir)
    summary.update(returncode=returncode, died_early=died_early, minutes=args.minutes, config=args.config,
                   overrides=overrides, faults=faults, healing=healing, left_behind=leftover)
    with open(os.path.join(log_path, "soak.json"), "w") as f:
        json.dump({"summary": summary, "samples": samples}, f, indent=1)
    print(json.dumps(summary, indent=1), flush=True)
    if died_early:
        print(f"[soak] the run ended before {args.minutes:g} min (exit {returncode}); see {log_path}/train.log",
              file=sys.stderr, flush=True)
    unhealed = healing["heal_records"] < len(faults)
    if unhealed:
        print(f"[soak] {len(faults)} faults injected, {healing['heal_records']} healed", file=sys.stderr, flush=True)
    dirty = bool(leftover["processes"] or leftover["channel_folders"])
    return 1 if died_early or unhealed or dirty or returncode not in (0, 130) else 0


if __name__ == "__main__":
    sys.exit(main())
