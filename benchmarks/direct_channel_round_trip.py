"""The direct channel alone, as the graph uses it: an env-like process puts an ``EnvOutput`` and
waits for an ``ActionMessage``; this process, rollout-like, answers each. Prints the wall time per
round trip and the CPU time per round trip of each side, so that a change to the channel (the
access checks, the unpickler) can be compared with the code before it, back to back:

    .venv/bin/python benchmarks/direct_channel_round_trip.py --round-trips 20000
    PYTHONPATH=<checkout of the older code> .venv/bin/python <that checkout>/benchmarks/direct_channel_round_trip.py

(an older checkout that lacks this file can run a copy of it: it only uses the channel's API).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time

import numpy as np

from embodied_async.data import ActionMessage, EnvOutput
from embodied_async.scheduler.direct_channel import DirectChannel

KEY = (0, 0)


def _env_side(outputs, actions, round_trips: int, sub_envs: int, state_dim: int) -> None:
    actions.listen([KEY])
    obs = {"states": np.zeros((sub_envs, state_dim), np.float32)}
    for _ in range(round_trips):
        outputs.put_async(EnvOutput.after_reset(obs, sub_envs), key=KEY)
        actions.get(key=KEY)
    outputs.close()
    actions.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--round-trips", type=int, default=20_000)
    parser.add_argument("--sub-envs", type=int, default=8, help="rows per message (PushCube recipe: 8 per env process)")
    parser.add_argument("--state-dim", type=int, default=35)
    parser.add_argument("--action-dim", type=int, default=7)
    args = parser.parse_args()

    outputs = DirectChannel.create("outputs", [KEY], maxsize=2)
    actions = DirectChannel.create("actions", [KEY], maxsize=2)
    outputs.listen([KEY])
    env = mp.get_context("spawn").Process(target=_env_side, args=(outputs, actions, args.round_trips + 1,
                                                                    args.sub_envs, args.state_dim))
    env.start()
    action = ActionMessage(np.zeros((args.sub_envs, 1, args.action_dim), np.float32))
    outputs.get(key=KEY)  # the first round trip connects both keys: left out of the timing
    actions.put(action, key=KEY)
    child_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(args.round_trips):
        outputs.get_async(key=KEY).result()
        actions.put_async(action, key=KEY)
    wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
    env.join()
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    env_cpu = (child.ru_utime + child.ru_stime) - (child_before.ru_utime + child_before.ru_stime)
    n = args.round_trips
    print(f"[channel] {n} round trips of {args.sub_envs} sub-envs: {wall / n * 1e6:.1f} us each; CPU per round trip: "
          f"consumer {cpu / n * 1e6:.1f} us, env process {env_cpu / n * 1e6:.1f} us (with its start-up)")
    outputs.destroy()
    actions.destroy()


if __name__ == "__main__":
    main()
