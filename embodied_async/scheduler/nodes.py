"""The Ray cluster's nodes as a healing run sees them (``cluster.num_nodes > 1``): a node whose
raylet is gone still counts as alive in Ray's records until its missed heartbeats add up (about
15 s), so a node is judged by whether it runs a trivial task now, and a restart after a node was
lost waits for the cluster to have its nodes again (a scheduler's replacement) before placing the
workers anew (``runner.node_wait_s``)."""

from __future__ import annotations

import functools
import time
from typing import Callable, Dict, Iterable, List, Set

from embodied_async.scheduler.worker_group import alive_nodes

PROBE_TIMEOUT_S = 5.0  # a live raylet runs a trivial task within milliseconds
NOTE_EVERY_S = 30.0  # how often a wait for nodes says where it stands


def _here() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


@functools.lru_cache(maxsize=1)
def _remote_here():
    import ray

    return ray.remote(num_cpus=0)(_here)  # registered with Ray once, not at every probe


def _probe(node: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return _remote_here().options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()


def _answered(probes: Dict[str, object]) -> Set[str]:
    """The nodes whose probe ran; a probe that failed (unschedulable: the node is gone) is dropped,
    one still pending is kept (a node's first task may wait for a worker process to start)."""
    import ray

    refs = list(probes.values())
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
    answered = set()
    for node, ref in list(probes.items()):
        if ref in ready:
            try:
                ray.get(ref)
                answered.add(node)
            except Exception:
                del probes[node]
    return answered


def responsive(node_ids: Iterable[str], timeout: float = PROBE_TIMEOUT_S) -> Set[str]:
    """Those of ``node_ids`` that run a trivial task pinned to them within ``timeout`` seconds."""
    probes = {node: _probe(node) for node in set(node_ids)}
    deadline = time.monotonic() + timeout
    while True:
        answered = _answered(probes)
        if len(answered) == len(probes) or time.monotonic() >= deadline:
            return answered
        time.sleep(0.05)


def wait_for_nodes(num_nodes: int, device_kind: str, timeout_s: float, log: Callable[[str], None]) -> List[str]:
    """Wait up to ``timeout_s`` seconds until the cluster has ``num_nodes`` nodes with the device
    kind's resource, every one having run a probe (kept across looks: a new node's first task
    waits for a worker process, which can take longer than a look); the ones that answered
    (fewer when the time ran out)."""
    resource = "GPU" if device_kind == "gpu" else "CPU"
    deadline, next_note = time.monotonic() + timeout_s, 0.0
    probes: Dict[str, object] = {}
    while True:
        listed = [node["NodeID"] for node in alive_nodes(resource)]
        for node in listed:
            if node not in probes:
                probes[node] = _probe(node)
        answering = _answered(probes) & set(listed)
        if len(answering) >= num_nodes and len(answering) == len(listed):
            return listed
        if time.monotonic() >= deadline:
            return [node for node in listed if node in answering]
        if time.monotonic() >= next_note:
            log(f"waiting for the Ray cluster's nodes: {len(answering)} of cluster.num_nodes={num_nodes} answer "
                f"(up to runner.node_wait_s={timeout_s:g} s in all)")
            next_note = time.monotonic() + NOTE_EVERY_S
        time.sleep(1.0)
