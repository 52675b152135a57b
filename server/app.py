"""SluiceServer: builds the grpc.aio server (interceptors, servicers, health, reflection), loads and warms
the models, and drains on shutdown: health NOT_SERVING, refuse new calls, finish in-flight ones, exit."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.metadata
import logging
import os
import sys
from pathlib import Path
from typing import cast

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc
from sluice.kserve.v2 import grpc_service_pb2_grpc as v2_grpc

from process.access_log import AccessLog
from process.limits import raise_fd_limit
from process.otlp_target import collector_target
from process.tracing import start_span_export
from server.adapters import Adapters
from server.admission.devices import DeviceGates
from server.admission.gate import AdmissionGate
from server.admission.interceptor import AdmissionInterceptor
from server.admission.tenants import Keys
from server.batching.worker import ModelWorker
from server.config import Settings
from server.frontends.engine import FrontendPool
from server.kserve.methods import SERVICE as KSERVE_SERVICE
from server.kserve.servicer import KServeServicer
from server.kserve.shm import SharedMemory
from server.methods import SERVICE, guarded_methods
from server.metrics import Metrics
from server.placement import DevicePlacement, breaker_for, place
from server.readiness import ReportingHealth, track_readiness
from server.runtimes.registry import resolve_device
from server.servicer import InferenceServicer
from server.transport.generic_only import GenericOnly
from server.transport.options import BUSY_PORT, check_free, server_options
from server.transport.reflection import enable_reflection
from server.transport.tls import is_loopback, server_credentials
from wire.metadata import READINESS_SERVICE

log = logging.getLogger(__name__)

HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
READINESS = READINESS_SERVICE  # SERVING while new work can be taken; liveness is "" and SERVICE
# The end of the grace period kept for final messages to reach slow readers (at most half the period):
# 4 s carry a final message with its timings (~140 bytes) to a reader at 100 bytes/s through a front end.
_DRAIN_FLUSH_S = 4.0
_TRACE_FLUSH_S = 2.0  # the spans still queued get this long to reach the collector as the server stops


class SluiceServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # One core is left to the event loop and gRPC: with every core in torch's thread team, the loop's
        # work stalls the whole team (measured: batch-32 MLP 7 ms alone, 20+ ms beside the loop on 2 cores).
        self.torch_threads = settings.torch_threads or max(1, (os.cpu_count() or 2) - 1)
        torch.set_num_threads(self.torch_threads)
        # The model thread hands the GIL back around every torch call and must win it back from a busy
        # event loop; CPython makes a waiting thread wait a whole switch interval (5 ms) before it may
        # ask, which on a batch-32 MLP cost more than the forward itself (bench/admission.py).
        sys.setswitchinterval(settings.switch_interval_ms / 1000)
        self.devices = [resolve_device(d) for d in settings.devices or (settings.device,)]
        self.metrics = Metrics()
        # Before any gRPC object exists: the export process starts with no gRPC thread to disturb.
        self.tracing = start_span_export(
            collector_target(settings.otlp_endpoint),  # the flag or OTEL_EXPORTER_OTLP_*, read once, here
            sampling_ratio=settings.otlp_sampling_ratio,
            service="sluice-server",
            report=self.metrics.trace_export,
        )
        # One memory breaker per device; with one device admission refuses on it directly, with several
        # each model's DeviceGates skips the devices whose breaker is open.
        named = [str(d) for d in self.devices]
        self.placements = [
            DevicePlacement(
                device,
                breaker_for(settings, device, i, len(self.devices)),
                named[i] if named.count(named[i]) == 1 else f"{named[i]}#{i}",
            )
            for i, device in enumerate(self.devices)
        ]
        self.breaker = self.placements[0].breaker
        keys = Keys.load(Path(settings.auth_keys)) if settings.auth_keys else None
        self.interceptor = AdmissionInterceptor(
            guarded_methods({}, {}),
            breaker=self.breaker if len(self.placements) == 1 else None,
            metrics=self.metrics,
            max_message_bytes=settings.max_message_bytes,
            stall_timeout_s=settings.stall_timeout_s,
            access_log=AccessLog(settings.access_log),
            keys=keys,
            settings=settings,  # each policy reads the settings it declares
            tracing=self.tracing,
        )
        self.servicer = InferenceServicer(self.metrics)
        # The Open Inference Protocol (KServe v2) over the same models, gates and metrics (server/kserve/).
        self.kserve = KServeServicer(
            self.servicer,
            ready=lambda: self.interceptor.ready and not self.interceptor.draining,
            version=_version(),
            shm=SharedMemory.of(settings, keys),
        )
        self.health = ReportingHealth(self.metrics)
        # A process at its descriptor limit spins on accept errors and every file it opens fails: the soft
        # limit goes up to the hard one, and connections are capped below it.
        self.fds = raise_fd_limit()
        self.max_connections = self.fds.connection_cap(settings.max_connections)
        self.server: grpc.aio.Server | FrontendPool
        if settings.frontends > 1:
            self.server = FrontendPool(settings, self.interceptor.intercept_service)
        else:
            options = server_options(settings, self.max_connections, share_port=False)
            self.server = grpc.aio.server(interceptors=[self.interceptor], options=options)
        # The pool takes the servicers' method handlers as a grpc.aio server does (server/frontends/); a lone
        # server takes their generic handlers only (server/transport/generic_only.py).
        handlers = cast(
            grpc.aio.Server,
            self.server if isinstance(self.server, FrontendPool) else GenericOnly(self.server),
        )
        pb_grpc.add_InferenceServiceServicer_to_server(self.servicer, handlers)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, handlers)
        v2_grpc.add_GRPCInferenceServiceServicer_to_server(self.kserve, handlers)
        if settings.reflection and not isinstance(self.server, FrontendPool):  # front ends serve their own
            enable_reflection(self.server, [SERVICE, HEALTH, KSERVE_SERVICE])
        self.workers: list[ModelWorker] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.port = 0
        self.metrics_port = 0

    async def start(self) -> None:
        """Listens at once (health NOT_SERVING), then loads and warms models, then reports SERVING."""
        await self.listen()
        await self.load()

    async def listen(self) -> None:
        """Binds the gRPC and metrics ports and starts serving health; raises ValueError naming the port
        when it cannot be bound."""
        for name in ("", SERVICE, READINESS):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{self.settings.host}:{self.settings.port}"
        check_free(self.settings.host, self.settings.port)
        tls = self.settings.tls
        if tls is None and not is_loopback(self.settings.host):
            log.warning(
                "listening on %s without TLS: any peer that reaches it can call; give --tls-cert/--tls-key",
                self.settings.host,
            )
        if isinstance(self.server, FrontendPool):
            self.port = await self.server.start()
        else:
            try:
                if tls is None:
                    self.port = self.server.add_insecure_port(address)
                else:
                    self.port = self.server.add_secure_port(address, server_credentials(tls))
            except RuntimeError as exc:  # grpc says "Failed to bind to address ..."
                raise ValueError(BUSY_PORT.format(address=address)) from exc
            await self.server.start()
        log.info("%s; at most %d client connections", self.fds.describe(), self.max_connections)
        if self.settings.metrics_port >= 0:
            try:
                token = self.settings.metrics_token_sha256
                self.metrics_port = self.metrics.serve(
                    self.settings.metrics_interface,
                    self.settings.metrics_port,
                    bytes.fromhex(token) if token else None,
                )
            except OSError as exc:
                await self.server.stop(0)
                raise ValueError(
                    f"invalid setting metrics_port: cannot listen on {self.settings.metrics_interface}:"
                    f"{self.settings.metrics_port} ({exc.strerror}); choose a free --metrics-port, 0 or -1"
                ) from exc
        print(
            f"sluice server listening on {self.settings.host}:{self.port} "
            f"(metrics http://{self.settings.metrics_interface}:{self.metrics_port}/metrics)",
            flush=True,
        )

    async def load(self) -> None:
        """Loads and warms the models on every device, then admits calls and reports SERVING."""
        self.tasks.append(asyncio.create_task(self.interceptor.watchdog.run(), name="write-watchdog"))
        prompt_check = self.interceptor.policies.prompt_check  # policies that count the prompt's tokens
        for placement in self.placements:
            await place(self.settings, placement, self.metrics, prompt_check=prompt_check)
            self.tasks += placement.tasks
            self.workers += placement.workers
        first = self.placements[0]
        self.servicer.install(
            {name: [p.batchers[name] for p in self.placements] for name in first.batchers},
            {name: [p.schedulers[name] for p in self.placements] for name in first.schedulers},
        )
        infer_gates = self._gates("Infer", [p.infer_gates for p in self.placements])
        generate_gates = self._gates("Generate", [p.generate_gates for p in self.placements])
        self.interceptor.methods = guarded_methods(infer_gates, generate_gates)
        for method, gates in (("Infer", infer_gates), ("Generate", generate_gates)):
            for name, gate in gates.items():
                self.metrics.slots.labels(name, method).set(gate.slots)
                self.metrics.queue_limit.labels(name, method).set(gate.max_waiting)
        self.servicer.adapters = await Adapters.serve(
            self.servicer, self.interceptor, self.settings, self.metrics
        )
        self.interceptor.ready = True
        readiness = track_readiness(
            self.health,
            self.placements,
            self.interceptor,
            self.metrics,
            interval_s=self.settings.probe_interval_s,
        )
        self.tasks.append(asyncio.create_task(readiness, name="readiness"))
        # Everything alive now (torch, grpc, protobuf, the weights' Python objects) lives until exit: out of
        # the collector's sight, a full collection takes under 1 ms instead of stalling every call ~115 ms
        # every 2 s at 2,400 requests/s (measured with gc.callbacks).
        gc.collect()
        gc.freeze()
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        print(
            f"sluice server ready: {', '.join(sorted(self.servicer.models))} on "
            f"{','.join(str(d) for d in self.devices)} "
            f"(torch threads {self.torch_threads})",
            flush=True,
        )

    def _gates(
        self, method: str, per_device: list[dict[str, AdmissionGate]]
    ) -> dict[str, AdmissionGate | DeviceGates]:
        """Each model's gate: its one device's, or all its devices' as one (least-loaded device first)."""
        if len(per_device) == 1:
            return dict(per_device[0])
        breakers = [p.breaker for p in self.placements]
        return {
            name: DeviceGates(f"{method} {name}", [gates[name] for gates in per_device], breakers)
            for name in per_device[0]
        }

    @property
    def failed(self) -> bool:
        """True when the server stops because a part of it died (a front end), not because it was asked."""
        return isinstance(self.server, FrontendPool) and self.server.failed

    async def drain(self) -> None:
        """SIGTERM: health NOT_SERVING first, then refuse new calls (UNAVAILABLE), let in-flight calls
        finish within the grace period, then stop the server. Health checks keep answering meanwhile."""
        grace = self.settings.grace_s
        log.warning("draining: grace %.1fs", grace)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await self.health.enter_graceful_shutdown()
        self.interceptor.draining = True
        # Streams still running before the grace period ends get a clean final message, early enough for it
        # to reach a peer that reads slowly: it waits behind what the peer's window still holds back.
        for replicas in self.servicer.schedulers.values():
            for scheduler in replicas:
                scheduler.begin_drain(grace - min(grace / 2, _DRAIN_FLUSH_S))
        gates_idle = asyncio.gather(*(gate.idle.wait() for gate in self.interceptor.gates))
        try:
            await asyncio.wait_for(gates_idle, grace)
        except TimeoutError:
            log.warning("grace period over with calls in flight; they are cancelled")
        # A slot is given back before the call's last write and its status: what is left of the grace period
        # goes to delivering them.
        await self.server.stop(max(grace - (loop.time() - started), 0.5))
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for worker in self.workers:
            worker.shutdown()
        self.tracing.shutdown(wait_s=_TRACE_FLUSH_S)


def _version() -> str:
    try:
        return importlib.metadata.version("sluice")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
