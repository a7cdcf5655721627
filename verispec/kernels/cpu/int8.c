/* verispec's integer weight products (arithmetic="int8"): y = x W^T (+ bias) with W's 4- or
 * 8-bit codes multiplied by 8-bit codes of x in integer instructions, as llama.cpp does
 * (Q4_1 x Q8_1, Q8_0 x Q8_0).
 *
 * Built with kernels/cpu/linear.c (vs_linear hands formats 3 and 4 here), called through ctypes
 * (verispec/models/cpu_linear.py) and by the C layer (kernels/cpu/layer.c).
 *
 * The activations: each row of x is quantized on its own, per block of 32 values
 * (llama.cpp's Q8_1): d = max |x_i| / 127, q_i = round-half-even(x_i * (1 / d)) (0 where
 * d = 0), s = d * sum(q_i). A row's codes depend on that row only.
 *
 * The weights are repacked at load into panels of eight output rows (zero rows past N),
 * each block's codes interleaved so that one 32-byte vector holds four consecutive codes of
 * each of the eight rows (byte 4 j + b: row j), multiplied by four activation codes
 * broadcast to all eight rows:
 *   3  Q4_1 panel block: float d[8]; float m[8]; uint8 q[4][32]    (w = q d + m, q in 0..15)
 *        q[v][4 j + b] = code(j, 8 v + b) | code(j, 8 v + 4 + b) << 4
 *   4  Q8_0 panel block: float d[8]; int8 q[8][32]                 (w = q d, |q| <= 127)
 *        q[v][4 j + b] = code(j, 4 v + b)
 *  12, 13  the same with the scales (and minimums) as IEEE halves (uint16), where every one
 *        of the matrix is a half (GGUF's Q4_0, Q4_1, Q5_0 and Q8_0 scales are): 20 and 34
 *        bytes for 32 weights of a row instead of 24 and 36, widened exactly (vcvtph2ps), so
 *        the same values and bits as 3 and 4. Needs F16C (vs_panel_bytes is 0 without).
 *
 * The one summation order. For output j of row r, block i: t_i = the integer sum of the
 * block's 32 code products (exact: |t_i| < 2^24, so exact in float32 too), then
 *   acc = fma((float) t_i, d_w[j] * d_x[i], acc)        (in block order, from 0)
 *   mac = fma(m_w[j], s_x[i], mac)                       (Q4_1 only, from 0)
 *   y = (acc + mac) + bias                               (Q8_0: y = acc + bias)
 * Integer sums do not depend on the instruction that formed them, so every path below
 * (AVX2 vpmaddubsw + vpmaddwd; AVX-VNNI and AVX512-VNNI vpdpbusd; portable C) gives the
 * same bits, for any row count, tiling or thread count: tree rows equal sequential rows.
 */
#include "simd.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PANEL 8 /* output rows per panel */
#define ROW_TILE 32 /* rows of x that share a panel's unpacked block */
#define DIRECT_ROWS 4 /* up to this many rows, each block is unpacked in registers */
#define WIDE_DIRECT_ROWS 8 /* the same with AVX-512's 32 vector registers (AVX512-VNNI) */
#define TILE_ROWS 64  /* AVX2: rows in tiles of this many, each block unpacked in registers */
#define AHEAD_BYTES 4096 /* each block asks for the panel's bytes this far ahead (prefetch) */

typedef struct { float d[PANEL], m[PANEL]; uint8_t q[4][32]; } panel_q4_1;
typedef struct { float d[PANEL]; int8_t q[8][32]; } panel_q8_0;
typedef struct { uint16_t d[PANEL], m[PANEL]; uint8_t q[4][32]; } panel_q4_1h;
typedef struct { uint16_t d[PANEL]; int8_t q[8][32]; } panel_q8_0h;

#define IS_Q4(kind) ((kind) == 3 || (kind) == 12) /* Q4_1 codes (else Q8_0) */
#define IS_HALF(kind) ((kind) >= 12)               /* scales as halves */
/* Bytes of a panel block before its codes: the eight rows' scales (and minimums). */
#define HEAD_BYTES(kind) ((IS_Q4(kind) ? 2 : 1) * PANEL * (IS_HALF(kind) ? 2 : 4))

int vs_panel_bytes(int kind) {
    return kind == 3 ? (int)sizeof(panel_q4_1) : kind == 4 ? (int)sizeof(panel_q8_0)
#if defined(__F16C__)
         : kind == 12 ? (int)sizeof(panel_q4_1h) : kind == 13 ? (int)sizeof(panel_q8_0h)
#endif
         : 0;
}

/* The eight rows' scales (k = 0) or minimums (k = 1) of the panel block at `head`, float32:
 * a half widens exactly. */
static inline __attribute__((always_inline)) __m256 scales8(int kind, const uint8_t *head, int k) {
#if defined(__F16C__)
    if (IS_HALF(kind)) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16 * k)));
