# cython: language_level=3
"""Thin wrappers over the C kernels (formats.h, matmul.h, vec.h, bench.h).

Every wrapper checks dtypes, shapes, contiguity and byte lengths against the tensor format before any
pointer is taken, raising ``KernelError`` (REFERENCE.md §2.7, §3.3 messages), then runs the C code
without the GIL. ``hymt.quant`` and ``hymt.kernels`` are the public faces of this module.
"""

from cpython.pycapsule cimport PyCapsule_New
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc

from hymt._kernels.mm_api cimport HYMT_MM_API_CAPSULE, hymt_format, hymt_mm_api

from hymt.errors import KernelError

cdef extern from "formats.h" nogil:
    ctypedef struct hymt_format_entry:
        int type_id
        const hymt_format *format
    const hymt_format_entry *hymt_formats
    int HYMT_FORMAT_COUNT
    const hymt_format *hymt_format_by_name(const char *name)
    int hymt_active_isa
    int HYMT_ISA_SCALAR, HYMT_ISA_AVX2, HYMT_ISA_AVX512, HYMT_ISA_NEON

cdef extern from "act_q8g.h" nogil:
    ctypedef struct hymt_q8g:
        signed char qs[256]
        short bsums[16]
        float d
        int sum
    void hymt_quantize_group_q8g(const float *x, hymt_q8g *g)

cdef extern from "cpu.h" nogil:
    ctypedef struct hymt_cpu_features:
        int avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512vbmi, amx_int8, neon
        int dotprod, amd
    const hymt_cpu_features *hymt_cpu()
    int hymt_isa_supported(int isa)
    int hymt_best_isa()

cdef extern from "vec.h" nogil:
    float hymt_dot_f32(const float *a, const float *b, int64_t n)
    float hymt_dot_f32_scalar(const float *a, const float *b, int64_t n)
    void hymt_silu_mul_f32_isa(int isa, float *g, const float *u, int64_t n)

cdef extern from "matmul.h" nogil:
    int hymt_num_threads
    int hymt_matmul(const hymt_format *f, const uint8_t *w, int64_t rows, int64_t cols, const float *x,
                    int64_t n, float *y, int float_path)
    int hymt_matmul_qkv(const hymt_format *fq, const uint8_t *wq, int64_t rq, const hymt_format *fk,
                        const uint8_t *wk, int64_t rk, const hymt_format *fv, const uint8_t *wv, int64_t rv,
                        int64_t cols, const float *x, int64_t n, float *yq, float *yk, float *yv,
                        int float_path)
    int hymt_matmul_gate_up_silu(const hymt_format *fg, const uint8_t *wg, const hymt_format *fu,
                                 const uint8_t *wu, int64_t F, int64_t cols, const float *x, int64_t n,
                                 float *y, int float_path)

cdef extern from "bench.h" nogil:
    double hymt_now()
    double hymt_bench_read(const uint8_t *buf, size_t nbytes, int reps, int nt, uint64_t *sink)
    double hymt_bench_int8_peak(int64_t iters, int nt, int64_t *macs, uint64_t *sink)
    double hymt_bench_amx_peak(int64_t iters, int nt, int64_t *macs, uint64_t *sink)

cdef extern from "amx.h" nogil:
    int hymt_amx_enabled

# ISA family names, indexed by enum hymt_isa.
ISA_NAMES = ("scalar", "avx2", "avx512", "neon")
# Families in order of preference (what an error message lists as supported).
_PREFERENCE = ("avx512", "avx2", "neon", "scalar")


# ---- ISA and threads -------------------------------------------------------------------------------

def isa_supported(str name):
    """True when this CPU (and OS) can run the kernel family ``name``."""
    if name not in ISA_NAMES:
        return False
    return hymt_isa_supported(ISA_NAMES.index(name)) != 0


def supported_isas():
    """The families this CPU runs, best first."""
    return [name for name in _PREFERENCE if isa_supported(name)]


def best_isa():
    return ISA_NAMES[hymt_best_isa()]


def set_isa(str name):
    """Make ``name`` the active family (the caller has checked it is supported)."""
    if not isa_supported(name):
        raise KernelError(f"kernel family {name} is not supported on this CPU "
                          f"(supported: {', '.join(supported_isas())})")
    global hymt_active_isa
    hymt_active_isa = ISA_NAMES.index(name)


