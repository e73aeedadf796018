"""Ray's own memory as worker processes are replaced, with none of our code in the processes: a
local Ray instance starts an empty actor, SIGKILLs its process (as a soak's fault does), and Ray
is told to kill the actor, over and over. Prints the resident memory of the raylet and of the GCS
server every ``--every`` replacements.

The 2-hour soak of the default recipe (``benchmarks/2026-12-07-soak-default-recipe.md``) saw the
raylet grow +0.3 MB at each of its 11 worker replacements; this separates Ray's share from ours.

    .venv/bin/python benchmarks/ray_replacement_memory.py --replacements 80   # ~2 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import psutil
import ray


@ray.remote(num_cpus=0)
class EmptyWorker:
    def pid(self) -> int:
        return os.getpid()


def resident_mb(name: str) -> float:
    """The resident memory of the process of this instance called ``name`` (MB; 0 when none)."""
    for process in psutil.Process().children(recursive=True):
        try:
            if process.name() == name:
                return process.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            continue
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replacements", type=int, default=80)
    parser.add_argument("--every", type=int, default=10, help="print the figures every so many replacements")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        print(f"{'replacements':>12} {'raylet MB':>10} {'gcs_server MB':>14}", flush=True)
        print(f"{0:>12} {resident_mb('raylet'):>10.1f} {resident_mb('gcs_server'):>14.1f}", flush=True)
        for done in range(1, args.replacements + 1):
            worker = EmptyWorker.remote()
            os.kill(ray.get(worker.pid.remote()), signal.SIGKILL)
            time.sleep(0.5)  # Ray notices the death, as it would a crashed worker
            ray.kill(worker)
            del worker
            if done % args.every == 0:
                time.sleep(2)
                print(f"{done:>12} {resident_mb('raylet'):>10.1f} {resident_mb('gcs_server'):>14.1f}", flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
