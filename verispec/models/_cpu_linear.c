/* verispec's CPU weight products: y = x W^T (+ bias) with W stored as float32 or in the
 * blocked low-bit formats of GGUF files (Q4_1, Q8_0), read straight from memory.
 *
 * Built at first use by verispec/models/cpu_linear.py (cc -O3 -march=native -fopenmp,
 * -ffp-contract=off) and called through ctypes. Every output y[m, n] is one chain of
 * fused multiply-adds over k = 0, 8, 16, ... (eight lanes), then one fixed horizontal sum,
 * then the bias: its bits depend on x[m], W[n] and K only, never on how many rows or
 * columns are computed with it, on the tiling, or on the thread count. A low-bit weight is
 * first widened to float32 exactly as the loader dequantized it (q * d + m, two roundings),
 * so a Q4_1 matrix and its float32 dequantization give the same bits.
 *
 * Formats (K is a multiple of 32 for the blocked ones; one block covers 32 weights of a row):
 *   0  float32   W[N][K]
 *   1  Q4_1      struct { float d, m; uint8 q[16]; }  w[i] = q_i * d + m, q_i in 0..15:
 *                byte j holds q_j (low nibble) and q_{j+16} (high nibble)
 *   2  Q8_0      struct { float d; int8 q[32]; }       w[i] = q_i * d
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define NR 4 /* weight rows per tile */

typedef struct { float d, m; uint8_t q[16]; } block_q4_1;
typedef struct { float d; int8_t q[32]; } block_q8_0;

int vs_block_bytes(int kind) {
    return kind == 1 ? (int)sizeof(block_q4_1) : kind == 2 ? (int)sizeof(block_q8_0) : 0;
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline void widen8(__m128i bytes8, __m256 d, __m256 m, float *out, int is_signed) {
    __m256i q = is_signed ? _mm256_cvtepi8_epi32(bytes8) : _mm256_cvtepu8_epi32(bytes8);
    __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
    _mm256_storeu_ps(out, is_signed ? w : _mm256_add_ps(w, m));
}

/* Row n of a blocked matrix, widened to float32 into out[0..K). */
static void dequant_row(int kind, const uint8_t *row, int64_t K, float *out) {
    int64_t blocks = K / 32;
    if (kind == 1) {
        const block_q4_1 *b = (const block_q4_1 *)row;
        const __m128i low = _mm_set1_epi8(0x0F);
        for (int64_t i = 0; i < blocks; i++, out += 32) {
            __m256 d = _mm256_set1_ps(b[i].d), m = _mm256_set1_ps(b[i].m);
            __m128i raw = _mm_loadu_si128((const __m128i *)b[i].q);
            __m128i lo = _mm_and_si128(raw, low);
            __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
            widen8(lo, d, m, out, 0);
            widen8(_mm_srli_si128(lo, 8), d, m, out + 8, 0);
            widen8(hi, d, m, out + 16, 0);
            widen8(_mm_srli_si128(hi, 8), d, m, out + 24, 0);
        }
    } else {
        const block_q8_0 *b = (const block_q8_0 *)row;
        for (int64_t i = 0; i < blocks; i++, out += 32) {
            __m256 d = _mm256_set1_ps(b[i].d), z = _mm256_setzero_ps();
            __m128i a = _mm_loadu_si128((const __m128i *)b[i].q);
            __m128i c = _mm_loadu_si128((const __m128i *)(b[i].q + 16));
            widen8(a, d, z, out, 1);
            widen8(_mm_srli_si128(a, 8), d, z, out + 8, 1);
            widen8(c, d, z, out + 16, 1);
            widen8(_mm_srli_si128(c, 8), d, z, out + 24, 1);
        }
    }
}

/* One row of x against NR rows of a blocked matrix, widened in registers (no buffer): the
 * same widening and the same FMA chains, in the same order, as dequant_row + micro_1x4. */
static void row_blocks(int kind, const float *restrict x, const uint8_t *w, int64_t row_bytes,
                       int nr, int64_t K, float *restrict y, const float *restrict bias) {
    __m256 acc[NR];
    for (int j = 0; j < NR; j++) acc[j] = _mm256_setzero_ps();
    const __m128i low = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < K / 32; i++) {
        const __m256 x0 = _mm256_loadu_ps(x + 32 * i), x1 = _mm256_loadu_ps(x + 32 * i + 8);
        const __m256 x2 = _mm256_loadu_ps(x + 32 * i + 16), x3 = _mm256_loadu_ps(x + 32 * i + 24);
        for (int j = 0; j < nr; j++) {
            __m128i p0, p1, p2, p3;
            __m256 d, m, w0, w1, w2, w3;
            if (kind == 1) {
                const block_q4_1 *b = (const block_q4_1 *)(w + j * row_bytes) + i;
                d = _mm256_set1_ps(b->d), m = _mm256_set1_ps(b->m);
                __m128i raw = _mm_loadu_si128((const __m128i *)b->q);
                p0 = _mm_and_si128(raw, low), p2 = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
                p1 = _mm_srli_si128(p0, 8), p3 = _mm_srli_si128(p2, 8);
                w0 = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(p0)), d), m);
                w1 = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(p1)), d), m);
                w2 = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(p2)), d), m);
                w3 = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(p3)), d), m);
            } else {
                const block_q8_0 *b = (const block_q8_0 *)(w + j * row_bytes) + i;
                d = _mm256_set1_ps(b->d);
                p0 = _mm_loadu_si128((const __m128i *)b->q), p2 = _mm_loadu_si128((const __m128i *)(b->q + 16));
                p1 = _mm_srli_si128(p0, 8), p3 = _mm_srli_si128(p2, 8);
                w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(p0)), d);
                w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(p1)), d);
                w2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(p2)), d);
                w3 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(p3)), d);
            }
            acc[j] = _mm256_fmadd_ps(x0, w0, acc[j]);
            acc[j] = _mm256_fmadd_ps(x1, w1, acc[j]);
            acc[j] = _mm256_fmadd_ps(x2, w2, acc[j]);
            acc[j] = _mm256_fmadd_ps(x3, w3, acc[j]);
        }
    }
    for (int j = 0; j < nr; j++) y[j] = hsum(acc[j]) + (bias ? bias[j] : 0.0f);
}

