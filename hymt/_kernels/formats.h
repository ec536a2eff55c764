/* formats.h — the registry of tensor formats the kernels implement.
 *
 * Each fmt_*.h exports one `static const hymt_format HYMT_FORMAT_<NAME>`; this file includes them and
 * lists them with their GGUF type ids (REFERENCE.md §1.7; 40 and 42 are only valid under their
 * Tencent profiles, which hymt.gguf resolves — the kernels look formats up by dtype name).
 *
 * To register a format: add its #include in the block marked "format headers" and one line in
 * hymt_formats[] below. Everything else (hymt.quant, the generic tests in tests/test_quant.py, the
 * kernel benchmark) picks it up from this table. */
#ifndef HYMT_FORMATS_H
#define HYMT_FORMATS_H

#include "hymt_common.h"

/* ---- format headers (one #include per format) ---- */
#include "fmt_f32.h"
#include "fmt_f16.h"
#include "fmt_q8_0.h"
#include "fmt_stq1_0.h"
#include "fmt_q2_0c.h"
#include "fmt_q4_k.h"
#include "fmt_q6_k.h"
/* ---- end of format headers ---- */

typedef struct {
    int type_id;
    const hymt_format *format;
} hymt_format_entry;

static const hymt_format_entry hymt_formats[] = {
    {0, &HYMT_FORMAT_F32},
    {1, &HYMT_FORMAT_F16},
    {8, &HYMT_FORMAT_Q8_0},
    {42, &HYMT_FORMAT_STQ1_0},
    {40, &HYMT_FORMAT_Q2_0C},
    {12, &HYMT_FORMAT_Q4_K},
    {14, &HYMT_FORMAT_Q6_K},
};

#define HYMT_FORMAT_COUNT ((int)(sizeof hymt_formats / sizeof hymt_formats[0]))

/* NULL when the dtype name is not registered. */
static const hymt_format *hymt_format_by_name(const char *name) {
    for (int i = 0; i < HYMT_FORMAT_COUNT; i++)
        if (strcmp(hymt_formats[i].format->name, name) == 0) return hymt_formats[i].format;
    return NULL;
}

#endif /* HYMT_FORMATS_H */
