"""Prometheus metrics of a Celery worker: its pool processes' and the queues' depth.

Tasks run in the worker's pool processes, so what they record (ingest stage
times and items, RPC calls to the stores) lives in other processes than the
one serving ``/metrics``. ``attest worker --metrics-port`` therefore runs
prometheus_client in multiprocess mode: every process writes its values to
files in ``PROMETHEUS_MULTIPROC_DIR``, and the worker's main process sums
them on each scrape (a pool process that exits is marked dead, so its gauges
leave the sums). The directory must be set before prometheus_client is first
imported, which is why the command starts itself again with it set (see
``attest.cli.worker``).

The main process also reports ``attest_pipeline_queue_depth``: tasks waiting
in each Celery queue, read from the broker (Redis list lengths) at scrape
time, the signal an autoscaler (KEDA) scales the workers on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
#: Set to the directory when ``attest worker`` made it itself (and removes it at exit).
OWNED_DIR = "ATTEST_WORKER_METRICS_DIR"
#: kombu's Redis transport keeps a queue's prioritized messages in extra lists
#: named ``<queue>\x06\x16<priority>`` (default steps 0, 3, 6, 9).
PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


class QueueDepth(Collector):
    """``attest_pipeline_queue_depth{queue}`` from the broker, read at each scrape."""

    def __init__(self, broker_url: str, queues: Sequence[str]) -> None:
        self._broker_url = broker_url
        self._queues = list(queues)

    def collect(self) -> Iterator[Metric]:
        import redis

        family = GaugeMetricFamily(
            "attest_pipeline_queue_depth",
            "Tasks waiting in each Celery queue (not yet taken by a worker).",
            labels=["queue"],
        )
        client = redis.Redis.from_url(self._broker_url, socket_timeout=2.0)
        try:
            for queue in self._queues:
                depth = sum(int(client.llen(queue + s)) for s in PRIORITY_SUFFIXES)
                family.add_metric([queue], depth)
        except redis.RedisError as err:
            # A scrape while the broker is away shows no depth instead of failing.
            log.warning("queue depth unavailable: %s", err)
            return
        finally:
            client.close()
        yield family


def serve(port: int, broker_url: str, queues: Sequence[str]) -> None:
    """Serve ``/metrics`` on ``port``: every process's values summed, and the queues."""
    from prometheus_client import multiprocess

    if not os.environ.get(MULTIPROC_DIR):
        raise RuntimeError(f"{MULTIPROC_DIR} must be set before prometheus_client is imported")
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    registry.register(QueueDepth(broker_url, queues))
    start_http_server(port, registry=registry)


def remove_owned_dir_at_exit() -> None:
    """Remove the metrics directory when this main process exits, if the command made it."""
    import atexit
    import shutil

    folder, owner = os.environ.get(OWNED_DIR), os.getpid()
    if not folder or folder != os.environ.get(MULTIPROC_DIR):
        return

    def remove() -> None:
        # Forked pool processes inherit the hook; only the main process removes.
        if os.getpid() == owner:
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)


def mark_process_dead(pid: int) -> None:
    """A pool process ended: drop its live gauges from the sums."""
    from prometheus_client import multiprocess

    if os.environ.get(MULTIPROC_DIR):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
