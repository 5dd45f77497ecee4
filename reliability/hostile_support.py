"""Helpers of the hostile-input, fuzz, auth, schemathesis and cardinality scenarios: the service
helpers of rel_support, and the memory of the service process."""

from __future__ import annotations

from pathlib import Path

import psutil
from rel_support import ROOT, SHAPEWATCH, Service, free_port, make_envelope, start_service


def rss_mb(svc: Service) -> float:
    """Resident memory of the service process, in MB."""
    return psutil.Process(svc.proc.pid).memory_info().rss / 1e6


def peak_rss_mb(svc: Service) -> float:
    """Peak resident memory of the service process so far (VmHWM), in MB."""
    for line in Path(f"/proc/{svc.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e3
    return rss_mb(svc)


__all__ = ["ROOT", "SHAPEWATCH", "Service", "free_port", "make_envelope", "peak_rss_mb", "rss_mb", "start_service"]
