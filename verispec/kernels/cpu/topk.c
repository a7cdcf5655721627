/* The k largest logits of each row, and the log-sum-exp of the row's block maxima, in one
 * pass over the row (verispec/kernels/cpu_topk.py; AVX2).
 *
 * A row is read in blocks of B values: eight lanes of maxima give the block's maximum, and
 * only a block whose maximum beats the current k-th value is scanned element by element,
 * each such element inserted into a descending list of k (a value equal to one already
 * listed goes after it: the lower id first among ties). So a row costs about one vector
 * max per eight logits. On request the block maxima are kept, and their log-sum-exp
 * (max + log sum exp(b - max)) is the normaliser of Dynamic Token Recycling's scores.
 *
 * NaN: a row holding one is not ranked (the caller falls back to torch.topk, which ranks
 * NaN first); the return value is then nonzero.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* Insert (v, id) into the descending list of n < = k entries; returns the new count. */
static inline int insert(float *vals, int64_t *ids, int n, int k, float v, int64_t id) {
    int p = n < k ? n : k - 1;
    if (n == k && !(v > vals[k - 1])) return n;
    while (p > 0 && vals[p - 1] < v) {
        vals[p] = vals[p - 1], ids[p] = ids[p - 1];
        p--;
    }
    vals[p] = v, ids[p] = id;
    return n < k ? n + 1 : n;
}

/* Row r of x (M x V, row stride ldx) -> vals[r * k ..] (descending), ids[r * k ..] and, when
 * lse is not NULL, lse[r]. B is a multiple of 8 dividing V; k <= V.
 * Returns the number of rows holding a NaN (those rows' outputs are unspecified), or M when
 * the block maxima could not be allocated. */
int vs_topk(const float *x, int64_t M, int64_t V, int64_t ldx, int k, int64_t B, float *vals,
            int64_t *ids, float *lse) {
    int bad = 0;
    const int64_t nb = V / B;
    float *bmax = lse ? malloc((size_t)(M * nb) * sizeof(float)) : NULL; /* this call's own */
    if (lse && !bmax) return (int)M;
#pragma omp parallel for schedule(static) reduction(+ : bad) if (M >= 8)
    for (int64_t r = 0; r < M; r++) {
        const float *row = x + r * ldx;
        float *v = vals + r * k, *bm = bmax ? bmax + r * nb : NULL;
        int64_t *id = ids + r * k;
        int n = 0;
        float hi = -INFINITY;
        __m256 nan = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const float *blk = row + b * B;
            __m256 m = _mm256_loadu_ps(blk);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(m, m, _CMP_UNORD_Q));
            for (int64_t j = 8; j < B; j += 8) {
                const __m256 y = _mm256_loadu_ps(blk + j);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
                m = _mm256_max_ps(m, y);
            }
            const float top = hmax8(m);
            if (bm) bm[b] = top, hi = top > hi ? top : hi;
            if (n < k) { /* filling the list: every value enters */
                for (int64_t j = 0; j < B; j++) n = insert(v, id, n, k, blk[j], b * B + j);
            } else if (top > v[k - 1]) { /* only lanes above the k-th value, in id order */
                const __m256 t = _mm256_set1_ps(v[k - 1]);
                for (int64_t j = 0; j < B; j += 8) {
                    int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(blk + j), t, _CMP_GT_OQ));
                    while (bits) {
                        const int lane = __builtin_ctz(bits);
                        bits &= bits - 1;
                        n = insert(v, id, n, k, blk[j + lane], b * B + j + lane);
                    }
                }
            }
        }
        if (_mm256_movemask_ps(nan)) {
            bad += 1;
            continue;
        }
        if (!bm) continue;
        if (isinf(hi)) { /* all -inf (or a +inf maximum): the sum below would be NaN */
            lse[r] = hi;
            continue;
        }
        float s = 0.0f;
        for (int64_t b = 0; b < nb; b++) s += expf(bm[b] - hi);
        lse[r] = hi + logf(s);
    }
    free(bmax);
    return bad;
}
