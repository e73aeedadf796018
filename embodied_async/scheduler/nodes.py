"""The Ray cluster's nodes as a healing run sees them (``cluster.num_nodes > 1``): a node whose
raylet is gone still counts as alive in Ray's records until its missed heartbeats add up (about
15 s), so a node is judged by whether it runs a trivial task now, and a restart after a node was
lost waits for the cluster to have its nodes again (a scheduler's replacement) before placing the
workers anew (``runner.node_wait_s``)."""

from __future__ import annotations

import time
from typing import Callable, Iterable, List, Set

from embodied_async.scheduler.worker_group import alive_nodes

PROBE_TIMEOUT_S = 5.0  # a live raylet runs a trivial task within milliseconds
NOTE_EVERY_S = 30.0  # how often a wait for nodes says where it stands


def _here() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def responsive(node_ids: Iterable[str], timeout: float = PROBE_TIMEOUT_S) -> Set[str]:
    """Those of ``node_ids`` that run a trivial task pinned to them within ``timeout`` seconds."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0)(_here)
    refs = {probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(): node
            for node in set(node_ids)}
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    for ref in late:
        ray.cancel(ref, force=True)
    answered = set()
    for ref in ready:
        try:
            ray.get(ref)
            answered.add(refs[ref])
        except Exception:  # unschedulable there: the node is gone
            pass
    return answered


def wait_for_nodes(num_nodes: int, device_kind: str, timeout_s: float, log: Callable[[str], None]) -> List[str]:
    """Wait up to ``timeout_s`` seconds until the cluster has ``num_nodes`` nodes with the device
    kind's resource, every one responsive; the responsive ones (fewer when the time ran out)."""
    resource = "GPU" if device_kind == "gpu" else "CPU"
    deadline, next_note = time.monotonic() + timeout_s, 0.0
    while True:
        listed = [node["NodeID"] for node in alive_nodes(resource)]
        answering = responsive(listed)
        if len(answering) >= num_nodes and len(answering) == len(listed):
            return listed
        if time.monotonic() >= deadline:
            return [node for node in listed if node in answering]
        if time.monotonic() >= next_note:
            log(f"waiting for the Ray cluster's nodes: {len(answering)} of cluster.num_nodes={num_nodes} answer "
                f"(up to runner.node_wait_s={timeout_s:g} s in all)")
            next_note = time.monotonic() + NOTE_EVERY_S
        time.sleep(1.0)
