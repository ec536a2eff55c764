/* amx.h — AMX tiles for the batched int8 kernels of the avx512 family (cpu.h: amx_int8).
 *
 * A tile multiply tdpbusd/tdpbssd/tdpbsud C += A·B takes A as [M ≤ 16 rows][K ≤ 64 bytes], B as
 * [K/4 rows][N·4 bytes] ("VNNI" order: four consecutive k of one column per dword) and adds exact int32
 * sums into C [M][N ≤ 16] — 16×16×64 multiply-accumulates per instruction, about 7× what vpdpbusd does
 * per cycle on the same core. Exact integer sums mean an AMX kernel returns the same bits as the
 * format's vpdpbusd kernel whenever it forms the same per-block integer sums and then runs the same
 * float epilogue, so batch and thread invariance hold across the two.
 *
 * Tile registers and their configuration are per-thread state: every kernel that uses tiles loads its
 * configuration inside the worker thread (hymt_amx_configure) and releases the tiles before returning
 * (hymt_amx_release), so the OS need not save 8 KiB of tile data for idle threads. */
#ifndef HYMT_AMX_H
#define HYMT_AMX_H

#include "hymt_common.h"
#include "cpu.h"

/* Set by the Cython layer at import (the CPU has AMX and HYMT_AMX does not say 0) and by
 * hymt.kernels.use_amx() in tests; kernels test hymt_amx_active() before entering a tile path. */
static int hymt_amx_enabled __attribute__((unused)) = 0;

static inline int hymt_amx_active(void) {
    const hymt_cpu_features *f = hymt_cpu(); /* tests may switch VBMI off, which tile kernels use too */
    return hymt_amx_enabled && hymt_active_isa == HYMT_ISA_AVX512 && f->amx_int8 && f->avx512vbmi;
}

/* The 64-byte LDTILECFG operand (palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of tile t */
    uint8_t rows[16];   /* rows of tile t */
} hymt_amx_config;

#if defined(HYMT_HAVE_AMX)
/* Configure tiles 0..7 of the calling thread: tile t has rows[t] rows of colsb[t] bytes. */
HYMT_TARGET_AMX static inline void hymt_amx_configure(const uint8_t rows[8], const uint16_t colsb[8]) {
    hymt_amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = rows[t];
        cfg.colsb[t] = colsb[t];
    }
    _tile_loadconfig(&cfg);
}

HYMT_TARGET_AMX static inline void hymt_amx_release(void) { _tile_release(); }

/* Tokens of an n-token call that the token-as-A kernels (lowbit_amx.h, the Q4_K tiles) tile-load in place:
 * all of them below 32, else those of whole 16-token tiles (the rest go through a zero-padded copy). */
static inline int64_t hymt_amx_tokens_in_place(int64_t n) { return n < 32 ? n : n / 16 * 16; }

/* The tile layout of those kernels: token tile 0 sums into C tiles 0, 1 from A tile 4, token tile 1 into
 * 2, 3 from A tile 5, B operands 6, 7 of 16 rows; every row 64 bytes. Below 32 tokens each token tile's A
 * and C tiles have only its live rows: a product costs less with fewer A rows and the C stores and A loads
 * move only live rows (STQ1_0 from DRAM, 2 threads, against 16-row tiles: 0.79-0.84x the time at n = 2..8,
 * 0.85x at 17-20, 0.93x at 29). LDTILECFG rejects 0 rows with 64-byte rows, so an unused second token
 * tile gets the first one's rows. */
HYMT_TARGET_AMX static inline void hymt_amx_configure_tokens(int64_t n) {
    const uint8_t r0 = (uint8_t)(n < 16 ? n : 16), r1 = (uint8_t)(n > 16 && n < 32 ? n - 16 : r0);
    const uint8_t rows[8] = {r0, r0, r1, r1, r0, r1, 16, 16};
    static const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    hymt_amx_configure(rows, colsb);
}

/* Register-only tdpbusd loop (the AMX ceiling of the kernel benchmark): 4 independent accumulator
 * tiles, each instruction 16×16×64 multiply-accumulates. Returns a value derived from the sums. */
HYMT_TARGET_AMX static uint64_t hymt_amx_int8_loop(int64_t iters) {
    static const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    static const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    int8_t a[16 * 64], b[16 * 64]; /* [16][64] operands */
    int32_t c[16 * 16];            /* [16][16] one accumulator, read back */
    for (int i = 0; i < 16 * 64; i++) {
        a[i] = (int8_t)(3 + (i & 7));
        b[i] = (int8_t)(-2 - (i & 3));
    }
    hymt_amx_configure(rows, colsb);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, b, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, a, 64);
    for (int64_t i = 0; i < iters; i++) {
        _tile_dpbusd(0, 4, 5);
        _tile_dpbusd(1, 4, 6);
        _tile_dpbusd(2, 7, 5);
        _tile_dpbusd(3, 7, 6);
    }
    _tile_stored(0, c, 64);
    hymt_amx_release();
    return (uint32_t)c[0];
}
#endif

#define HYMT_AMX_LOOP_MACS (4LL * 16 * 16 * 64) /* per iteration of hymt_amx_int8_loop */

#endif /* HYMT_AMX_H */