/* y[m][n] for MR rows of x and NR_ rows of w (float32, both of row stride K): one FMA
 * chain each. */
#define MICRO(MR, NR_)                                                                       \
    static void micro_##MR##x##NR_(const float *restrict x, const float *restrict w,         \
                                   int64_t K, float *restrict y, int64_t ldy,                \
                                   const float *restrict bias) {                             \
        __m256 acc[MR][NR_];                                                                 \
        for (int i = 0; i < MR; i++)                                                         \
            for (int j = 0; j < NR_; j++) acc[i][j] = _mm256_setzero_ps();                   \
        for (int64_t k = 0; k < K; k += 8) {                                                 \
            __m256 wv[NR_];                                                                  \
            for (int j = 0; j < NR_; j++) wv[j] = _mm256_loadu_ps(w + j * K + k);                 \
            for (int i = 0; i < MR; i++) {                                                   \
                __m256 xv = _mm256_loadu_ps(x + i * K + k);                                  \
                for (int j = 0; j < NR_; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]); \
            }                                                                                \
        }                                                                                    \
        for (int i = 0; i < MR; i++)                                                         \
            for (int j = 0; j < NR_; j++)                                                    \
                y[i * ldy + j] = hsum(acc[i][j]) + (bias ? bias[j] : 0.0f);                  \
    }
MICRO(1, 4) MICRO(2, 4) MICRO(3, 4) MICRO(1, 1) MICRO(2, 1) MICRO(3, 1)

static void tile(const float *x, int64_t M, int64_t K, const float *w, int nr, float *y,
                 int64_t N, const float *bias) {
    /* Rows in threes, but never a lone last row after them (4 = 2 + 2, 7 = 3 + 2 + 2): a
     * one-row pass runs its four chains at the FMA latency, not its throughput. */
    int64_t m = 0, threes = M % 3 == 1 && M > 1 ? (M - 4) / 3 : M / 3;
    for (; m < 3 * threes; m += 3) {
        if (nr == NR) micro_3x4(x + m * K, w, K, y + m * N, N, bias);
        else for (int j = 0; j < nr; j++) micro_3x1(x + m * K, w + j * K, K, y + m * N + j, N, bias ? bias + j : 0);
    }
    for (; m + 2 <= M; m += 2) {
        if (nr == NR) micro_2x4(x + m * K, w, K, y + m * N, N, bias);
        else for (int j = 0; j < nr; j++) micro_2x1(x + m * K, w + j * K, K, y + m * N + j, N, bias ? bias + j : 0);
    }
    for (; m < M; m++) {
        if (nr == NR) micro_1x4(x + m * K, w, K, y + m * N, N, bias);
        else for (int j = 0; j < nr; j++) micro_1x1(x + m * K, w + j * K, K, y + m * N + j, N, bias ? bias + j : 0);
    }
}

/* y (M x N, row-major) = x (M x K, row-major) W^T + bias, on `threads` threads.
 * Returns 0, or -1 if K does not suit the format or memory ran out. */
int vs_linear(int kind, const float *x, int64_t M, int64_t K, const void *weight, int64_t N,
              const float *bias, float *y, int threads) {
    if (K % (kind == 0 ? 8 : 32) != 0) return -1;
    int64_t row_bytes = kind == 0 ? K * 4 : (K / 32) * vs_block_bytes(kind);
    int64_t tiles = (N + NR - 1) / NR;
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        float *buf = NULL;
        if (kind != 0 && posix_memalign((void **)&buf, 64, (size_t)(NR * K * 4)) != 0) {
#pragma omp atomic write
            failed = 1;
            buf = NULL;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            if (kind != 0 && buf == NULL) continue;
            int64_t n0 = t * NR;
            int nr = (int)(N - n0 < NR ? N - n0 : NR);
            const uint8_t *src = (const uint8_t *)weight + n0 * row_bytes;
            if (kind != 0 && M == 1) { /* one row: widen in registers, no buffer */
                row_blocks(kind, x, src, row_bytes, nr, K, y + n0, bias ? bias + n0 : NULL);
                continue;
            }
            const float *rows = (const float *)src; /* nr rows of stride K */
            if (kind != 0) {
                for (int j = 0; j < nr; j++) dequant_row(kind, src + j * row_bytes, K, buf + j * K);
                rows = buf;
            }
            tile(x, M, K, rows, nr, y + n0, N, bias ? bias + n0 : NULL);
        }
        free(buf);
    }
    return failed ? -1 : 0;
}

/* out (N x K float32) = the matrix widened, as the products see it (for tests). */
int vs_dequantize(int kind, const void *weight, int64_t N, int64_t K, float *out) {
    if (kind == 0 || K % 32 != 0) return -1;
    int64_t row_bytes = (K / 32) * vs_block_bytes(kind);
    for (int64_t n = 0; n < N; n++)
        dequant_row(kind, (const uint8_t *)weight + n * row_bytes, K, out + n * K);
    return 0;
}
