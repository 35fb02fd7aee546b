/* The LLDS term of the fused objective on CPU, row by row, each action span read twice while it is in cache
 * (searchr1_lld/kernels/__init__.py builds and loads it; searchr1_lld/algo/llds.py holds the formula and the torch
 * formulation, llds_update).
 *
 * For row b, with d = logp_old - logp_new = -neg_d, m the response mask, P = {b : every masked advantage >= 0}:
 *   gate on a span S (maximal run of m == 1):  b in P  and  (none: 1 | response: sum_{t: m} d > tau
 *                                                             | action: sum_S d > tau)
 *   w[t] = c[t] 1[gate on] 1[d[t] > 0]          c = lam, or c_answer on answer tokens (LLDS-MA)
 *   grad[t] -= w[t] inv_den                     (dL_LLDS / dlogp_new, added in place to the rest of dL / dlogp_new)
 *   L_LLDS   = inv_den sum_t w[t] d[t]
 * Pass 1 finds a row's spans and their sums (and whether a masked advantage is negative), pass 2 writes the weights
 * of the gated spans; the next row's inputs are prefetched meanwhile.
 * Built with reassociation allowed (kernels/__init__.py), so span sums are vectorised: their rounding differs from the
 * torch reference's left-to-right scatter_add by a few ulp. Per-span sums are float, batch totals double.
 *
 * out[0..7]: the LLDS metrics in the order of algo/llds.py STAT_NAMES, L_LLDS last.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { GATE_NONE = 0, GATE_RESPONSE = 1, GATE_ACTION = 2 };

typedef struct { int64_t start, end; float sum; } span_t;

/* first t' >= t with m[t'] != 0 (or T), eight mask bytes at a time */
static int64_t next_set(const uint8_t *m, int64_t t, int64_t T) {
    while (t + 8 <= T) {
        uint64_t word;
        memcpy(&word, m + t, 8);
        if (word) break;
        t += 8;
    }
    while (t < T && !m[t]) t++;
    return t;
}

/* first t' >= t with m[t'] == 0 (or T) */
static int64_t next_clear(const uint8_t *m, int64_t t, int64_t T) {
    const void *hit = memchr(m + t, 0, (size_t)(T - t));
    return hit ? (const uint8_t *)hit - m : T;
}

/* Returns 0, or -1 when the scratch space cannot be allocated (nothing is written then). */
int llds_update(int64_t B, int64_t T, const float *restrict neg_d, const uint8_t *restrict mask,
                const float *restrict adv, int adv_per_token, const uint8_t *restrict answer, int gate, float lam,
                float c_answer, float tau, float inv_den, float *restrict grad, float *restrict out) {
    span_t *spans_of_row = malloc(sizeof(span_t) * (size_t)(T / 2 + 1));  /* a row has at most ceil(T/2) spans */
    if (!spans_of_row) return -1;
    double loss = 0.0, pen_sum = 0.0, disp_sum = 0.0;
    int64_t active = 0, gated_rows = 0, p_rows = 0, gated_spans = 0, spans = 0, n_tok = 0, p_tok = 0;
    for (int64_t b = 0; b < B; b++) {
        const float *nd = neg_d + b * T;
        const uint8_t *m = mask + b * T;
        const float *a = adv_per_token ? adv + b * T : 0;
        const uint8_t *ans = answer ? answer + b * T : 0;
        float *g = grad + b * T;
        if (b + 1 < B)  /* the next row's inputs, while this one is computed (cold caches: the gain is ~2x) */
            for (int64_t t = 0; t < T; t += 16) {
                __builtin_prefetch(neg_d + (b + 1) * T + t);
                __builtin_prefetch(grad + (b + 1) * T + t);
                if (t % 64 == 0) __builtin_prefetch(mask + (b + 1) * T + t);
            }
        /* pass 1: the row's spans, their sums of d and max(d, 0), and whether a masked advantage is negative */
        int64_t n = 0, row_tok = 0;
        int negative = 0;
        float row_sum = 0.0f;
        double row_pen = 0.0;
        for (int64_t t = next_set(m, 0, T); t < T; t = next_set(m, t, T)) {
            int64_t s = t;
            t = next_clear(m, t, T);
            float span_sum = 0.0f, span_pen = 0.0f;
            int neg = 0;
            for (int64_t k = s; k < t; k++) {
                float d = -nd[k];
                span_sum += d;
                span_pen += d > 0.0f ? d : 0.0f;
            }
            if (a)
                for (int64_t k = s; k < t; k++) neg |= a[k] < 0.0f;
            spans_of_row[n].start = s;
            spans_of_row[n].end = t;
            spans_of_row[n].sum = span_sum;
            n++;
            row_tok += t - s;
            row_sum += span_sum;
            row_pen += span_pen;
            negative |= neg;
        }
        int in_p = a ? !negative : adv[b] >= 0.0f;
        int row_on = in_p && (gate != GATE_RESPONSE || row_sum > tau);
        spans += n;
        n_tok += row_tok;
        disp_sum += row_sum;
        if (in_p && row_tok > 0) { p_rows++; p_tok += row_tok; pen_sum += row_pen; }
        /* pass 2, on the gated spans (still in cache): the weights, the gradient and the loss */
        int64_t row_gated = 0;
        for (int64_t i = 0; i < n && row_on; i++) {
            if (gate == GATE_ACTION && !(spans_of_row[i].sum > tau)) continue;
            row_gated++;
            float span_loss = 0.0f;
            int span_active = 0;
            for (int64_t k = spans_of_row[i].start; k < spans_of_row[i].end; k++) {
                float d = -nd[k];
                float c = (ans && ans[k]) ? c_answer : lam;
                float w = d > 0.0f ? c : 0.0f;
                g[k] -= w * inv_den;
                span_loss += w * d;
                span_active += w != 0.0f;
            }
            loss += span_loss;
            active += span_active;
        }
        gated_spans += row_gated;
        gated_rows += row_gated > 0;
    }
    free(spans_of_row);
    /* in the order of algo/llds.py STAT_NAMES */
    out[0] = (float)((double)active / (double)(n_tok > 0 ? n_tok : 1));
    out[1] = (float)gated_rows;
    out[2] = (float)p_rows;
    out[3] = (float)gated_spans;
    out[4] = (float)spans;
    out[5] = (float)(pen_sum / (double)(p_tok > 0 ? p_tok : 1));
    out[6] = (float)(disp_sum / (double)(n_tok > 0 ? n_tok : 1));
    out[7] = (float)(loss * inv_den);
    return 0;
}