def get_isa():
    return ISA_NAMES[hymt_active_isa]


def cpu_features():
    """The detected CPU features (dict of name -> bool)."""
    cdef const hymt_cpu_features *f = hymt_cpu()
    return {
        "avx2": bool(f.avx2), "fma": bool(f.fma), "f16c": bool(f.f16c), "avx512f": bool(f.avx512f),
        "avx512bw": bool(f.avx512bw), "avx512vl": bool(f.avx512vl), "avx512dq": bool(f.avx512dq),
        "avx512vnni": bool(f.avx512vnni), "avx512vbmi": bool(f.avx512vbmi), "neon": bool(f.neon),
        "dotprod": bool(f.dotprod), "amx_int8": bool(f.amx_int8), "amd": bool(f.amd),
    }


def set_amx(bint enabled):
    """Allow (True) or forbid the AMX tile kernels; they run only where cpu_features()["amx_int8"]."""
    global hymt_amx_enabled
    hymt_amx_enabled = 1 if enabled and hymt_cpu().amx_int8 else 0


def get_amx():
    return hymt_amx_enabled != 0


cdef int _detected_vbmi = -1


def _allow_vbmi(bint allowed):
    """Tests: with False, the avx512 kernels that can use VBMI (vpermb) run their plain AVX-512BW variants
    (what an AVX-512 CPU without VBMI runs); True restores the detected feature. Returns the previous value."""
    cdef hymt_cpu_features *f = <hymt_cpu_features *>hymt_cpu()
    global _detected_vbmi
    if _detected_vbmi < 0:
        _detected_vbmi = f.avx512vbmi
    previous = bool(f.avx512vbmi)
    f.avx512vbmi = _detected_vbmi if allowed else 0
    return previous


cdef int _detected_amd = -1


def _as_amd(bint amd):
    """Tests: with True, kernels that run only on AMD cores (the STQ1_0 table lookup, the Q4_K GEMV) run
    here too, so any VBMI machine tests them; False restores the detected vendor. Returns the previous
    value."""
    cdef hymt_cpu_features *f = <hymt_cpu_features *>hymt_cpu()
    global _detected_amd
    if _detected_amd < 0:
        _detected_amd = f.amd
    previous = bool(f.amd)
    f.amd = 1 if amd else _detected_amd
    return previous


def set_num_threads(int n):
    if n < 1:
        raise KernelError(f"thread count must be at least 1, got {n}")
    global hymt_num_threads
    hymt_num_threads = n


def get_num_threads():
    return hymt_num_threads


# ---- formats ---------------------------------------------------------------------------------------

def formats():
    """Registered formats: list of (name, type_id, block_len, block_bytes, has_int8_path)."""
    out = []
    for i in range(HYMT_FORMAT_COUNT):
        f = hymt_formats[i].format
        out.append((f.name.decode(), hymt_formats[i].type_id, f.block_len, f.block_bytes, f.prepare != NULL))
    return out


cdef const hymt_format *_format(str dtype, str name=None) except NULL:
    cdef const hymt_format *f = hymt_format_by_name(dtype.encode())
    if f == NULL:
        prefix = f"{name}: " if name else ""
        raise KernelError(f"{prefix}unsupported tensor type {dtype}")
    return f


def decode(str dtype, const uint8_t[::1] raw, float[::1] out):
    """Decode whole blocks of ``raw`` into ``out`` (REFERENCE.md §2.7 checks)."""
    cdef const hymt_format *f = _format(dtype)
    cdef int64_t count = out.shape[0]
    if count % f.block_len != 0:
        raise KernelError(f"partial {dtype} output block")
    cdef int64_t nblocks = count // f.block_len
    if raw.shape[0] != nblocks * f.block_bytes:
        raise KernelError(f"wrong {dtype} byte count")
    if nblocks == 0:
        return
    with nogil:
        f.decode(&raw[0], &out[0], nblocks)


