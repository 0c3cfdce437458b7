"""Serving an agent until SIGTERM: bind the control API to --listen only (and Prometheus
metrics to --metrics-listen only, when named), push heartbeats to the Conductor when one
is named, then drain and exit, even when a call is stuck.

`kill -USR1 PID` writes every thread's stack to stderr, for an agent that seems stuck."""

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc

from agents.node.allocator import steady_allocator
from agents.node.faults import Faults
from agents.node.heartbeat import Heartbeats
from agents.node.metrics import AgentMetrics, MetricsServer
from agents.node.node import NodeAgent
from agents.node.service import AgentService
from agents.node.settings import AgentSettings
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.auth import SecretInterceptor

logger = logging.getLogger(__name__)

EXIT_JOIN_S = 2.0  # how long idle worker threads get to end before the exit
STOP_POLL_S = 0.1  # how often the main thread looks for SIGTERM / SIGINT


def serve(settings: AgentSettings, metrics_listen: str | None = None) -> int:
    """Run the agent; prints one 'ready' line with its addresses; returns the exit code."""
    steady_allocator()  # before any thread starts (agents/node/allocator.py)
    if settings.torch_threads is not None:
        import torch

        torch.set_num_threads(settings.torch_threads)
    # The handlers only record the signal: Event.set() from a handler can deadlock on the
    # lock Event.wait() holds in the interrupted main thread (seen: an agent that never
    # stopped after SIGTERM, its main thread in the handler inside stop.wait()).
    signals: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _: signals.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _: signals.append(signum))
    # A decode stream holds a thread until its last token: room for a full batch, plus the
    # prefill, pool and state calls.
    rpc_threads = futures.ThreadPoolExecutor(
        max_workers=settings.max_batch_size + 16, thread_name_prefix="agent-rpc"
    )
    server = grpc.server(
        rpc_threads,
        interceptors=[SecretInterceptor(settings.secret)],
        options=[("grpc.so_reuseport", 0)],
    )
    host, _, _ = settings.listen.rpartition(":")
    port = server.add_insecure_port(settings.listen)  # raises when it cannot bind
    control_address = f"{host}:{port}"
    instance_id = settings.instance_id or f"{settings.role}@{control_address}"
    agent = NodeAgent(settings, instance_id, Faults.from_environ(os.environ))
    if settings.warmup_tokens and settings.role == "prefill":
        took_s = agent.warm_up(settings.warmup_tokens)
        logger.info("agent %s warmed up in %.2f s", instance_id, took_s)
    metrics = AgentMetrics(agent)
    service = AgentService(agent, control_address, metrics)
    pb_grpc.add_AgentServicer_to_server(service, server)
    metrics_server = None
    if metrics_listen is not None:
        metrics_server = MetricsServer(metrics.registry, metrics_listen)  # raises on bind
    server.start()
    print(
        f"kvcentric agent ready: id={instance_id} role={settings.role} "
        f"control={control_address} data={agent.data_address}"
        + (f" metrics={metrics_server.address}" if metrics_server else ""),
        flush=True,
    )
    heartbeats = None
    if settings.conductor:  # else whoever drives the agent pulls GetState
        heartbeats = Heartbeats(
            agent,
            settings.conductor,
            control_address=control_address,
            interval_s=settings.heartbeat_interval_s,
            max_backlog_events=settings.max_backlog_events,
        )
        heartbeats.start()
        service.flush_events = heartbeats.flush
    while not signals:
        time.sleep(STOP_POLL_S)
    logger.info("agent %s: stopping; draining in-flight work", instance_id)
    drained, left = agent.drain(settings.drain_timeout_s)
    if not drained:
        logger.warning("agent %s: %d call(s) still in flight after drain", instance_id, left)
    if heartbeats is not None:
        heartbeats.close()  # after the drain: the final heartbeat carries its KV events
    server.stop(grace=5).wait()
    rpc_threads.shutdown(wait=False, cancel_futures=True)
    if metrics_server is not None:
        metrics_server.close()
    agent.close()
    print(f"kvcentric agent {instance_id} stopped", flush=True)
    return 0


def main(settings: AgentSettings, metrics_listen: str | None = None) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    code = serve(settings, metrics_listen)
    _exit_now(code)


def _exit_now(code: int) -> None:
    """Exit without waiting longer for threads still running (named in a warning). Python's
    exit would join every worker thread of the gRPC pool, so one call stuck past the drain
    would keep the agent alive after SIGTERM for ever; the drain has already waited."""
    deadline_s = time.monotonic() + EXIT_JOIN_S
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(max(0.0, deadline_s - time.monotonic()))
    stuck = [
        thread.name
        for thread in threading.enumerate()
        if thread is not threading.main_thread() and not thread.daemon and thread.is_alive()
    ]
    if stuck:
        logger.warning("exiting with %d thread(s) still running: %s", len(stuck), ", ".join(stuck))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
