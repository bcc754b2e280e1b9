"""How much parallel work is worth starting on this machine right now."""

from __future__ import annotations

import os


def idle_cpus() -> int:
    """CPUs not busy with other work, from the 1-minute load average (this process counts as
    one). On a machine already loaded, extra threads or processes only compete with this one
    (and with each other for memory bandwidth): working serially is then as fast, or faster."""
    cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return cpus
    return max(1, min(cpus, int(cpus - load + 1)))
