/* verispec's CPU attention over a tree pass: one call per layer instead of ~50 torch ops.
 *
 * Built with kernels/cpu/linear.c into one library (verispec/models/cpu_linear.py). Each query
 * row (token i, head h) has its own arithmetic, over the keys it sees in slot order: the
 * committed slots [0, first) and the local slots the mask allows. Its score with a key is
 * one FMA chain over the head dimension summed by hsum8's fixed pairs, the softmax
 * maximum is exact, the weights come from one vectorised exp, and the weighted values and
 * the weights' sum are accumulated key by key in slot order. So a row's bits depend only
 * on its own keys, in order: a tree node equals decoding its path one token at a time,
 * whatever else runs in the pass (its ancestors sit before it in slot order, as
 * sequential decoding has them).
 *
 * What the rows share is memory: the rows of one KV group (its G heads for every token of
 * the pass) read the same cached keys and values. The kernel sweeps the cache once per
 * group for all of them: scores are computed a block of eight keys at a time for every
 * row of the group (the block stays in L1), and values 64 output lanes (AVX2: 32) at a
 * time for blocks of three rows, their chains interleaved. An extra tree row then costs its
 * arithmetic, not another read of the cache. Phases (one barrier each): scores for every
 * slot, split by (group, key chunk); each row's softmax over the slots it sees, in
 * place; weighted values, split by (group, row block, lane chunk); the division.
 *
 * Layouts (float32, row-major): q (Q, H, D); k, v (Q, Hkv, D); cache_k (Hkv, cap, D);
 * cache_v (Hkv, cap, D + 1) (the last column is the runtime's column of ones, untouched);
 * mask (Q, W) bytes, 1 = attend; out (Q, H * D). D is a multiple of 8.
 */
#include "simd.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Three rows' accumulators for 64 output lanes fill 24 of AVX-512's 32 vector registers;
 * with AVX2's 16, a block takes 32 lanes. */
#ifdef __AVX512F__
enum { KEY_CHUNK = 64, ROW_BLOCK = 3, LANE_CHUNK = 64 };
#else
enum { KEY_CHUNK = 64, ROW_BLOCK = 3, LANE_CHUNK = 32 };
#endif
/* Up to this many query rows per KV group (a one-token step of SmolLM2: three), the scores
 * read the keys in address order (score8_keys). */
enum { KEY_ORDER_ROWS = 4 };

/* Eight scores at once, each hsum8 of its chain bit for bit (the same pairs added in the
 * same order): out = (hsum8(c[0]), ..., hsum8(c[7])). */
static inline __m256 hsum8x8(const __m256 c[8]) {
    __m256 s[4]; /* s[j] = (lo + hi of c[j], lo + hi of c[j + 4]) */
    for (int j = 0; j < 4; j++)
        s[j] = _mm256_add_ps(_mm256_permute2f128_ps(c[j], c[j + 4], 0x20),
                             _mm256_permute2f128_ps(c[j], c[j + 4], 0x31));
    /* (x0 + x2, x1 + x3) of each, as hsum8's movehl step */
    const __m256 t01 = _mm256_add_ps(_mm256_shuffle_ps(s[0], s[1], 0x44), _mm256_shuffle_ps(s[0], s[1], 0xEE));
    const __m256 t23 = _mm256_add_ps(_mm256_shuffle_ps(s[2], s[3], 0x44), _mm256_shuffle_ps(s[2], s[3], 0xEE));
    /* x0 + x1 of each, as hsum8's movehdup step; lanes come out as c[0..3] | c[4..7] */
    return _mm256_add_ps(_mm256_shuffle_ps(t01, t23, 0x88), _mm256_shuffle_ps(t01, t23, 0xDD));
}

/* Scores of one query with the 8 keys at k (D apart), one FMA chain each, the chains
 * interleaved (eight FMAs in flight). */
static inline __m256 score8(const float *qv, const float *k, int64_t D) {
    __m256 c[8];
    for (int j = 0; j < 8; j++) c[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
        const __m256 x = _mm256_loadu_ps(qv + d);
        for (int j = 0; j < 8; j++) c[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + j * D + d), c[j]);
    }
    return hsum8x8(c);
}

/* score8 with the chains one after another, so the keys are read in address order: the
 * same FMAs per chain in the same order, so the same bits. A one-token step is bound by
 * reading the cached keys, which this order does faster; with more rows the interleaved
 * chains win (docs/runtime.rst, "The C attention at one row"). */
static inline __m256 score8_keys(const float *qv, const float *k, int64_t D) {
    __m256 c[8];
    for (int j = 0; j < 8; j++) {
        c[j] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8)
            c[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qv + d), _mm256_loadu_ps(k + j * D + d), c[j]);
    }
    return hsum8x8(c);
}