#endif
    return _mm256_loadu_ps((const float *)head + PANEL * k);
}
/* Row j's scale (k = 0) or minimum (k = 1), for the portable path. */
static inline float scale1(int kind, const uint8_t *head, int k, int j) {
#if defined(__F16C__)
    if (IS_HALF(kind)) return _cvtsh_ss(((const uint16_t *)head)[PANEL * k + j]);
#endif
    return ((const float *)head)[PANEL * k + j];
}

/* -- the activations' codes ------------------------------------------------------------ */

/* Row x[0..K) as Q8_1 codes q[0..K), scales d[0..K/32) and scaled sums s[0..K/32); the
 * portable and the AVX2 code give the same bits (the same IEEE operations). */
static void quantize_row_c(const float *x, int64_t K, int8_t *q, float *d, float *s) {
    for (int64_t i = 0; i < K / 32; i++) {
        const float *xb = x + 32 * i;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float scale = amax / 127.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            float v = nearbyintf(xb[j] * inv);
            v = fminf(fmaxf(v, -127.0f), 127.0f);
            q[32 * i + j] = (int8_t)v;
            sum += (int)v;
        }
        d[i] = scale;
        s[i] = scale * (float)sum;
    }
}

static void quantize_row_avx2(const float *x, int64_t K, int8_t *q, float *d, float *s) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    for (int64_t i = 0; i < K / 32; i++) {
        const float *xb = x + 32 * i;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int g = 0; g < 4; g++) {
            v[g] = _mm256_loadu_ps(xb + 8 * g);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[g]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        const float scale = amax / 127.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        const __m256 iv = _mm256_set1_ps(inv);
        __m256i c[4], total = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(v[g], iv),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
            c[g] = _mm256_cvtps_epi32(r);
            total = _mm256_add_epi32(total, c[g]);
        }
        /* 32 int32 -> 32 int8 in order (packs interleave 128-bit lanes: permute back) */
        __m256i p01 = _mm256_packs_epi32(c[0], c[1]), p23 = _mm256_packs_epi32(c[2], c[3]);
        __m256i b = _mm256_packs_epi16(p01, p23);
        b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + 32 * i), b);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        d[i] = scale;
        s[i] = scale * (float)_mm_cvtsi128_si32(t);
    }
}

/* -- the products: one panel, rows [r0, r1) ---------------------------------------------- */

/* The portable path: the same integer sums, the same float operations, lane by lane. */
static inline __attribute__((always_inline)) void
panel_c(int kind, const uint8_t *panel, int64_t blocks, const int8_t *xq,
                    const float *xd, const float *xs, int64_t K, int64_t r0, int64_t r1,
                    float *y, int64_t ldy, int64_t n0, int64_t N, const float *bias,
                    __m256i *codes) {
    (void)codes;
    const int64_t bytes = vs_panel_bytes(kind);
    for (int64_t r = r0; r < r1; r++) {
        float acc[PANEL] = {0}, mac[PANEL] = {0};
        for (int64_t i = 0; i < blocks; i++) {
            const int8_t *a = xq + r * K + 32 * i;
            const float da = xd[r * (K / 32) + i];
            const uint8_t *head = panel + i * bytes, *q = head + HEAD_BYTES(kind);
            if (IS_Q4(kind)) {
                const float sa = xs[r * (K / 32) + i];
                for (int j = 0; j < PANEL; j++) {
                    int t = 0;
                    for (int v = 0; v < 4; v++)
                        for (int b = 0; b < 4; b++) {
                            const int byte = q[32 * v + 4 * j + b];
                            t += (byte & 15) * a[8 * v + b] + (byte >> 4) * a[8 * v + 4 + b];
                        }
                    acc[j] = fmaf((float)t, scale1(kind, head, 0, j) * da, acc[j]);
                    mac[j] = fmaf(scale1(kind, head, 1, j), sa, mac[j]);
                }
            } else {
                for (int j = 0; j < PANEL; j++) {
                    int t = 0;
                    for (int v = 0; v < 8; v++)
                        for (int b = 0; b < 4; b++)
                            t += ((const int8_t *)q)[32 * v + 4 * j + b] * a[4 * v + b];
                    acc[j] = fmaf((float)t, scale1(kind, head, 0, j) * da, acc[j]);
                }
            }
        }
        for (int j = 0; j < PANEL && n0 + j < N; j++) {
            const float v = IS_Q4(kind) ? acc[j] + mac[j] : acc[j];
            y[r * ldy + n0 + j] = v + (bias ? bias[n0 + j] : 0.0f);
        }
    }
}

/* Four activation codes a[0..3] in every 32-bit lane. */
static inline __m256i broadcast4(const int8_t *a) {
    int32_t v;
    memcpy(&v, a, 4);
    return _mm256_set1_epi32(v);
}

/* The vector paths share one body. Q4(w, a) and Q8(u, w, a) are the path's block sums: the
 * eight rows' integer sums (one int32 lane each) of a block's codes w[0..7] (Q8_0: u = |w|)
 * times the activation codes a[0..31]. The panel's codes are unpacked once into `codes`
 * (16 vectors a block), then rows run two at a time, each block's codes loaded once for
 * both, with their sums in registers. */
