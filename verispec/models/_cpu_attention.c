/* verispec's CPU attention over a tree pass: one call per layer instead of ~50 torch ops.
 *
 * Built with _cpu_linear.c into one library (verispec/models/cpu_linear.py). Each query
 * row (token i, head h) is computed alone, from the keys it sees in slot order: the
 * committed slots [0, first) and the local slots the mask allows. Its score with a key is
 * one FMA chain over the head dimension, the softmax maximum is exact, the weights come
 * from one vectorised exp, and the weighted values and the weights' sum are accumulated
 * key by key in slot order. So a row's bits depend only on its own keys, in order: a tree
 * node equals decoding its path one token at a time, whatever else runs in the pass (its
 * ancestors sit before it in slot order, as sequential decoding has them).
 *
 * Layouts (float32, row-major): q (Q, H, D); k, v (Q, Hkv, D); cache_k (Hkv, cap, D);
 * cache_v (Hkv, cap, D + 1) (the last column is the runtime's column of ones, untouched);
 * mask (Q, W) bytes, 1 = attend; out (Q, H * D). D is a multiple of 8.
 */
#include "_cpu_simd.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Returns 0, or -1 on bad arguments or no memory. */
int vs_attend(const float *q, const float *k, const float *v, float *cache_k, float *cache_v,
              int64_t cap, int64_t Q, int64_t H, int64_t Hkv, int64_t D, int64_t start,
              const uint8_t *mask, int64_t W, float *out, int threads) {
    if (D % 8 != 0 || H % Hkv != 0 || start + Q > cap || W < Q || start + Q - W < 0) return -1;
    const int64_t G = H / Hkv, first = start + Q - W, ldv = D + 1;
    for (int64_t i = 0; i < Q; i++)
        for (int64_t g = 0; g < Hkv; g++) {
            memcpy(cache_k + (g * cap + start + i) * D, k + (i * Hkv + g) * D, D * 4);
            memcpy(cache_v + (g * cap + start + i) * ldv, v + (i * Hkv + g) * D, D * 4);
        }
    const int64_t slots = start + Q, padded = (slots + 7) / 8 * 8;
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        float *w = NULL;
        int32_t *seen = NULL;
        if (posix_memalign((void **)&w, 64, padded * 4) || posix_memalign((void **)&seen, 64, padded * 4)) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t row = 0; row < Q * H; row++) {
            if (w == NULL || seen == NULL) continue;
            const int64_t i = row / H, h = row % H, g = h / G;
            const float *qv = q + (i * H + h) * D;
            const float *keys = cache_k + g * cap * D, *vals = cache_v + g * cap * ldv;
            int64_t n = 0;
            for (int64_t s = 0; s < first; s++) seen[n++] = (int32_t)s;
            for (int64_t j = 0; j < W; j++)
                if (mask[i * W + j]) seen[n++] = (int32_t)(first + j);
            /* Scores, four keys at a time: four independent chains, each the same chain as
             * one key alone would have. */
            int64_t t = 0;
            for (; t + 4 <= n; t += 4) {
                const float *k0 = keys + (int64_t)seen[t] * D, *k1 = keys + (int64_t)seen[t + 1] * D;
                const float *k2 = keys + (int64_t)seen[t + 2] * D, *k3 = keys + (int64_t)seen[t + 3] * D;
                __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
                for (int64_t d = 0; d < D; d += 8) {
                    const __m256 x = _mm256_loadu_ps(qv + d);
                    c0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + d), c0);
                    c1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k1 + d), c1);
                    c2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k2 + d), c2);
                    c3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k3 + d), c3);
                }
                w[t] = hsum8(c0), w[t + 1] = hsum8(c1), w[t + 2] = hsum8(c2), w[t + 3] = hsum8(c3);
            }
            for (; t < n; t++) {
                const float *kv = keys + (int64_t)seen[t] * D;
                __m256 c0 = _mm256_setzero_ps();
                for (int64_t d = 0; d < D; d += 8)
                    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(qv + d), _mm256_loadu_ps(kv + d), c0);
                w[t] = hsum8(c0);
            }
            float top = -INFINITY;
            for (t = 0; t < n; t++) top = w[t] > top ? w[t] : top;
            for (int64_t t = n; t < (n + 7) / 8 * 8; t++) w[t] = top;
            const __m256 m = _mm256_set1_ps(top);
            for (int64_t t = 0; t < n; t += 8)
                _mm256_storeu_ps(w + t, exp8(_mm256_sub_ps(_mm256_loadu_ps(w + t), m)));
            float *o = out + i * H * D + h * D;
            float total = 0.0f;
            /* The weighted values, key by key in slot order (one chain per output lane). */
            for (int64_t d0 = 0; d0 < D; d0 += 64) { /* up to 8 x 8 lanes of the output at once */
                const int64_t lanes = (D - d0 < 64 ? D - d0 : 64) / 8;
                __m256 a[8];
                for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
                if (lanes == 8) {
                    for (int64_t u = 0; u < n; u++) {
                        const float *vv = vals + (int64_t)seen[u] * ldv + d0;
                        const __m256 wt = _mm256_set1_ps(w[u]);
                        for (int j = 0; j < 8; j++)
                            a[j] = _mm256_fmadd_ps(wt, _mm256_loadu_ps(vv + 8 * j), a[j]);
                    }
                } else {
                    for (int64_t u = 0; u < n; u++) {
                        const float *vv = vals + (int64_t)seen[u] * ldv + d0;
                        const __m256 wt = _mm256_set1_ps(w[u]);
                        for (int j = 0; j < lanes; j++)
                            a[j] = _mm256_fmadd_ps(wt, _mm256_loadu_ps(vv + 8 * j), a[j]);
                    }
                }
                for (int j = 0; j < lanes; j++) _mm256_storeu_ps(o + d0 + 8 * j, a[j]);
            }
            for (int64_t t = 0; t < n; t++) total += w[t]; /* in slot order */
            const __m256 inv = _mm256_set1_ps(total);
            for (int64_t d = 0; d < D; d += 8)
                _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(o + d), inv));
        }
        free(w);
        free(seen);
    }
    return failed ? -1 : 0;
}