def decode_rows(str dtype, str name, const uint8_t[::1] raw, int64_t rows, int64_t cols,
                const int64_t[::1] indices, float[:, ::1] out):
    """out[i] = decoded row indices[i] of a [cols, rows] tensor."""
    cdef const hymt_format *f = _format(dtype, name)
    _check_matrix(f, dtype, name, raw, rows, cols)
    if out.shape[0] != indices.shape[0] or out.shape[1] != cols:
        raise KernelError(f"{name}: invalid output array")
    cdef int64_t i, r
    for i in range(indices.shape[0]):
        r = indices[i]
        if r < 0 or r >= rows:
            raise KernelError(f"{name}: row {r} out of range")
    cdef int64_t row_bytes = cols // f.block_len * f.block_bytes
    cdef int64_t nblocks = cols // f.block_len
    if indices.shape[0] == 0 or cols == 0:
        return
    with nogil:
        for i in range(indices.shape[0]):
            f.decode(&raw[indices[i] * row_bytes], &out[i, 0], nblocks)


# ---- matrix products -------------------------------------------------------------------------------

cdef int _check_matrix(const hymt_format *f, str dtype, str name, const uint8_t[::1] raw, int64_t rows,
                       int64_t cols) except -1:
    if rows < 1 or cols < 1:
        raise KernelError(f"{name} is not a matrix")
    if cols % f.block_len != 0:
        raise KernelError(f"tensor {name} has a partial quantization block in its row")
    # Divide instead of multiplying: dims from a bad caller must not overflow into a passing check.
    if cols // f.block_len > raw.shape[0]:
        raise KernelError(f"{name}: wrong {dtype} byte count")
    cdef int64_t row_bytes = cols // f.block_len * f.block_bytes
    if raw.shape[0] % row_bytes != 0 or raw.shape[0] // row_bytes != rows:
        raise KernelError(f"{name}: wrong {dtype} byte count")
    return 0


cdef int _check_out(str name, float[:, ::1] out, int64_t n, int64_t rows) except -1:
    if out.shape[0] != n or out.shape[1] != rows:
        raise KernelError(f"{name}: invalid output array")
    return 0


def matmul(str dtype, str name, const uint8_t[::1] raw, int64_t rows, int64_t cols, const float[:, ::1] x,
           float[:, ::1] out, bint float_path=False):
    """out [n, rows] = x [n, cols] · Wᵀ for a packed [cols, rows] weight."""
    cdef const hymt_format *f = _format(dtype, name)
    _check_matrix(f, dtype, name, raw, rows, cols)
    if x.shape[1] != cols:
        raise KernelError(f"{name}: invalid activation shape")
    cdef int64_t n = x.shape[0]
    _check_out(name, out, n, rows)
    if n == 0:
        return
    cdef int status
    with nogil:
        status = hymt_matmul(f, &raw[0], rows, cols, &x[0, 0], n, &out[0, 0], float_path)
    if status != 0:
        raise MemoryError("kernel scratch allocation failed")


def qkv(tuple weights, const float[:, ::1] x, float[:, ::1] yq, float[:, ::1] yk, float[:, ::1] yv,
        bint float_path=False):
    """Three products sharing x; weights = ((dtype, name, raw, rows, cols) × 3)."""
    cdef const hymt_format *fs[3]
    cdef int64_t rs[3]
    cdef int64_t cols = -1
    cdef int k
    for k in range(3):
        dtype, name, raw, rows, wcols = weights[k]
        if rows < 1 or wcols < 1 or (cols >= 0 and wcols != cols):
            raise KernelError("query, key and value must be matrices that share an input width")
        fs[k] = _format(dtype, name)
        _check_matrix(fs[k], dtype, name, raw, rows, wcols)
        rs[k] = rows
        cols = wcols
    cdef const uint8_t[::1] wq = weights[0][2]
    cdef const uint8_t[::1] wk = weights[1][2]
    cdef const uint8_t[::1] wv = weights[2][2]
    if x.shape[1] != cols:
        raise KernelError("invalid activation shape for qkv")
    cdef int64_t n = x.shape[0]
    _check_out("qkv", yq, n, rs[0])
    _check_out("qkv", yk, n, rs[1])
    _check_out("qkv", yv, n, rs[2])
    if n == 0:
        return
    cdef int status
    with nogil:
        status = hymt_matmul_qkv(fs[0], &wq[0], rs[0], fs[1], &wk[0], rs[1], fs[2], &wv[0], rs[2], cols,
                                 &x[0, 0], n, &yq[0, 0], &yk[0, 0], &yv[0, 0], float_path)
    if status != 0:
        raise MemoryError("kernel scratch allocation failed")