#define ROWS_STEP(SUM, KIND, R)                                                              \
    do {                                                                                     \
        __m256 acc[R], mac[R];                                                               \
        for (int k = 0; k < R; k++) acc[k] = mac[k] = _mm256_setzero_ps();                   \
        for (int64_t i = 0; i < blocks; i++) {                                               \
            const __m256i *w = codes + 16 * i;                                               \
            const uint8_t *head = panel + i * bytes;                                         \
            const __m256 dw = scales8(KIND, head, 0);                                        \
            for (int k = 0; k < R; k++) {                                                    \
                const int8_t *a = xq + (r + k) * K + 32 * i;                                 \
                const __m256i t = SUM(w, a);                                                 \
                const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(xd[(r + k) * blocks + i])); \
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), scale, acc[k]);              \
                if (IS_Q4(KIND))                                                             \
                    mac[k] = _mm256_fmadd_ps(scales8(KIND, head, 1),                         \
                                             _mm256_set1_ps(xs[(r + k) * blocks + i]), mac[k]); \
            }                                                                                \
        }                                                                                    \
        for (int k = 0; k < R; k++) {                                                        \
            float out[PANEL];                                                                \
            const __m256 v = IS_Q4(KIND) ? _mm256_add_ps(acc[k], mac[k]) : acc[k];           \
            _mm256_storeu_ps(out, _mm256_add_ps(v, _mm256_loadu_ps(b)));                     \
            memcpy(y + (r + k) * ldy + n0, out, (size_t)n * 4);                              \
        }                                                                                    \
    } while (0)

/* One panel against rows [r0, r1) of x, for format KIND, with the block sum SUM(w, a).
 * Up to LIMIT rows unpack each block in registers and use it at once for every row; more
 * rows unpack the panel once into `codes` (16 vectors a block). */
#define PANEL_BODY(SUM, KIND, LIMIT)                                                         \
    const int64_t bytes = vs_panel_bytes(KIND);                                              \
    const __m256i low4 = _mm256_set1_epi8(15);                                               \
    const int direct = r1 - r0 <= (LIMIT);                                                   \
    __m256i own[16];                                                                         \
    __m256 acc1[LIMIT], mac1[LIMIT];                                                         \
    for (int k = 0; k < (LIMIT) && k < r1 - r0; k++) acc1[k] = mac1[k] = _mm256_setzero_ps(); \
    for (int64_t i = 0; i < blocks; i++) {                                                   \
        __m256i *c = direct ? own : codes + 16 * i;                                          \
        prefetch_ahead(panel + i * bytes, AHEAD_BYTES, bytes);                               \
        const uint8_t *q = panel + i * bytes + HEAD_BYTES(KIND);                             \
        if (IS_Q4(KIND)) {                                                                   \
            for (int v = 0; v < 4; v++) {                                                    \
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * v));        \
                c[2 * v] = _mm256_and_si256(raw, low4);                                      \
                c[2 * v + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);            \
            }                                                                                \
        } else {                                                                             \
            for (int v = 0; v < 8; v++) {                                                    \
                const __m256i u = _mm256_loadu_si256((const __m256i *)(q + 32 * v));          \
                c[v] = _mm256_sign_epi8(u, u), c[8 + v] = u;                                 \
            }                                                                                \
        }                                                                                    \
        for (int64_t r = r0; direct && r < r1; r++) {                                        \
            const int8_t *a = xq + r * K + 32 * i;                                           \
            const uint8_t *head = panel + i * bytes;                                         \
            const __m256 scale = _mm256_mul_ps(scales8(KIND, head, 0),                       \
                                               _mm256_set1_ps(xd[r * blocks + i]));           \
            acc1[r - r0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SUM(own, a)), scale, acc1[r - r0]); \
            if (IS_Q4(KIND))                                                                 \
                mac1[r - r0] = _mm256_fmadd_ps(scales8(KIND, head, 1),                       \
                                               _mm256_set1_ps(xs[r * blocks + i]), mac1[r - r0]); \
        }                                                                                    \
    }                                                                                        \
    float b[PANEL] = {0};                                                                    \
    const int64_t n = n0 + PANEL <= N ? PANEL : N - n0;                                      \
    if (bias != NULL) memcpy(b, bias + n0, (size_t)n * 4);                                   \
    if (direct) {                                                                            \
        for (int64_t r = r0; r < r1; r++) {                                                  \
            float out[PANEL];                                                                \
            const __m256 v = IS_Q4(KIND) ? _mm256_add_ps(acc1[r - r0], mac1[r - r0]) : acc1[r - r0]; \
            _mm256_storeu_ps(out, _mm256_add_ps(v, _mm256_loadu_ps(b)));                     \
            memcpy(y + r * ldy + n0, out, (size_t)n * 4);                                    \
        }                                                                                    \
        return;                                                                              \
    }                                                                                        \
    int64_t r = r0;                                                                          \
    for (; r + 2 <= r1; r += 2) ROWS_STEP(SUM, KIND, 2);                                     \
    if (r < r1) ROWS_STEP(SUM, KIND, 1);

