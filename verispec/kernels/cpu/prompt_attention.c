/* The attention of a prompt's causal pass (PassKind.PROMPT) in one call per layer: query
 * row i (slot start + i) attends to slots [0, start + i].
 *
 * Built with kernels/cpu/linear.c into one library (verispec/models/accelerators/blocks.py);
 * called by verispec/models/accelerators/c_attention.py (attend_prompt_cpu, the torch prompt
 * pass's attention core) and by the C layers' prompt pass (kernels/cpu/layer.c). Flash
 * attention: for each KV group and block of QB tokens (their G heads each: up to QB G query
 * rows), the cached keys are read a block of KB slots at a time, transposed once a pass so
 * that a register tile of rows times 32 slots is broadcast query values times key rows;
 * each row keeps a running maximum and sum (online softmax) and
 * accumulates its weighted values in an L1-resident buffer. No score matrix over the
 * whole prompt is formed, and each key and value block is read once for all the rows of a
 * token block.
 *
 * A row's sums run over its slots in order, in blocks that start at multiples of KB, so its
 * bits depend on its own query and the keys and values it sees only; they are not the bits
 * of the decoding kernel (kernels/cpu/attention.c, which takes the maximum over all slots
 * first): like PyTorch's fused attention it serves prefill only, which every decoding method
 * shares.
 *
 * Layouts (float32, row-major): q (Q, H, D), the softmax scale folded in; k, v (Q, Hkv, D);
 * cache_k (Hkv, cap, D); cache_v (Hkv, cap, D + 1) (the last column untouched); out
 * (Q, H * D). D a multiple of 8, at most MAX_D.
 */
#include "simd.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Rows of a register tile: R rows times 32 slots (or 32 value lanes) of accumulators, four
 * vectors loaded per step and a broadcast: 21 of AVX-512's 32 vector registers, 13 of
 * AVX2's 16. */
#ifdef __AVX512F__
enum { TILE_ROWS = 4 };
#else
enum { TILE_ROWS = 2 };
#endif
enum { QB = 16, KB = 32, MAX_D = 256, MAX_G = 16 };