def gate_up_silu(tuple gate, tuple up, const float[:, ::1] x, float[:, ::1] out, bint float_path=False):
    """out [n, F] = silu(x · Wgateᵀ) × (x · Wupᵀ); gate/up = (dtype, name, raw, rows, cols)."""
    gdtype, gname, graw, grows, gcols = gate
    udtype, uname, uraw, urows, ucols = up
    if grows != urows or gcols != ucols or grows < 1 or gcols < 1:
        raise KernelError("gate and up shape mismatch")
    cdef const hymt_format *fg = _format(gdtype, gname)
    cdef const hymt_format *fu = _format(udtype, uname)
    cdef const uint8_t[::1] wg = graw
    cdef const uint8_t[::1] wu = uraw
    _check_matrix(fg, gdtype, gname, wg, grows, gcols)
    _check_matrix(fu, udtype, uname, wu, urows, ucols)
    cdef int64_t F = grows, cols = gcols
    if x.shape[1] != cols:
        raise KernelError("invalid activation shape for gate_up_silu")
    cdef int64_t n = x.shape[0]
    _check_out("gate_up_silu", out, n, F)
    if n == 0:
        return
    cdef int status
    with nogil:
        status = hymt_matmul_gate_up_silu(fg, &wg[0], fu, &wu[0], F, cols, &x[0, 0], n, &out[0, 0], float_path)
    if status != 0:
        raise MemoryError("kernel scratch allocation failed")


def quantize_q8g(const float[::1] x, signed char[:, ::1] qs, short[:, ::1] bsums, float[::1] d,
                 int[::1] sums):
    """The §3.4 int8 activation groups of x (len a multiple of 256): qs [G, 256], bsums [G, 16], d [G],
    sums [G] — exactly what the int8 GEMMs consume."""
    cdef int64_t groups = x.shape[0] // 256
    if x.shape[0] % 256 != 0:
        raise KernelError("activation length must be a multiple of 256")
    if qs.shape[0] != groups or qs.shape[1] != 256 or bsums.shape[0] != groups or bsums.shape[1] != 16 \
            or d.shape[0] != groups or sums.shape[0] != groups:
        raise KernelError("quantize_q8g: invalid output arrays")
    cdef hymt_q8g g
    cdef int64_t b
    cdef int i
    for b in range(groups):
        hymt_quantize_group_q8g(&x[256 * b], &g)
        for i in range(256):
            qs[b, i] = g.qs[i]
        for i in range(16):
            bsums[b, i] = g.bsums[i]
        d[b] = g.d
        sums[b] = g.sum


# ---- vectors and benchmarks ------------------------------------------------------------------------

def dot(const float[::1] a, const float[::1] b):
    """float32 dot product with the active ISA's kernel."""
    if a.shape[0] != b.shape[0]:
        raise KernelError(f"dot: length mismatch ({a.shape[0]} and {b.shape[0]})")
    cdef float r = 0.0
    if a.shape[0] == 0:
        return 0.0
    with nogil:
        r = hymt_dot_f32(&a[0], &b[0], a.shape[0])
    return r


def silu_mul(float[::1] g, const float[::1] u):
    """g ← silu(g) × u in place with the active ISA's variant (the FFN gate of gate_up_silu)."""
    if g.shape[0] != u.shape[0]:
        raise KernelError(f"silu_mul: length mismatch ({g.shape[0]} and {u.shape[0]})")
    if g.shape[0] == 0:
        return
    with nogil:
        hymt_silu_mul_f32_isa(hymt_active_isa, &g[0], &u[0], g.shape[0])


def bench_read(const uint8_t[::1] buf, int reps, int threads):
    """Seconds for ``reps`` streaming passes over ``buf`` on ``threads`` threads (bytes read = reps·len)."""
    cdef uint64_t sink = 0
    cdef double seconds
    with nogil:
        seconds = hymt_bench_read(&buf[0], buf.shape[0], reps, threads, &sink)
    return seconds