#define PANEL_ARGS                                                                           \
    int kind, const uint8_t *panel, int64_t blocks, const int8_t *xq, const float *xd,       \
        const float *xs, int64_t K, int64_t r0, int64_t r1, float *y, int64_t ldy,           \
        int64_t n0, int64_t N, const float *bias, __m256i *codes
#define ONE_PANEL static inline __attribute__((always_inline)) void

/* Panels [p0, p1) of a matrix in one call (a thread's share), each by ONE, the one-panel
 * body inlined into the loop: no call for each panel. */
#define PANELS_ARGS                                                                          \
    int kind, const uint8_t *weight, int64_t panel_bytes, int64_t p0, int64_t p1,            \
        int64_t blocks, const int8_t *xq, const float *xd, const float *xs, int64_t K,       \
        int64_t M, float *y, int64_t N, const float *bias, __m256i *codes
#define PANELS(ONE)                                                                          \
    for (int64_t p = p0; p < p1; p++)                                                        \
        ONE(kind, weight + p * panel_bytes, blocks, xq, xd, xs, K, 0, M, y, N, p * PANEL, N, \
            bias, codes)
/* The same in tiles of TILE_ROWS rows, each panel's tiles one after the other (the panel's
 * blocks stay in cache from the first tile on). */
#define PANELS_IN_TILES(ONE)                                                                 \
    for (int64_t p = p0; p < p1; p++)                                                        \
        for (int64_t t = 0; t < M; t += TILE_ROWS)                                           \
            ONE(kind, weight + p * panel_bytes, blocks, xq, xd, xs, K, t,                    \
                t + TILE_ROWS < M ? t + TILE_ROWS : M, y, N, p * PANEL, N, bias, codes)

/* Two Q4_1 panels (16 output rows) against rows [r0, r1), R rows at a time: each loaded
 * code vector serves R rows and each broadcast activation two panels, so a step loads
 * R + 2 vectors for 2 R products (one row and panel at a time loads two for one). STEP(s,
 * w, a) adds a vector of codes times broadcast activations into the integer sums s,
 * FINISH(s) gives the block's int32 sums. The same sums and float operations as
 * PANEL_BODY, so the same bits. */
#define PAIR_ROWS(STEP, FINISH, KIND, R)                                                     \
    do {                                                                                     \
        __m256i sum[R][2];                                                                   \
        for (int k = 0; k < R; k++) sum[k][0] = sum[k][1] = _mm256_setzero_si256();          \
        for (int v = 0; v < 8; v++) {                                                        \
            const __m256i w0 = _mm256_load_si256(c + v), w1 = _mm256_load_si256(c + 8 + v);  \
            for (int k = 0; k < R; k++) {                                                    \
                const __m256i a = broadcast4(xq + (r + k) * K + 32 * i + 4 * v);             \
                sum[k][0] = STEP(sum[k][0], w0, a);                                          \
                sum[k][1] = STEP(sum[k][1], w1, a);                                          \
            }                                                                                \
        }                                                                                    \
        for (int k = 0; k < R; k++) {                                                        \
            const __m256 da = _mm256_set1_ps(xd[(r + k) * blocks + i]);                      \
            const __m256 sa = _mm256_set1_ps(xs[(r + k) * blocks + i]);                      \
            for (int p = 0; p < 2; p++) {                                                    \
                const __m256 scale = _mm256_mul_ps(scales8(KIND, h[p], 0), da);              \
                acc[r + k - t0][p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(FINISH(sum[k][p])),  \
                                                     scale, acc[r + k - t0][p]);             \
                mac[r + k - t0][p] = _mm256_fmadd_ps(scales8(KIND, h[p], 1), sa,             \
                                                     mac[r + k - t0][p]);                    \
            }                                                                                \
        }                                                                                    \
    } while (0)

#define PAIR_ARGS                                                                            \
    const uint8_t *panel0, const uint8_t *panel1, int64_t blocks, const int8_t *xq,          \
        const float *xd, const float *xs, int64_t K, int64_t r0, int64_t r1, float *y,       \
        int64_t ldy, int64_t n0, int64_t N, const float *bias, __m256i *codes

