"""ISA selection, thread settings, the default thread count and the float32 dot (REFERENCE.md §3.2, §3.3,
§3.6, §10.5, §12.4)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hymt
from hymt import kernels
from hymt._kernels import quant as _quant
from hymt.errors import KernelError

REPO = Path(__file__).resolve().parents[1]
# The hymt under test (installed or built in place); -P keeps the bare source tree off sys.path.
PACKAGE_ROOT = str(Path(hymt.__file__).resolve().parents[1])


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, **env}
    return subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, env=environment, cwd=REPO
    )


# ---- ISA selection -----------------------------------------------------------------------------------------


def test_best_family_is_chosen_from_cpu_features() -> None:
    features = kernels.cpu_features()
    supported = kernels.supported_isas()
    assert supported[-1] == "scalar"
    avx512 = all(
        features[f] for f in ("avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx2", "fma", "f16c")
    )
    assert ("avx512" in supported) == avx512
    assert ("avx2" in supported) == all(features[f] for f in ("avx2", "fma", "f16c"))
    assert ("neon" in supported) == features["neon"]
    if "HYMT_ISA" not in os.environ:
        assert kernels.isa() == supported[0]
    result = run_python("import hymt.kernels as k; print(k.isa())", HYMT_ISA="")
    assert result.returncode == 0 and result.stdout.strip() == supported[0]


def test_hymt_isa_forces_each_supported_family() -> None:
    for family in kernels.supported_isas():
        result = run_python("import hymt.kernels as k; print(k.isa())", HYMT_ISA=family)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == family


def test_unsupported_or_unknown_family_is_a_clear_error() -> None:
    supported = ", ".join(kernels.supported_isas())
    unsupported = [f for f in kernels.FAMILIES if f not in kernels.supported_isas()]
    code = "import hymt.quant"
    for family in unsupported:
        result = run_python(code, HYMT_ISA=family)
        assert result.returncode != 0
        assert f"hymt.errors.KernelError: HYMT_ISA={family} is not supported by this CPU; " in result.stderr
        assert f"supported families: {supported}" in result.stderr
    result = run_python(code, HYMT_ISA="sse9")
    assert result.returncode != 0
    assert "KernelError: unknown HYMT_ISA value 'sse9'" in result.stderr and supported in result.stderr
    for family in unsupported:
        with pytest.raises(KernelError, match="not supported by this CPU"):
            kernels.set_isa(family)
    with pytest.raises(KernelError, match="unknown kernel family"):
        kernels.set_isa("avx1024")


def test_hymt_amx_switches_the_tile_kernels() -> None:
    available = kernels.cpu_features()["amx_int8"]
    code = "import hymt.kernels as k; print(k.amx())"
    assert run_python(code, HYMT_AMX="").stdout.strip() == str(available)
    assert run_python(code, HYMT_AMX="0").stdout.strip() == "False"
    forced = run_python(code, HYMT_AMX="1")
    if available:
        assert forced.stdout.strip() == "True"
    else:
        assert "KernelError: HYMT_AMX=1 but this CPU or OS cannot run AMX" in forced.stderr
    bad = run_python(code, HYMT_AMX="maybe")
    assert bad.returncode != 0 and "unknown HYMT_AMX value 'maybe'" in bad.stderr
    with kernels.use_amx(True):
        assert kernels.amx() == available  # a CPU without tiles ignores True
        with kernels.use_amx(False):
            assert not kernels.amx()
        assert kernels.amx() == available


def test_use_isa_restores_the_previous_family() -> None:
    before = kernels.isa()
    for family in kernels.supported_isas():
        with kernels.use_isa(family):
            assert kernels.isa() == family
        assert kernels.isa() == before


@pytest.mark.skipif(not kernels.cpu_features()["avx512f"], reason="needs an AVX-512 machine")
def test_avx512_machine_reports_avx512() -> None:
    if kernels.cpu_features()["avx512vnni"]:
        assert kernels.supported_isas()[0] == "avx512"


# ---- threads -----------------------------------------------------------------------------------------------


def test_thread_count_setting() -> None:
    previous = kernels.get_num_threads()
    try:
        kernels.set_num_threads(3)
        assert kernels.get_num_threads() == 3
        for bad in (0, -2, 1.5, True, "2"):
            with pytest.raises(KernelError, match="thread count must be a positive integer"):
                kernels.set_num_threads(bad)  # type: ignore[arg-type]
        # hymt.load(threads=100000) used to crash the process inside libgomp
        with pytest.raises(KernelError, match="thread count must be at most 1024"):
            kernels.set_num_threads(kernels.MAX_THREADS + 1)
        assert kernels.get_num_threads() == 3
    finally:
        kernels.set_num_threads(previous)


def test_default_thread_count_is_usable_physical_cores() -> None:
    result = run_python("import hymt.kernels as k; print(k.get_num_threads(), k.usable_physical_cores())")
    threads, cores = map(int, result.stdout.split())
    assert threads == cores >= 1
    if hasattr(os, "sched_getaffinity"):
        assert cores <= len(os.sched_getaffinity(0))


def write_cpu(
    root: Path, cpu: int, package: int, core: int, capacity: int | None = None, freq: int | None = None
) -> None:
    topology = root / f"cpu{cpu}" / "topology"
    topology.mkdir(parents=True)
    (topology / "physical_package_id").write_text(f"{package}\n")
    (topology / "core_id").write_text(f"{core}\n")
    if capacity is not None:
        (root / f"cpu{cpu}" / "cpu_capacity").write_text(f"{capacity}\n")
    if freq is not None:
        (root / f"cpu{cpu}" / "cpufreq").mkdir()
        (root / f"cpu{cpu}" / "cpufreq" / "cpuinfo_max_freq").write_text(f"{freq}\n")


def test_physical_cores_counts_smt_siblings_once(tmp_path: Path) -> None:
    # 2 packages × 2 cores × 2 threads
    for cpu in range(8):
        write_cpu(tmp_path, cpu, package=cpu // 4, core=cpu % 2)
    assert kernels.physical_cores(range(8), str(tmp_path)) == 4
    assert kernels.physical_cores([0, 2], str(tmp_path)) == 1  # siblings of one core
    assert kernels.physical_cores([0, 1, 4], str(tmp_path)) == 3


def test_physical_cores_keeps_only_the_biggest_cores(tmp_path: Path) -> None:
    # RK3588: 4 × A55 (capacity 414) + 4 × A76 (1024) -> 4
    for cpu in range(8):
        write_cpu(tmp_path, cpu, package=0, core=cpu, capacity=414 if cpu < 4 else 1024)
    assert kernels.physical_cores(range(8), str(tmp_path)) == 4
    assert kernels.physical_cores(range(4), str(tmp_path)) == 4  # only little cores usable


def test_physical_cores_falls_back_to_max_frequency(tmp_path: Path) -> None:
    for cpu in range(6):
        write_cpu(tmp_path, cpu, package=0, core=cpu, freq=1800000 if cpu < 2 else 2400000)
    assert kernels.physical_cores(range(6), str(tmp_path)) == 4
    # equal values everywhere: every core counts
    other = tmp_path / "same"
    for cpu in range(3):
        write_cpu(other, cpu, package=0, core=cpu, capacity=1024, freq=2000000)
    assert kernels.physical_cores(range(3), str(other)) == 3


def test_physical_cores_without_topology_counts_usable_cpus(tmp_path: Path) -> None:
    assert kernels.physical_cores([0, 1, 2], str(tmp_path)) == 3


# ---- dot -----------------------------------------------------------------------------------------------------

DOT_LENGTHS = [0, 1, 3, 7, 16, 32, 127, 256, 512, 2049]


@pytest.mark.parametrize("family", kernels.supported_isas())
def test_dot_every_length_every_family(family: str) -> None:
    rng = np.random.default_rng(41)
    with kernels.use_isa(family):
        for n in DOT_LENGTHS:
            a = rng.uniform(-1, 1, n).astype(np.float32)
            b = rng.uniform(-1, 1, n).astype(np.float32)
            sequential = np.float32(0)
            for x, y in zip(a, b, strict=True):
                sequential = np.float32(sequential + x * y)
            got = kernels.dot(a, b)
            assert isinstance(got, float)
            assert abs(got - float(sequential)) <= 1e-4, (family, n)
            assert abs(got - float(a.astype(np.float64) @ b.astype(np.float64))) <= 1e-4


def test_dot_does_not_read_past_the_vectors() -> None:
    # Views ending exactly at a page boundary would fault on an over-read; values past the end are NaN.
    rng = np.random.default_rng(43)
    buf = np.full(4096, np.nan, dtype=np.float32)
    buf[:2049] = rng.uniform(-1, 1, 2049)
    for family in kernels.supported_isas():
        with kernels.use_isa(family):
            for n in DOT_LENGTHS:
                assert np.isfinite(kernels.dot(buf[:n], buf[:n]))


def test_dot_errors() -> None:
    with pytest.raises(KernelError, match="dot: expected two vectors of equal length"):
        kernels.dot(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(KernelError, match="dot: expected two vectors of equal length"):
        kernels.dot(np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32))
    assert kernels.dot([1.0, 2.0], [3.0, 4.0]) == 11.0


# ---- SiLU gate -------------------------------------------------------------------------------------------


def _silu_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(47)
    edges = [-1e30, -100.0, -88.5, -88.0, -87.0, -20.0, -1e-3, -0.0, 0.0, 1e-3, 0.5, 20.0, 87.0, 88.0, 1e30]
    g = np.concatenate([edges, rng.uniform(-30, 30, 4000), rng.standard_normal(1003)]).astype(np.float32)
    u = rng.uniform(-2, 2, g.size).astype(np.float32)
    return g, u


@pytest.mark.parametrize("family", kernels.supported_isas())
def test_silu_gate_is_the_same_bits_in_every_family_and_close_to_float64(family: str) -> None:
    g, u = _silu_inputs()
    with kernels.use_isa("scalar"):
        reference = g.copy()
        _quant.silu_mul(reference, u)
    for length in (g.size, 1, 7, 16, 17, 33):  # vector bodies and every tail shape
        got = g[:length].copy()
        with kernels.use_isa(family):
            _quant.silu_mul(got, u[:length])
        np.testing.assert_array_equal(got, reference[:length])
    g64 = g.astype(np.float64)
    with np.errstate(over="ignore"):
        exact = g64 / (1.0 + np.exp(-g64)) * u.astype(np.float64)
    # ~2 ulp of exp, then one division and one product in float32; tiny gates of hugely negative inputs
    # (where the clamp keeps e^t finite) differ only below 1e-35 in magnitude.
    np.testing.assert_allclose(reference, exact, rtol=1e-6, atol=1e-35)


def test_silu_gate_errors() -> None:
    with pytest.raises(KernelError, match="silu_mul: length mismatch"):
        _quant.silu_mul(np.zeros(3, np.float32), np.zeros(4, np.float32))


def test_roofline_probes_run() -> None:
    """The benchmark's ceilings (no timing assertions): they run and report positive times."""
    seconds = _quant.bench_read(np.ones(1 << 20, np.uint8), 2, 2)
    assert seconds > 0
    seconds, macs = _quant.bench_int8_peak(1000, 2)
    assert seconds > 0
    if kernels.isa() in ("avx512", "avx2"):
        assert macs > 0