/* s[r][0..KB) = q_r . key j, for R rows, from the block's keys transposed (kt: D x KB). */
static inline __attribute__((always_inline)) void scores_tile(const float *const *qr,
                                                              const float *kt, int64_t D,
                                                              float *s, const int R) {
    __m256 acc[TILE_ROWS][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m256 kv[4];
        for (int c = 0; c < 4; c++) {
            kv[c] = _mm256_load_ps(kt + d * KB + 8 * c);
            __asm__("" : "+v"(kv[c])); /* in a register: not loaded again by each FMA */
        }
        for (int r = 0; r < R; r++) {
            const __m256 b = _mm256_broadcast_ss(qr[r] + d);
            for (int c = 0; c < 4; c++) acc[r][c] = _mm256_fmadd_ps(b, kv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++) _mm256_store_ps(s + r * KB + 8 * c, acc[r][c]);
}

/* o[r][d0 .. d0 + 8 LANES) += sum over the block's n slots of p[r][j] v[j], for R rows. */
static inline __attribute__((always_inline)) void values_tile(const float *p, const float *vals,
                                                              int64_t ldv, int64_t n,
                                                              float *o, int64_t D, int64_t d0,
                                                              const int R, const int LANES) {
    __m256 acc[TILE_ROWS][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < LANES; c++) acc[r][c] = _mm256_load_ps(o + r * D + d0 + 8 * c);
    for (int64_t j = 0; j < n; j++) {
        __m256 x[4];
        for (int c = 0; c < LANES; c++) {
            x[c] = _mm256_load_ps(vals + j * ldv + d0 + 8 * c);
            __asm__("" : "+v"(x[c]));
        }
        for (int r = 0; r < R; r++) {
            const __m256 b = _mm256_broadcast_ss(p + r * KB + j);
            for (int c = 0; c < LANES; c++) acc[r][c] = _mm256_fmadd_ps(b, x[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < LANES; c++) _mm256_store_ps(o + r * D + d0 + 8 * c, acc[r][c]);
}

/* Every value lane of R rows (a tile), in chunks of 32 lanes (a last one of 8 at a time). */
static inline __attribute__((always_inline)) void values_rows(const float *p, const float *vals,
                                                              int64_t ldv, int64_t n, float *o,
                                                              int64_t D, const int R) {
    int64_t d0 = 0;
    for (; d0 + 32 <= D; d0 += 32) values_tile(p, vals, ldv, n, o, D, d0, R, 4);
    for (; d0 < D; d0 += 8) values_tile(p, vals, ldv, n, o, D, d0, R, 1);
}

/* One item: KV group g, tokens [i0, i1). kts: the group's keys transposed a block at a time
 * (block t0 / KB at kts + t0 D, D x KB); vals: its values (slots x D, aligned rows). Buffers:
 * s (rows x KB), o (rows x D), m and l (rows), all 32-byte aligned. */
static void prompt_block(const float *q, const float *kts, const float *vals, int64_t H,
                         int64_t G, int64_t D, int64_t start, int64_t g, int64_t i0, int64_t i1,
                         float *out, float *s, float *o, float *m, float *l) {
    const int64_t rows = (i1 - i0) * G, last = start + i1 - 1;
    const float *qr[QB * MAX_G];
    for (int64_t r = 0; r < rows; r++) qr[r] = q + ((i0 + r / G) * H + g * G + r % G) * D;
    memset(o, 0, (size_t)(rows * D) * 4);
    for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0.0f;
    for (int64_t t0 = 0; t0 <= last; t0 += KB) {
        const int64_t n = last + 1 - t0 < KB ? last + 1 - t0 : KB;
        const float *kt = kts + t0 * D; /* the block's keys, transposed */
        int64_t r = 0;
        for (; r + TILE_ROWS <= rows; r += TILE_ROWS) scores_tile(qr + r, kt, D, s + r * KB, TILE_ROWS);
        for (; r < rows; r++) scores_tile(qr + r, kt, D, s + r * KB, 1);
        /* Online softmax: each row's slots in this block (those it sees), its weights in s. */
        for (r = 0; r < rows; r++) {
            float *sr = s + r * KB;
            const int64_t seen = start + i0 + r / G - t0 + 1, cnt = seen < n ? seen : n;
            if (cnt <= 0) { /* a later token's slots: nothing for this row */
                memset(sr, 0, KB * 4);
                continue;
            }
            float top = m[r];
            if (cnt == KB) {
                __m256 v = _mm256_max_ps(_mm256_max_ps(_mm256_load_ps(sr), _mm256_load_ps(sr + 8)),
                                         _mm256_max_ps(_mm256_load_ps(sr + 16), _mm256_load_ps(sr + 24)));
                __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                h = _mm_max_ps(h, _mm_movehl_ps(h, h));
                h = _mm_max_ss(h, _mm_movehdup_ps(h));
                top = _mm_cvtss_f32(h) > top ? _mm_cvtss_f32(h) : top;
            } else {
                for (int64_t j = 0; j < cnt; j++) top = sr[j] > top ? sr[j] : top;
            }
            const float alpha = m[r] == -INFINITY ? 0.0f : expf(m[r] - top);
            const __m256 mx = _mm256_set1_ps(top);
            __m256 sum = _mm256_setzero_ps();
            for (int c = 0; c < 4; c++) {
                __m256 e = exp8(_mm256_sub_ps(_mm256_load_ps(sr + 8 * c), mx));
                if (cnt < KB) { /* the slots past the row's own: weight 0 */
                    const __m256i lane = _mm256_add_epi32(_mm256_set1_epi32(8 * c),
                                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                    e = _mm256_and_ps(e, _mm256_castsi256_ps(
                                             _mm256_cmpgt_epi32(_mm256_set1_epi32((int)cnt), lane)));
                }
                _mm256_store_ps(sr + 8 * c, e);
                sum = _mm256_add_ps(sum, e);
            }
            l[r] = l[r] * alpha + hsum8(sum);
            m[r] = top;
            if (alpha != 1.0f) {
                const __m256 a = _mm256_set1_ps(alpha);
                for (int64_t d = 0; d < D; d += 8)
                    _mm256_store_ps(o + r * D + d, _mm256_mul_ps(_mm256_load_ps(o + r * D + d), a));
            }
        }
        for (r = 0; r + TILE_ROWS <= rows; r += TILE_ROWS)
            values_rows(s + r * KB, vals + t0 * D, D, n, o + r * D, D, TILE_ROWS);
        for (; r < rows; r++) values_rows(s + r * KB, vals + t0 * D, D, n, o + r * D, D, 1);
    }
    for (int64_t r = 0; r < rows; r++) {
        const __m256 inv = _mm256_set1_ps(1.0f / l[r]);
        float *dst = out + ((i0 + r / G) * H + g * G + r % G) * D;
        for (int64_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_load_ps(o + r * D + d), inv));
    }
}

/* Writes k, v to slots [start, start + Q) of the caches, then out. Returns 0, or -1 on bad
 * arguments or no memory (then nothing is written). */
int vs_attend_prompt(const float *q, const float *k, const float *v, float *cache_k,
                     float *cache_v, int64_t cap, int64_t Q, int64_t H, int64_t Hkv, int64_t D,
                     int64_t start, float *out, int threads) {
    if (Q < 1 || D % 8 != 0 || D > MAX_D || Hkv < 1 || H % Hkv != 0 || H / Hkv > MAX_G ||
        start < 0 || start + Q > cap)
        return -1;
    const int64_t G = H / Hkv, ldv = D + 1, blocks = (Q + QB - 1) / QB;
    const int64_t padded = (start + Q + KB - 1) / KB * KB, chunks = padded / KB;
    /* Each group's keys transposed a block of KB slots at a time, and its values in rows
     * of D (aligned: the cache's rows of D + 1 are not); zeros past the last slot. */
    float *kts = NULL, *vps = NULL;
    if (posix_memalign((void **)&kts, 64, (size_t)(2 * Hkv * padded * D) * 4) != 0) return -1;
    vps = kts + Hkv * padded * D;
    write_cache(k, v, cache_k, cache_v, cap, Q, Hkv, D, start);
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
#pragma omp for schedule(static)
        for (int64_t item = 0; item < Hkv * chunks; item++) {
            const int64_t g = item / chunks, t0 = item % chunks * KB;
            const float *keys = cache_k + g * cap * D, *vals = cache_v + g * cap * ldv;
            float *kt = kts + (g * padded + t0) * D, *vp = vps + (g * padded + t0) * D;
            for (int64_t j = 0; j < KB; j++) {
                const int used = t0 + j < start + Q;
                for (int64_t d = 0; d < D; d++) {
                    kt[d * KB + j] = used ? keys[(t0 + j) * D + d] : 0.0f;
                    vp[j * D + d] = used ? vals[(t0 + j) * ldv + d] : 0.0f;
                }
            }
        }
        const int64_t rows = QB * G;
        float *buf = NULL;
        if (posix_memalign((void **)&buf, 64, (size_t)(rows * (KB + D + 2)) * 4) != 0) {
#pragma omp atomic write
            failed = 1;
            buf = NULL;
        }
        /* the last token blocks (the most slots) first, for an even split */
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < Hkv * blocks; item++) {
            if (buf == NULL) continue;
            const int64_t b = blocks - 1 - item / Hkv, g = item % Hkv;
            const int64_t i0 = b * QB, i1 = i0 + QB < Q ? i0 + QB : Q;
            float *s = buf, *o = s + rows * KB, *m = o + rows * D;
            prompt_block(q, kts + g * padded * D, vps + g * padded * D, H, G, D, start, g, i0,
                         i1, out, s, o, m, m + rows);
        }
        free(buf);
    }
    free(kts);
    return failed ? -1 : 0;
}