#define PAIR_BODY(STEP, FINISH, KIND)                                                        \
    (void)codes;                                                                             \
    const int64_t bytes = vs_panel_bytes(KIND);                                              \
    const __m256i low4 = _mm256_set1_epi8(15);                                               \
    float b[2][PANEL] = {{0}};                                                               \
    int64_t n[2];                                                                            \
    for (int p = 0; p < 2; p++) {                                                            \
        const int64_t from = n0 + PANEL * p;                                                 \
        n[p] = from + PANEL <= N ? PANEL : N - from;                                         \
        if (bias != NULL) memcpy(b[p], bias + from, (size_t)n[p] * 4);                       \
    }                                                                                        \
    for (int64_t t0 = r0; t0 < r1; t0 += ROW_TILE) {                                         \
        const int64_t t1 = t0 + ROW_TILE < r1 ? t0 + ROW_TILE : r1;                          \
        __m256 acc[ROW_TILE][2], mac[ROW_TILE][2];                                           \
        for (int64_t r = t0; r < t1; r++)                                                    \
            for (int p = 0; p < 2; p++) acc[r - t0][p] = mac[r - t0][p] = _mm256_setzero_ps(); \
        for (int64_t i = 0; i < blocks; i++) {                                               \
            _Alignas(32) __m256i c[16]; /* block i of both panels, unpacked */               \
            const uint8_t *h[2] = {panel0 + i * bytes, panel1 + i * bytes};                  \
            for (int p = 0; p < 2; p++) {                                                    \
                const uint8_t *q = h[p] + HEAD_BYTES(KIND);                                  \
                prefetch_ahead(h[p], AHEAD_BYTES, bytes);                                    \
                for (int v = 0; v < 4; v++) {                                                \
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * v));    \
                    c[8 * p + 2 * v] = _mm256_and_si256(raw, low4);                          \
                    c[8 * p + 2 * v + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4); \
                }                                                                            \
            }                                                                                \
            int64_t r = t0;                                                                  \
            for (; r + 4 <= t1; r += 4) PAIR_ROWS(STEP, FINISH, KIND, 4);                    \
            if (t1 - r == 3) PAIR_ROWS(STEP, FINISH, KIND, 3);                               \
            if (t1 - r == 2) PAIR_ROWS(STEP, FINISH, KIND, 2);                               \
            if (t1 - r == 1) PAIR_ROWS(STEP, FINISH, KIND, 1);                               \
        }                                                                                    \
        for (int64_t r = t0; r < t1; r++)                                                    \
            for (int p = 0; p < 2; p++) {                                                    \
                float out[PANEL];                                                            \
                const __m256 v = _mm256_add_ps(acc[r - t0][p], mac[r - t0][p]);              \
                _mm256_storeu_ps(out, _mm256_add_ps(v, _mm256_loadu_ps(b[p])));              \
                memcpy(y + r * ldy + n0 + PANEL * p, out, (size_t)n[p] * 4);                 \
            }                                                                                \
    }

/* AVX2: vpmaddubsw (pairs of u8 x s8 into int16), summed in int16 for Q4_1 (eight steps of
 * at most 2 * 15 * 127 stay below 2^15), then vpmaddwd into int32; Q8_0's int16 pairs
 * (up to 2 * 127 * 127) go to int32 at once.
 * The empty asm statements hold each running sum in a register, added in this order: left
 * free, GCC reassociates the integer sums into trees and keeps every product live, spilling
 * them to the stack (the sums, so the bits, are the same either way; docs/runtime.rst,
 * "Integer arithmetic", has the cost). */
static inline __m256i step_avx2(__m256i s, __m256i w, __m256i a) {
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w, a)); /* at most 8 * 2 * 15 * 127 */
    __asm__("" : "+x"(s));
    return s;
}
static inline __m256i finish_avx2(__m256i s) { return _mm256_madd_epi16(s, _mm256_set1_epi16(1)); }
static inline __m256i q4_avx2(const __m256i w[8], const int8_t *a) {
    __m256i s = _mm256_setzero_si256();
    for (int v = 0; v < 8; v++) s = step_avx2(s, w[v], broadcast4(a + 4 * v));
    return finish_avx2(s);
}
static inline __m256i q8_avx2(const __m256i c[16], const int8_t *a) {
    __m256i s = _mm256_setzero_si256();
    for (int v = 0; v < 8; v++) {
        const __m256i p = _mm256_maddubs_epi16(c[v], _mm256_sign_epi8(broadcast4(a + 4 * v), c[8 + v]));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
        __asm__("" : "+x"(s));
    }
    return s;
}
/* AVX2 unpacks every block in registers for all the rows: up to DIRECT_ROWS at once (their
 * sums and the codes fit the registers), else in tiles of TILE_ROWS. With the sums held in
 * registers, that was faster than unpacking a panel into memory and sharing each broadcast
 * between two panels at every row count measured (docs/runtime.rst, "Integer arithmetic"). */
