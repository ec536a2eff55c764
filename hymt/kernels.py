"""Kernel family (ISA) selection, thread count and the float32 ``dot`` (REFERENCE.md §3.2, §3.3, §10.5).

The family is chosen once at import: the best one this CPU supports, or ``HYMT_ISA``. An unknown value
or a family the CPU cannot run raises ``KernelError`` naming the supported families — the kernels are
never entered with instructions the CPU lacks. Tests may switch between supported families in-process
with :func:`use_isa`.

AMX tiles (``cpu_features()["amx_int8"]``) are an accelerator inside the ``avx512`` family for batched
products, on by default where the CPU and OS allow them; ``HYMT_AMX=0`` turns them off (``HYMT_AMX=1``
on a CPU without them is an error), and tests switch with :func:`use_amx`. Tile kernels return the same
bits as the vector kernels.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator

import numpy as np

from hymt._kernels import quant as _quant
from hymt.errors import KernelError

FAMILIES = ("avx512", "avx2", "neon", "scalar")
SYSFS_CPU = "/sys/devices/system/cpu"
# More compute threads than this cannot help and break: on a 2-core machine 8192 OpenMP threads stalled a
# generation for minutes, 32768 made libgomp abort the process, 100000 crashed a server worker (SIGSEGV).
MAX_THREADS = 1024


def supported_isas() -> list[str]:
    """Families this CPU and OS can run, best first."""
    return list(_quant.supported_isas())


def _choose_isa() -> str:
    value = os.environ.get("HYMT_ISA", "").strip()
    supported = supported_isas()
    if not value:
        return supported[0]
    if value not in FAMILIES:
        raise KernelError(
            f"unknown HYMT_ISA value {value!r}: expected one of {', '.join(FAMILIES)}; "
            f"this CPU supports {', '.join(supported)}"
        )
    if value not in supported:
        raise KernelError(
            f"HYMT_ISA={value} is not supported by this CPU; supported families: {', '.join(supported)}"
        )
    return value


def isa() -> str:
    """The active kernel family: ``avx512``, ``avx2``, ``neon`` or ``scalar``."""
    return str(_quant.get_isa())


def set_isa(name: str) -> None:
    """Switch the active family (tests; the engine keeps the one chosen at import)."""
    if name not in FAMILIES:
        raise KernelError(f"unknown kernel family {name!r}: expected one of {', '.join(FAMILIES)}")
    if name not in supported_isas():
        raise KernelError(
            f"kernel family {name} is not supported by this CPU; supported families: "
            f"{', '.join(supported_isas())}"
        )
    _quant.set_isa(name)


@contextlib.contextmanager
def use_isa(name: str) -> Iterator[None]:
    """Run the body with family ``name`` active, then restore the previous one."""
    previous = isa()
    set_isa(name)
    try:
        yield
    finally:
        _quant.set_isa(previous)


def cpu_features() -> dict[str, bool]:
    """Detected CPU features (``avx512vbmi`` and ``dotprod`` included, which no family requires, and
    ``amd``, the x86 vendor, which one kernel choice follows)."""
    return dict(_quant.cpu_features())


def _choose_amx() -> bool:
    value = os.environ.get("HYMT_AMX", "").strip().lower()
    available = bool(cpu_features()["amx_int8"])
    if value in ("", "auto"):
        return available
    if value in ("0", "off", "false", "no"):
        return False
    if value in ("1", "on", "true", "yes"):
        if not available:
            raise KernelError("HYMT_AMX=1 but this CPU or OS cannot run AMX tile instructions")
        return True
    raise KernelError(f"unknown HYMT_AMX value {value!r}: expected 0, 1 or auto")


def amx() -> bool:
    """Whether the AMX tile kernels may run (they do only under the ``avx512`` family)."""
    return bool(_quant.get_amx())


def set_amx(enabled: bool) -> None:
    """Allow or forbid the AMX tile kernels (tests; a CPU without AMX ignores True)."""
    _quant.set_amx(bool(enabled))


@contextlib.contextmanager
def use_amx(enabled: bool) -> Iterator[None]:
    """Run the body with the AMX tile kernels allowed or not, then restore the previous setting."""
    previous = amx()
    set_amx(enabled)
    try:
        yield
    finally:
        _quant.set_amx(previous)


def set_num_threads(n: int) -> None:
    """Threads of every later kernel call (global, not per calling thread)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise KernelError(f"thread count must be a positive integer, got {n!r}")
    if n > MAX_THREADS:
        raise KernelError(f"thread count must be at most {MAX_THREADS}, got {n}")
    _quant.set_num_threads(n)


def get_num_threads() -> int:
    return int(_quant.get_num_threads())


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """float32 dot product of two vectors of equal length (active family's kernel)."""
    va = np.ascontiguousarray(a, dtype=np.float32)
    vb = np.ascontiguousarray(b, dtype=np.float32)
    if va.ndim != 1 or vb.ndim != 1 or va.shape != vb.shape:
        raise KernelError(f"dot: expected two vectors of equal length, got shapes {va.shape} and {vb.shape}")
    return float(_quant.dot(va, vb))


# ---- default thread count (§10.5) -------------------------------------------------------------------


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def physical_cores(cpus: Iterable[int], sysfs: str = SYSFS_CPU) -> int:
    """Physical cores among logical ``cpus`` per Linux sysfs: SMT siblings once (package, core id); when
    ``cpu_capacity`` (else ``cpufreq/cpuinfo_max_freq``) differs between them, only the maximum ones.
    Falls back to the number of CPUs when the topology is unreadable."""
    cpus = sorted(set(cpus))
    if not cpus:
        return 1
    cores: dict[int, tuple[int, int]] = {}
    for cpu in cpus:
        base = f"{sysfs}/cpu{cpu}/topology"
        package, core = _read_int(f"{base}/physical_package_id"), _read_int(f"{base}/core_id")
        if package is None or core is None:
            return len(cpus)
        cores[cpu] = (package, core)
    capacities: dict[int, int | None] = {cpu: _read_int(f"{sysfs}/cpu{cpu}/cpu_capacity") for cpu in cpus}
    if any(value is None for value in capacities.values()):
        capacities = {cpu: _read_int(f"{sysfs}/cpu{cpu}/cpufreq/cpuinfo_max_freq") for cpu in cpus}
    if all(value is not None for value in capacities.values()):
        best = max(v for v in capacities.values() if v is not None)
        cpus = [cpu for cpu in cpus if capacities[cpu] == best]
    return len({cores[cpu] for cpu in cpus})


def _sysctl_int(name: str) -> int | None:
    try:
        result = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
        return int(result.stdout.strip()) if result.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def usable_physical_cores() -> int:
    """Usable physical cores (REFERENCE.md §10.5), the default thread count."""
    if hasattr(os, "sched_getaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
    else:
        cpus = list(range(os.cpu_count() or 1))
    if sys.platform == "darwin":
        for key in ("hw.perflevel0.physicalcpu", "hw.physicalcpu"):
            value = _sysctl_int(key)
            if value is not None and value > 0:
                return value
        return max(1, len(cpus))
    if sys.platform.startswith("linux"):
        return max(1, physical_cores(cpus))
    return max(1, len(cpus))


_quant.set_isa(_choose_isa())
_quant.set_amx(_choose_amx())
_quant.set_num_threads(usable_physical_cores())
