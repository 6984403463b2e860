"""A Prometheus endpoint for a live shadow run: the figures of the live view.

A custom collector reads ShadowRun.status() at each scrape, so what Prometheus sees
is exactly what the terminal shows (no second bookkeeping to drift).
"""
from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

GAUGES = {   # status key -> (metric, help, scale)
    "vm_ns": ("tandem_vm_clock_seconds", "VM clock of the VM (the native: how far its inputs are known)", 1e-9),
    "lag_ns": ("tandem_lag_vm_seconds", "native VM time since the oldest input the analysis has not taken", 1e-9),
    "lag_wall_s": ("tandem_lag_wall_seconds", "wall time since the native passed that input", 1.0),
    "buffer_events": ("tandem_buffer_events", "inputs made by the native, not yet taken by the analysis", 1.0),
    "buffer_bytes": ("tandem_buffer_bytes", "bytes of those inputs", 1.0),
    "peak_events": ("tandem_buffer_peak_events", "the most inputs the analysis ever trailed by", 1.0),
    "peak_bytes": ("tandem_buffer_peak_bytes", "the most bytes the analysis ever trailed by", 1.0),
    "gate_overflows": ("tandem_gate_overflows", ("times QEMU's gate reached its bound on held frames "
                       "(filter-gate max-frames/max-bytes)"), 1.0),
    "yield_held_s": ("tandem_yield_held_seconds", ("wall time the analyses held still while the native was busy "
                     "(--analysis-priority yield)"), 1.0),
    "blocked_s": ("tandem_blocked_native_seconds", ("wall time the analysis's full buffer held the native "
                  "(overflow policy block)"), 1.0),
}


class _Collector(Collector):
    def __init__(self, status):
        self.status = status

    def collect(self):
        rows = self.status()
        for key, (name, doc, scale) in GAUGES.items():
            g = GaugeMetricFamily(name, doc, labels=["vm"])
            for r in rows:
                if key in r:
                    g.add_metric([r["vm"]], r[key] * scale)
            yield g
        c = CounterMetricFamily("tandem_findings", "findings reported by the analysis", labels=["vm"])
        for r in rows:
            if "findings" in r:
                c.add_metric([r["vm"]], r["findings"])
        yield c
        up = GaugeMetricFamily("tandem_vm_running", "1 while the VM runs", labels=["vm", "state"])
        for r in rows:
            up.add_metric([r["vm"], r["state"]], 1.0 if r["state"] in ("running", "recording") else 0.0)
        yield up


def serve(status, port: int = 0) -> WSGIServer:
    """Serve /metrics on 127.0.0.1:port (0: a free port) from a thread of its own until
    the server returned is shut down (its server_port: the port)."""
    reg = CollectorRegistry()
    reg.register(_Collector(status))
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    return server