#define AVX2_PANELS(name, sums, KIND)                                                        \
    ONE_PANEL panel_##name##_avx2(PANEL_ARGS) { PANEL_BODY(sums##_avx2, KIND, DIRECT_ROWS) } \
    ONE_PANEL tile_##name##_avx2(PANEL_ARGS) { PANEL_BODY(sums##_avx2, KIND, TILE_ROWS) }    \
    static void panels_##name##_avx2(PANELS_ARGS) {                                          \
        if (M <= DIRECT_ROWS)                                                                \
            PANELS(panel_##name##_avx2);                                                     \
        else                                                                                 \
            PANELS_IN_TILES(tile_##name##_avx2);                                             \
    }
AVX2_PANELS(q4, q4, 3)
AVX2_PANELS(q4h, q4, 12)
AVX2_PANELS(q8, q8, 4)
AVX2_PANELS(q8h, q8, 13)
static void panels_c(PANELS_ARGS) { PANELS(panel_c); }

/* VNNI, Q8_0: vpdpbusd multiplies unsigned by signed bytes, so the activation codes come
 * offset (u = a + 128, vs_linear_int8 flips their top bits) and the weight codes as they
 * are: sum u w - 128 sum w = sum a w, exactly. Each block's sums start from -128 sum w (its
 * eight rows' code sums, `fix`), formed by the first rows that reach the block and kept in
 * `codes` (one vector a block) for the others (without `codes`, for the direct rows, each
 * group forms its own). No sign instruction, which shares the multipliers' ports.
 * Rows [r, r + R), each block's sums in two chains (even and odd vectors) to hide
 * vpdpbusd's latency, the float accumulators in registers; `first`: the panel's first
 * rows. */
#define Q8_ROWS(DPBUSD, KIND, R)                                                             \
    do {                                                                                     \
        __m256 acc[R];                                                                       \
        for (int k = 0; k < R; k++) acc[k] = _mm256_setzero_ps();                            \
        for (int64_t i = 0; i < blocks; i++) {                                               \
            const uint8_t *head = panel + i * bytes;                                         \
            const __m256i *w = (const __m256i *)(head + HEAD_BYTES(KIND));                   \
            __m256i fix;                                                                     \
            if (first || codes == NULL) {                                                    \
                prefetch_ahead(head, AHEAD_BYTES, bytes);                                    \
                __m256i t = _mm256_setzero_si256();                                          \
                for (int v = 0; v < 8; v++) t = DPBUSD(t, ones, _mm256_loadu_si256(w + v)); \
                fix = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(t, 7));    \
                if (codes != NULL) _mm256_store_si256(codes + i, fix);                       \
            } else {                                                                         \
                fix = _mm256_load_si256(codes + i);                                          \
            }                                                                                \
            __m256i sum[R][2];                                                               \
            for (int k = 0; k < R; k++) sum[k][0] = fix, sum[k][1] = _mm256_setzero_si256(); \
            for (int v = 0; v < 8; v++) {                                                    \
                const __m256i wv = _mm256_loadu_si256(w + v);                                \
                for (int k = 0; k < R; k++)                                                  \
                    sum[k][v & 1] = DPBUSD(sum[k][v & 1],                                    \
                                           broadcast4(xq + (r + k) * K + 32 * i + 4 * v), wv); \
            }                                                                                \
            const __m256 dw = scales8(KIND, head, 0);                                        \
            for (int k = 0; k < R; k++) {                                                    \
                const __m256i t = _mm256_add_epi32(sum[k][0], sum[k][1]);                    \
                const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(xd[(r + k) * blocks + i])); \
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), scale, acc[k]);              \
            }                                                                                \
        }                                                                                    \
        for (int k = 0; k < R; k++) {                                                        \
            float out[PANEL];                                                                \
            _mm256_storeu_ps(out, _mm256_add_ps(acc[k], _mm256_loadu_ps(b)));                \
            memcpy(y + (r + k) * ldy + n0, out, (size_t)n * 4);                              \
        }                                                                                    \
        r += R, first = 0;                                                                   \
    } while (0)

/* One Q8_0 panel against rows [r0, r1) by Q8_ROWS, four rows at a time (eight sums and
 * four accumulators: more rows spilled to the stack with AVX-512's 32 registers; with
 * AVX-VNNI's 16 these four spill their accumulators, unmeasured), then 2 and 1. */
#define Q8_BODY(DPBUSD, KIND)                                                                \
    const int64_t bytes = vs_panel_bytes(KIND);                                              \
    const __m256i ones = _mm256_set1_epi8(1);                                                \
    float b[PANEL] = {0};                                                                    \
    const int64_t n = n0 + PANEL <= N ? PANEL : N - n0;                                      \
    if (bias != NULL) memcpy(b, bias + n0, (size_t)n * 4);                                   \
    (void)xs;                                                                                \
    int first = 1;                                                                           \
    int64_t r = r0;                                                                          \
    while (r + 4 <= r1) Q8_ROWS(DPBUSD, KIND, 4);                                            \
    if (r + 2 <= r1) Q8_ROWS(DPBUSD, KIND, 2);                                               \
    if (r < r1) Q8_ROWS(DPBUSD, KIND, 1);

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define VS_HAVE_VNNI 1
/* One panel by BODY (format `name`), and a thread's share of panels. Up to DIRECT rows run
 * in a copy of their own: knowing that, GCC keeps their codes and sums in registers
 * (without it, it kept the unpacked codes in memory: docs/runtime.rst, "Integer
 * arithmetic"). */