# ---- NEON, cross-compiled and run under qemu-user --------------------------------------------------------

CROSS_CC = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")


@pytest.mark.skipif(
    platform.machine() == "aarch64" or not (CROSS_CC and QEMU and SYSROOT.is_dir()),
    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 (the NEON family cannot run natively here)",
)
def test_neon_kernels_match_scalar_under_qemu(tmp_path: Path) -> None:
    """tests/c/isa_check.c: every registered int8 GEMM under NEON (SDOT, and a core without dotprod
    falling back to scalar) vs the scalar reference bit for bit, dot lengths, F16 conversion."""
    binary = tmp_path / "isa_check"
    build = subprocess.run(
        [CROSS_CC, "-O2", "-std=c11", "-ffp-contract=off", "-fno-strict-aliasing", "-Wall",
         "-Wno-unused-function", "-fopenmp", f"-I{REPO / 'hymt' / '_kernels'}",
         str(REPO / "tests" / "c" / "isa_check.c"), "-o", str(binary), "-lm"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    for cpu, dotprod in (("max", 1), ("cortex-a53", 0)):
        result = subprocess.run(
            [QEMU, "-cpu", cpu, "-L", str(SYSROOT), str(binary), "3"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"INFO isa 3, dotprod {dotprod}" in result.stdout
        lines = result.stdout.splitlines()
        assert sum(line.startswith("OK ") for line in lines) >= 12 and not any(
            "FAIL" in line for line in lines
        )
