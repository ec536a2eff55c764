/* cpu.h — CPU feature detection and the kernel families it allows (REFERENCE.md §3.2).
 *
 *   avx512  x86-64 with AVX-512 F, BW, VL, DQ and VNNI, and the OS saving ZMM/opmask state (XCR0)
 *   avx2    x86-64 with AVX2, FMA and F16C, and the OS saving YMM state
 *   neon    aarch64 Advanced SIMD; the int8 GEMMs use SDOT only when `dotprod` is present and fall
 *           back to the (bit-identical) scalar reference otherwise
 *   scalar  any CPU
 *
 * VBMI (vpermb) is reported separately: a kernel may use it inside the avx512 family only after
 * checking hymt_cpu().avx512vbmi, with a plain AVX-512 variant beside it.
 *
 * `amd` (x86 vendor AuthenticAMD) lets a kernel pick what was measured faster on AMD cores only
 * (fmt_stq1_0.h: table lookup, whose 512-bit word permutes run at one per cycle on Zen 4, while an
 * Intel core with two vpdpbusd per cycle multiplies faster than any lookup can).
 *
 * AMX (amx_int8) is an accelerator inside the avx512 family, not a family: tile matrix multiplies
 * (tdpbusd/tdpbssd, 16×16×64 int8 multiply-accumulates per instruction) for batched products. It is
 * reported only when the CPU has AMX-TILE and AMX-INT8 (and VBMI), the OS saves tile state (XCR0
 * bits 17, 18) and, on Linux, grants this process the tile data state (arch_prctl
 * ARCH_REQ_XCOMP_PERM, asked for here once). Integer tile sums are exact, so AMX kernels return the
 * same bits as the format's other kernels; amx.h holds the switch. */
#ifndef HYMT_CPU_H
#define HYMT_CPU_H

#include "hymt_common.h"

#if defined(HYMT_X86)
#include <cpuid.h>
#endif
#if defined(HYMT_X86) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(HYMT_ARM64) && defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(HYMT_ARM64) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

typedef struct {
    int avx2, fma, f16c;                                          /* x86, usable by the OS */
    int avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512vbmi;
    int amx_int8;                                                 /* x86: tiles usable by this process */
    int amd;                                                      /* x86: vendor AuthenticAMD */
    int neon, dotprod;                                            /* aarch64 */
} hymt_cpu_features;

#if defined(HYMT_X86)
/* XCR0: which register states the OS saves on context switch (only valid when OSXSAVE is set). */
static uint64_t hymt_xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Linux hands the 8 KiB tile data state to a process only on request (once per process). */
static int hymt_amx_permission(void) {
#if defined(HYMT_HAVE_AMX) && defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}
#endif

static hymt_cpu_features hymt_cpu_detect(void) {
    hymt_cpu_features f;
    memset(&f, 0, sizeof f);
#if defined(HYMT_X86)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
    f.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "Auth" "enti" "cAMD" */
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    int fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return f;
    uint64_t xcr0 = hymt_xgetbv0();
    int os_ymm = (xcr0 & 0x6) == 0x6;         /* SSE + AVX state */
    int os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0; /* opmask + ZMM_Hi256 + Hi16_ZMM */
    if (!os_ymm) return f;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = (b >> 5) & 1;
    f.fma = fma;
    f.f16c = f16c;
    if (os_zmm) {
        f.avx512f = (b >> 16) & 1;
        f.avx512dq = (b >> 17) & 1;
        f.avx512bw = (b >> 30) & 1;
        f.avx512vl = (b >> 31) & 1;
        f.avx512vbmi = (c >> 1) & 1;
        f.avx512vnni = (c >> 11) & 1;
        int amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1;
        int os_tiles = (xcr0 & 0x60000) == 0x60000; /* XTILECFG + XTILEDATA */
        f.amx_int8 = amx_tile && amx_int8 && os_tiles && f.avx512vbmi && hymt_amx_permission();
    }
#elif defined(HYMT_ARM64)
    f.neon = 1; /* Advanced SIMD is mandatory on aarch64 */
#if defined(__linux__)
    unsigned long hw = getauxval(AT_HWCAP);
    f.neon = (hw & (1UL << 1)) != 0;     /* HWCAP_ASIMD */
    f.dotprod = (hw & (1UL << 20)) != 0; /* HWCAP_ASIMDDP */
#elif defined(__APPLE__)
    int v = 0;
    size_t len = sizeof v;
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, NULL, 0) == 0) f.dotprod = v != 0;
#endif
#endif
    return f;
}

/* Detected once; the process never migrates to a CPU with fewer features. */
static const hymt_cpu_features *hymt_cpu(void) {
    static hymt_cpu_features features;
    static int detected = 0;
    if (!detected) {
        features = hymt_cpu_detect();
        detected = 1;
    }
    return &features;
}

static int hymt_isa_supported(int isa) {
    const hymt_cpu_features *f = hymt_cpu();
    switch (isa) {
    case HYMT_ISA_SCALAR:
        return 1;
    case HYMT_ISA_AVX2:
        return f->avx2 && f->fma && f->f16c;
    case HYMT_ISA_AVX512:
        return f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq &&
               f->avx512vnni;
    case HYMT_ISA_NEON:
        return f->neon;
    default:
        return 0;
    }
}

static int hymt_best_isa(void) {
    if (hymt_isa_supported(HYMT_ISA_AVX512)) return HYMT_ISA_AVX512;
    if (hymt_isa_supported(HYMT_ISA_AVX2)) return HYMT_ISA_AVX2;
    if (hymt_isa_supported(HYMT_ISA_NEON)) return HYMT_ISA_NEON;
    return HYMT_ISA_SCALAR;
}

#endif /* HYMT_CPU_H */