#define VNNI_PANELS(suffix, isa, name, DIRECT, BODY)                                         \
    __attribute__((target(isa))) ONE_PANEL panel_##name##_##suffix(PANEL_ARGS) { BODY }      \
    __attribute__((target(isa))) static void panels_##name##_##suffix(PANELS_ARGS) {         \
        if (M <= (DIRECT))                                                                   \
            PANELS(panel_##name##_##suffix);                                                 \
        else                                                                                 \
            PANELS(panel_##name##_##suffix);                                                 \
    }
/* VNNI: vpdpbusd sums four u8 x s8 products into each int32 lane; up to `rows` rows unpack
 * each block in registers. */
#define VNNI_SUMS(suffix, isa, dpbusd, rows)                                                 \
    __attribute__((target(isa))) static inline __m256i q4_##suffix(const __m256i w[8],   \
                                                                      const int8_t *a) {     \
        __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};                     \
        for (int v = 0; v < 8; v++) s[v & 1] = dpbusd(s[v & 1], w[v], broadcast4(a + 4 * v)); \
        return _mm256_add_epi32(s[0], s[1]);                                                 \
    }                                                                                        \
    VNNI_PANELS(suffix, isa, q4, rows, PANEL_BODY(q4_##suffix, 3, rows))                     \
    VNNI_PANELS(suffix, isa, q4h, rows, PANEL_BODY(q4_##suffix, 12, rows))                   \
    VNNI_PANELS(suffix, isa, q8, rows, Q8_BODY(dpbusd, 4))                                   \
    VNNI_PANELS(suffix, isa, q8h, rows, Q8_BODY(dpbusd, 13))                                 \
    __attribute__((target(isa))) static inline __m256i step_##suffix(__m256i s, __m256i w,   \
                                                                     __m256i a) {            \
        return dpbusd(s, w, a);                                                              \
    }                                                                                        \
    __attribute__((target(isa))) static inline __m256i finish_##suffix(__m256i s) {          \
        return s;                                                                            \
    }                                                                                        \
    __attribute__((target(isa))) static void pair_q4_##suffix(PAIR_ARGS) {                   \
        PAIR_BODY(step_##suffix, finish_##suffix, 3)                                         \
    }                                                                                        \
    __attribute__((target(isa))) static void pair_q4h_##suffix(PAIR_ARGS) {                  \
        PAIR_BODY(step_##suffix, finish_##suffix, 12)                                        \
    }
/* The direct rows of each path: vs_linear_int8 buffers codes past the same numbers. */
VNNI_SUMS(avxvnni, "avxvnni", _mm256_dpbusd_avx_epi32, DIRECT_ROWS)
VNNI_SUMS(avx512vnni, "avx512vnni,avx512vl", _mm256_dpbusd_epi32, WIDE_DIRECT_ROWS)
#endif

/* -- paths ------------------------------------------------------------------------------ */

enum { PATH_C = 0, PATH_AVX2 = 1, PATH_AVXVNNI = 2, PATH_AVX512VNNI = 3 };
typedef void (*panels_fn)(PANELS_ARGS);
static int chosen = -1; /* the path in use (-1: not chosen yet) */

/* Bit p set where path p runs on this CPU (0 portable, 1 AVX2, 2 AVX-VNNI, 3 AVX512-VNNI). */
int vs_int8_paths(void) {
    int paths = 1 << PATH_C | 1 << PATH_AVX2;
#ifdef VS_HAVE_VNNI
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avxvnni")) paths |= 1 << PATH_AVXVNNI;
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl"))
        paths |= 1 << PATH_AVX512VNNI;
#endif
    return paths;
}

/* The path in use: the fastest this CPU runs unless vs_int8_use_path chose one. */
int vs_int8_path(void) {
    if (chosen < 0) {
        const int paths = vs_int8_paths();
        chosen = paths & 1 << PATH_AVX512VNNI ? PATH_AVX512VNNI
                 : paths & 1 << PATH_AVXVNNI  ? PATH_AVXVNNI
                                              : PATH_AVX2;
    }
    return chosen;
}

/* Use path p from now on (tests compare the paths); -1: back to the default. Returns 0, or
 * -1 if this CPU cannot run p. */
int vs_int8_use_path(int p) {
    if (p == -1) { chosen = -1; return 0; }
    if (p < 0 || p > 3 || !(vs_int8_paths() & 1 << p)) return -1;
    chosen = p;
    return 0;
}

typedef void (*pair_fn)(PAIR_ARGS);

/* The two-panel Q4_1 product of a VNNI path (NULL for the others: AVX2 keeps every row's
 * product in registers, the portable path goes lane by lane). */
static pair_fn pair_for(int path, int kind) {
#ifdef VS_HAVE_VNNI
    const int half = IS_HALF(kind);
    if (path == PATH_AVXVNNI) return half ? pair_q4h_avxvnni : pair_q4_avxvnni;
    if (path == PATH_AVX512VNNI) return half ? pair_q4h_avx512vnni : pair_q4_avx512vnni;
#endif
    (void)path, (void)kind;
    return NULL;
}

/* The C code's product of a thread's share of panels, by path and format. */
#define BY_KIND(q4, q4h, q8, q8h) \
    (kind == 3 ? q4 : kind == 12 ? q4h : kind == 4 ? q8 : q8h)
static panels_fn panels_for(int path, int kind) {
    switch (path) {
    case PATH_C: return panels_c;
#ifdef VS_HAVE_VNNI
    case PATH_AVXVNNI:
        return BY_KIND(panels_q4_avxvnni, panels_q4h_avxvnni, panels_q8_avxvnni, panels_q8h_avxvnni);
    case PATH_AVX512VNNI:
        return BY_KIND(panels_q4_avx512vnni, panels_q4h_avx512vnni, panels_q8_avx512vnni,
                       panels_q8h_avx512vnni);
#endif
    default: return BY_KIND(panels_q4_avx2, panels_q4h_avx2, panels_q8_avx2, panels_q8h_avx2);
    }
}

/* x's rows as codes (q: M x K int8; d, s: M x K/32 float), on the path's instructions. */
int vs_quantize_rows(const float *x, int64_t M, int64_t K, int8_t *q, float *d, float *s) {
    if (K % 32 != 0) return -1;
    const int portable = vs_int8_path() == PATH_C;
    for (int64_t r = 0; r < M; r++)
        (portable ? quantize_row_c : quantize_row_avx2)(x + r * K, K, q + r * K, d + r * (K / 32),
                                                         s + r * (K / 32));
    return 0;
}

/* y (M x N) = x (M x K) W^T + bias, W as panels of `kind` (3, 4, 12 or 13), on `threads`
 * threads.
 * Returns 0, or -1 on a bad kind or K, or no memory. */
int vs_linear_int8(int kind, const float *x, int64_t M, int64_t K, const void *weight,
                   int64_t N, const float *bias, float *y, int threads) {
    if (vs_panel_bytes(kind) == 0 || K % 32 != 0 || M < 1) return -1;
    const int64_t blocks = K / 32, panels = (N + PANEL - 1) / PANEL;
    int8_t *xq = NULL;
    if (posix_memalign((void **)&xq, 64, (size_t)(M * K + 8 * M * blocks)) != 0) return -1;
    float *xd = (float *)(xq + M * K), *xs = xd + M * blocks; /* M K is a multiple of 32 */
    vs_quantize_rows(x, M, K, xq, xd, xs);
    const int path = vs_int8_path();
    const int vnni = path == PATH_AVXVNNI || path == PATH_AVX512VNNI;
    if (vnni && !IS_Q4(kind)) /* Q8_BODY's offset codes a + 128: the top bit flipped */
        for (int64_t e = 0; e < M * K; e++) xq[e] = (int8_t)((uint8_t)xq[e] ^ 0x80);
    const panels_fn fn = panels_for(path, kind);
    const int64_t panel_bytes = blocks * vs_panel_bytes(kind);
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        /* Q4_1: a panel pair's codes, unpacked (16 vectors a block); Q8_0: each block's
         * -128 sum w (one vector). Only on a VNNI path where more than its direct rows run
         * (the rows VNNI_SUMS gives that path; fewer, and AVX2's row tiles, unpack in
         * registers). */
        __m256i *codes = NULL;
        const int64_t direct = path == PATH_AVX512VNNI ? WIDE_DIRECT_ROWS : DIRECT_ROWS;
        const int buffered = vnni && M > direct;
        if (buffered && posix_memalign((void **)&codes, 64, (size_t)blocks * 16 * 32) != 0) {
#pragma omp atomic write
            failed = 1;
            codes = NULL;
        }
        /* VNNI, Q4_1 past the direct rows: panels two at a time (a last odd one
         * alone) */
        const pair_fn pair = IS_Q4(kind) && buffered ? pair_for(path, kind) : NULL;
        const uint8_t *w = (const uint8_t *)weight;
        if (pair == NULL) { /* a contiguous share of the panels for each thread */
            int64_t p0, p1;
            thread_share(panels, &p0, &p1);
            if (!buffered || codes != NULL)
                fn(kind, w, panel_bytes, p0, p1, blocks, xq, xd, xs, K, M, y, N, bias, codes);
        } else {
#pragma omp for schedule(static)
            for (int64_t u = 0; u < (panels + 1) / 2; u++) {
                if (codes == NULL) continue;
                if (2 * u + 1 == panels)
                    fn(kind, w, panel_bytes, 2 * u, 2 * u + 1, blocks, xq, xd, xs, K, M, y, N,
                       bias, codes);
                else
                    pair(w + 2 * u * panel_bytes, w + (2 * u + 1) * panel_bytes, blocks, xq,
                         xd, xs, K, 0, M, y, N, 2 * u * PANEL, N, bias, codes);
            }
        }
        free(codes);
    }
    free(xq);
    return failed ? -1 : 0;
}