def bench_int8_peak(int64_t iters, int threads):
    """(seconds, multiply-accumulates) of the register-only int8 dot loop on ``threads`` threads."""
    cdef uint64_t sink = 0
    cdef int64_t macs = 0
    cdef double seconds
    with nogil:
        seconds = hymt_bench_int8_peak(iters, threads, &macs, &sink)
    return seconds, macs


def bench_amx_peak(int64_t iters, int threads):
    """(seconds, multiply-accumulates) of the register-only AMX tdpbusd loop; (None, 0) without AMX."""
    cdef uint64_t sink = 0
    cdef int64_t macs = 0
    cdef double seconds
    with nogil:
        seconds = hymt_bench_amx_peak(iters, threads, &macs, &sink)
    return (None, 0) if seconds < 0 else (seconds, macs)


def bench_matmul(list weights, const float[::1] x, int64_t n, float[::1] out, int64_t start, int64_t calls,
                 bint float_path=False):
    """Run ``calls`` products cycling through ``weights`` = [(dtype, raw, rows, cols)] from index ``start``,
    timed in C with no Python between calls (the kernels plus the driver). Weight i reads x as [n, cols_i];
    ``x`` and ``out`` hold at least n × max(cols) and n × max(rows) floats. Returns (seconds per weight,
    calls per weight, fastest call per weight) as lists."""
    cdef int64_t count = len(weights)
    if count == 0 or n < 1:
        raise KernelError("bench_matmul: nothing to run")
    cdef const hymt_format **fmts = <const hymt_format **>malloc(count * sizeof(void *))
    cdef const uint8_t **ptrs = <const uint8_t **>malloc(count * sizeof(void *))
    cdef int64_t *rows = <int64_t *>malloc(count * sizeof(int64_t))
    cdef int64_t *colss = <int64_t *>malloc(count * sizeof(int64_t))
    cdef double *seconds = <double *>malloc(count * sizeof(double))
    cdef double *fastest = <double *>malloc(count * sizeof(double))
    cdef int64_t *done = <int64_t *>malloc(count * sizeof(int64_t))
    cdef const uint8_t[::1] raw
    cdef int64_t i, k
    cdef double t0, dt
    cdef int status = 0
    try:
        if fmts == NULL or ptrs == NULL or rows == NULL or colss == NULL or seconds == NULL or done == NULL \
                or fastest == NULL:
            raise MemoryError()
        for i in range(count):
            dtype, raw, r, c = weights[i]
            fmts[i] = _format(dtype)
            _check_matrix(fmts[i], dtype, "bench", raw, r, c)
            if c * n > x.shape[0] or r * n > out.shape[0]:
                raise KernelError("bench_matmul: x or out too small")
            ptrs[i] = &raw[0]
            rows[i] = r
            colss[i] = c
            seconds[i] = 0.0
            fastest[i] = 1e300
            done[i] = 0
        with nogil:
            for k in range(start, start + calls):
                i = k % count
                t0 = hymt_now()
                status |= hymt_matmul(fmts[i], ptrs[i], rows[i], colss[i], &x[0], n, &out[0], float_path)
                dt = hymt_now() - t0
                seconds[i] += dt
                fastest[i] = dt if dt < fastest[i] else fastest[i]
                done[i] += 1
        if status != 0:
            raise MemoryError("kernel scratch allocation failed")
        return ([seconds[i] for i in range(count)], [done[i] for i in range(count)],
                [fastest[i] for i in range(count)])
    finally:
        free(fmts)
        free(ptrs)
        free(rows)
        free(colss)
        free(seconds)
        free(fastest)
        free(done)


# ---- entry points for other extension modules (mm_api.h) -------------------------------------------

cdef hymt_mm_api _mm_api
_mm_api.format_by_name = hymt_format_by_name
_mm_api.matmul = hymt_matmul
_mm_api.qkv = hymt_matmul_qkv
_mm_api.gate_up_silu = hymt_matmul_gate_up_silu
_mm_api.isa = &hymt_active_isa


def mm_api():
    """The product entry points (an ``hymt_mm_api`` table) as a PyCapsule named HYMT_MM_API_CAPSULE."""
    return PyCapsule_New(&_mm_api, HYMT_MM_API_CAPSULE, NULL)


# The best family until hymt.kernels applies HYMT_ISA.
hymt_active_isa = hymt_best_isa()