/* The scores of blocks of 8 keys from t while they fit before t1, for the R rows of group
 * g, by score8_keys; returns the first slot left. A function of its own: inlined into the
 * score loop beside score8, GCC's code for it kept only part of the gain. */
static __attribute__((noinline)) int64_t scores_in_key_order(const float *q, const float *keys,
                                                             float *wg, int64_t padded, int64_t t,
                                                             int64_t t1, int64_t R, int64_t G,
                                                             int64_t H, int64_t g, int64_t D) {
    for (; t + 8 <= t1; t += 8)
        for (int64_t r = 0; r < R; r++)
            _mm256_storeu_ps(wg + r * padded + t, score8_keys(q + (r / G * H + g * G + r % G) * D, keys + t * D, D));
    return t;
}

static inline float score1(const float *qv, const float *k, int64_t D) {
    __m256 c = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) c = _mm256_fmadd_ps(_mm256_loadu_ps(qv + d), _mm256_loadu_ps(k + d), c);
    return hsum8(c);
}

/* Weighted values for a block of rows of one group, lanes [0, 8 * lanes) of each value
 * row from vals: every row's chain per lane in slot order, first over the committed keys
 * (each value line read once for the whole block), then over the row's own local keys.
 * Writes the undivided sums to o[b]; with `sums`, also each row's weights summed in slot
 * order. Inlined with constant rows and lanes, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void values_block(
    const float *vals, int64_t ldv, int64_t first, const float *const *wr, const uint8_t *const *mrow, int64_t W,
    float *const *o, float *sums, const int rows, const int lanes) {
    __m256 a[ROW_BLOCK][LANE_CHUNK / 8];
    float s[ROW_BLOCK];
    for (int b = 0; b < rows; b++) {
        s[b] = 0.0f;
        for (int l = 0; l < lanes; l++) a[b][l] = _mm256_setzero_ps();
    }
    for (int64_t u = 0; u < first; u++) {
        const float *vv = vals + u * ldv;
        __m256 x[LANE_CHUNK / 8];
        for (int l = 0; l < lanes; l++) x[l] = _mm256_loadu_ps(vv + 8 * l);
        for (int b = 0; b < rows; b++) {
            const float wt = wr[b][u];
            for (int l = 0; l < lanes; l++) a[b][l] = _mm256_fmadd_ps(_mm256_set1_ps(wt), x[l], a[b][l]);
            if (sums) s[b] += wt;
        }
    }
    for (int b = 0; b < rows; b++) {
        int64_t u = first;
        for (int64_t j = 0; j < W; j++)
            if (mrow[b][j]) {
                const float wt = wr[b][u++];
                for (int l = 0; l < lanes; l++)
                    a[b][l] = _mm256_fmadd_ps(_mm256_set1_ps(wt), _mm256_loadu_ps(vals + (first + j) * ldv + 8 * l), a[b][l]);
                if (sums) s[b] += wt;
            }
        for (int l = 0; l < lanes; l++) _mm256_storeu_ps(o[b] + 8 * l, a[b][l]);
        if (sums) sums[b] = s[b];
    }
}

/* Returns 0, or -1 on bad arguments or no memory. */
int vs_attend(const float *q, const float *k, const float *v, float *cache_k, float *cache_v,
              int64_t cap, int64_t Q, int64_t H, int64_t Hkv, int64_t D, int64_t start,
              const uint8_t *mask, int64_t W, float *out, int threads) {
    if (D % 8 != 0 || H % Hkv != 0 || start + Q > cap || W < Q || start + Q - W < 0) return -1;
    const int64_t G = H / Hkv, first = start + Q - W, ldv = D + 1, R = Q * G;
    write_cache(k, v, cache_k, cache_v, cap, Q, Hkv, D, start);
    const int64_t slots = start + Q, padded = (slots + 7) / 8 * 8;
    /* w: a row's scores by slot, then (in place) its weights over the keys it sees, rows
     * numbered g * R + r with r = i * G + h % G; total: their sums. */
    float *w = NULL, *total = NULL;
    if (posix_memalign((void **)&w, 64, Hkv * R * padded * 4) || posix_memalign((void **)&total, 64, Hkv * R * 4)) {
        free(w), free(total);
        return -1;
    }
    const int64_t key_chunks = (slots + KEY_CHUNK - 1) / KEY_CHUNK, blocks = (R + ROW_BLOCK - 1) / ROW_BLOCK;
    /* Lanes per value item: LANE_CHUNK, or 32 where that leaves a thread without work
     * (one token's rows on two threads: three groups, six items of 32 lanes). */
    const int64_t chunk = Hkv * blocks >= 2 * threads ? LANE_CHUNK : 32, lane_chunks = (D + chunk - 1) / chunk;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        /* Scores for every slot: a block of 8 keys for every row of the group, while the
         * block is in L1 (a software prefetch of the blocks ahead measured no gain). */
#pragma omp for schedule(static)
        for (int64_t item = 0; item < Hkv * key_chunks; item++) {
            const int64_t g = item / key_chunks, t0 = item % key_chunks * KEY_CHUNK;
            const int64_t t1 = t0 + KEY_CHUNK < slots ? t0 + KEY_CHUNK : slots;
            const float *keys = cache_k + g * cap * D;
            float *wg = w + g * R * padded;
            int64_t t = t0;
            if (R <= KEY_ORDER_ROWS) t = scores_in_key_order(q, keys, wg, padded, t, t1, R, G, H, g, D);
            for (; t + 8 <= t1; t += 8)
                for (int64_t r = 0; r < R; r++)
                    _mm256_storeu_ps(wg + r * padded + t, score8(q + (r / G * H + g * G + r % G) * D, keys + t * D, D));
            for (; t < t1; t++)
                for (int64_t r = 0; r < R; r++)
                    wg[r * padded + t] = score1(q + (r / G * H + g * G + r % G) * D, keys + t * D, D);
        }
        /* Each row's softmax over the slots it sees, compacted in place. */
#pragma omp for schedule(static)
        for (int64_t row = 0; row < Hkv * R; row++) {
            float *wr = w + row * padded;
            const int64_t i = row % R / G;
            int64_t n = first;
            for (int64_t j = 0; j < W; j++)
                if (mask[i * W + j]) wr[n++] = wr[first + j]; /* n <= first + j: in place */
            float top = -INFINITY;
            for (int64_t t = 0; t < n; t++) top = wr[t] > top ? wr[t] : top;
            for (int64_t t = n; t < (n + 7) / 8 * 8; t++) wr[t] = top;
            const __m256 m = _mm256_set1_ps(top);
            for (int64_t t = 0; t < n; t += 8) _mm256_storeu_ps(wr + t, exp8(_mm256_sub_ps(_mm256_loadu_ps(wr + t), m)));
        }
        /* Weighted values (undivided) and the weights' sums. */
#pragma omp for schedule(static)
        for (int64_t item = 0; item < Hkv * blocks * lane_chunks; item++) {
            const int64_t g = item / (blocks * lane_chunks), r0 = item / lane_chunks % blocks * ROW_BLOCK;
            const int64_t d0 = item % lane_chunks * chunk, rows = R - r0 < ROW_BLOCK ? R - r0 : ROW_BLOCK;
            const int lanes = (int)((D - d0 < chunk ? D - d0 : chunk) / 8);
            const float *vals = cache_v + g * cap * ldv + d0, *wr[ROW_BLOCK];
            const uint8_t *mrow[ROW_BLOCK];
            float *o[ROW_BLOCK];
            for (int64_t b = 0; b < rows; b++) {
                const int64_t r = r0 + b, i = r / G, h = g * G + r % G;
                wr[b] = w + (g * R + r) * padded, mrow[b] = mask + i * W, o[b] = out + (i * H + h) * D + d0;
            }
            float *sums = d0 == 0 ? total + g * R + r0 : NULL;
            if (lanes == 4 && rows == 3) values_block(vals, ldv, first, wr, mrow, W, o, sums, 3, 4);
            else if (lanes == 4 && rows == 2) values_block(vals, ldv, first, wr, mrow, W, o, sums, 2, 4);
            else if (lanes == 4 && rows == 1) values_block(vals, ldv, first, wr, mrow, W, o, sums, 1, 4);
#ifdef __AVX512F__
            else if (lanes == 8 && rows == 3) values_block(vals, ldv, first, wr, mrow, W, o, sums, 3, 8);
            else if (lanes == 8 && rows == 2) values_block(vals, ldv, first, wr, mrow, W, o, sums, 2, 8);
            else if (lanes == 8 && rows == 1) values_block(vals, ldv, first, wr, mrow, W, o, sums, 1, 8);
#endif
            else values_block(vals, ldv, first, wr, mrow, W, o, sums, (int)rows, lanes);
        }
        /* The division by the sums. */
#pragma omp for schedule(static)
        for (int64_t row = 0; row < Q * H; row++) {
            const int64_t i = row / H, h = row % H, g = h / G;
            const __m256 inv = _mm256_set1_ps(total[g * R + i * G + h % G]);
            float *o = out + row * D;
            for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(o + d), inv));
        }
    }
    free(w), free(total);
    return 0;
}
