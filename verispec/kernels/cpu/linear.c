/* verispec's CPU weight products: y = x W^T (+ bias) with W stored as float32 or in the
 * blocked low-bit formats of GGUF files (Q4_1, Q8_0), read straight from memory.
 *
 * Built at first use by verispec/models/cpu_linear.py (cc -O3 -march=native -fopenmp,
 * -ffp-contract=off) and called through ctypes. The one summation order: an output y[m, n]
 * keeps four partial sums p_0..p_3 (eight lanes each); p_g runs over the blocks of 32
 * inner indices in order, taking quarter g of each block (indices 32 i + 8 g .. + 8), one
 * fused multiply-add per step; y = hsum8((p_0 + p_1) + (p_2 + p_3)) + bias, with one fixed
 * horizontal sum. Its bits depend on x[m], W[n] and K only, never on how many rows or
 * columns are computed with it, on the path (registers for up to REG_ROWS rows, a widened
 * buffer beyond), the tiling or the thread count. Four independent chains keep the FMA
 * units busy where one chain would wait on its own latency. A low-bit weight is widened to
 * float32 exactly as the loader dequantized it, so a Q4_1 matrix and its float32
 * dequantization give the same bits.
 *
 * Formats (K is a multiple of 32; one block covers 32 weights of a row):
 *   0  float32   W[N][K]
 *   1  Q4_1      struct { float d, m; uint8 q[16]; }  w[i] = q_i * d + m, q_i in 0..15:
 *                byte j holds q_j (low nibble) and q_{j+16} (high nibble)
 *   2  Q8_0      struct { float d; int8 q[32]; }       w[i] = q_i * d
 *   3, 4         Q4_1 / Q8_0 in panels of eight rows, multiplied in integers
 *                (arithmetic="int8"): handed to vs_linear_int8 (kernels/cpu/int8.c); 12 and
 *                13 the same with half-precision scales
 *   5  Q8_2      struct { float d[2], m[2]; int8 q[32]; }  w[i] = q_i * d[h] + m[h], h = i / 16:
 *                the layout every GGUF block format widens into exactly (the K-quants'
 *                16-weight sub-blocks, 5- and 6-bit codes, IQ4's table values); read from
 *                the file (verispec/models/gguf_rows.py)
 *   6  Q5_1      struct { float d, m; uint32 qh; uint8 q[16]; }  w[i] = q_i * d + m, q_i in
 *                0..31: Q4_1's nibbles, and bit i of qh is q_i's fifth bit (GGUF's Q5_0, Q5_1
 *                and Q5_K rows)
 *   7  Q8_16     struct { float d[2]; int8 q[32]; }  w[i] = q_i * d[h], h = i / 16: Q8_0 with a
 *                scale for each 16 weights (GGUF's Q6_K and Q3_K rows)
 *   8  F16       uint16 W[N][K], IEEE half precision (needs F16C; vs_block_bytes(8) is 0
 *                where the build has none)
 *   9  BF16      uint16 W[N][K], bfloat16: a float32's upper half
 *                Both widen exactly (every half and every bfloat16 is a float32).
 *  10  Q4_0      struct { float d; uint8 q[16]; }  w[i] = (q_i - 8) * d, q_i in 0..15, nibbles
 *                as Q4_1's: GGUF's Q4_0 at 0.625 bytes a weight (0.75 as Q4_1 with m = -8 d)
 */
#include "simd.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct { float d, m; uint8_t q[16]; } block_q4_1;
typedef struct { float d; int8_t q[32]; } block_q8_0;
typedef struct { float d[2], m[2]; int8_t q[32]; } block_q8_2;
typedef struct { float d, m; uint32_t qh; uint8_t q[16]; } block_q5_1;
typedef struct { float d[2]; int8_t q[32]; } block_q8_16;
typedef struct { float d; uint8_t q[16]; } block_q4_0;

int vs_block_bytes(int kind) {
    return kind == 1 ? (int)sizeof(block_q4_1)
         : kind == 2 ? (int)sizeof(block_q8_0)
         : kind == 5 ? (int)sizeof(block_q8_2)
         : kind == 6 ? (int)sizeof(block_q5_1)
         : kind == 7 ? (int)sizeof(block_q8_16)
         : kind == 10 ? (int)sizeof(block_q4_0)
#if defined(__F16C__)
         : kind == 8 ? 64
#endif
         : kind == 9 ? 64 : 0;
}


/* Eight widened weights: q * d + m for Q4_1 (q * d is exact in float32: a 4-bit code times
 * a scale of at most 20 significant bits, so the fused form rounds once, as q * d + m does
 * after an exact product), q * d for Q8_0. */
static inline __m256 widen_q4_1(__m256i q, __m256 d, __m256 m) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d, m);
}
static inline __m256 widen_q8_0(const int8_t *q, __m256 d) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))), d);
}
/* Eight bfloat16 or half-precision weights, widened exactly. */
static inline __m256 widen_bf16(const uint16_t *g) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)g));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
#if defined(__F16C__)
#define F16_KIND(kind) ((kind) == 8)
static inline __m256 widen_f16(const uint16_t *g) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g));
}
#else
#define F16_KIND(kind) 0
static inline __m256 widen_f16(const uint16_t *g) { (void)g; return _mm256_setzero_ps(); }
#endif

/* Eight Q8_2 weights: q * d + m in one rounding. The loader's q * d is exact for every
 * format held so except Q6_K's (6-bit codes times an 8-bit scale of a float16), whose m is
 * -0: then q * d + m rounds the product once, as the loader does, zero's sign included. */
static inline __m256 widen_q8_2(const int8_t *q, const float *d, const float *m) {
    const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
    return _mm256_fmadd_ps(c, _mm256_broadcast_ss(d), _mm256_broadcast_ss(m));
}

/* The one summation order: an output's four partial sums p_g run over the blocks of 32
 * weights in order, p_g taking the block's quarter g (eight lanes); the result is
 * hsum8((p0 + p1) + (p2 + p3)) + bias. */
static inline float finish(__m256 p0, __m256 p1, __m256 p2, __m256 p3, float bias) {
    return hsum8(_mm256_add_ps(_mm256_add_ps(p0, p1), _mm256_add_ps(p2, p3))) + bias;
}

/* The functions a format's product runs through are inlined into one copy per format
 * (KIND_COPIES below), where `kind` is a constant: the format tests in HALF and BLOCK16
 * fold away there, instead of a chain of tests for every block of every row
 * (docs/runtime.rst has what the chain cost). */
#define FOLDED static inline __attribute__((always_inline))

/* The few-row path asks for the weights this many bytes ahead of the row it widens
 * (software prefetch): with one or two rows the widening leaves the core too few loads in
 * flight to keep the memory busy on its own (docs/runtime.rst, "Prefetching"). */
#define AHEAD_BYTES 2048

/* CALL for each weight row n in [n0, n1) of `weight` (row stride row_bytes), with w its
 * bytes and b its bias, after asking for the bytes AHEAD_BYTES further on. */
#define EACH_ROW(CALL)                                                                       \
    for (int64_t n = n0; n < n1; n++) {                                                      \
        const uint8_t *w = weight + n * row_bytes;                                           \
        prefetch_ahead(w, AHEAD_BYTES, row_bytes);                                           \
        const float b = bias ? bias[n] : 0.0f;                                               \
        CALL;                                                                                \
    }
#define RANGE_ARGS                                                                           \
    int kind, const float *restrict x, int64_t M, const uint8_t *weight, int64_t row_bytes,  \
        int64_t K, float *restrict y, int64_t ldy, const float *bias, int64_t n0, int64_t n1

/* Quarters h and h + 2 of block i of a weight row, widened (any format). A Q4_1 block's
 * byte j holds q_j (low nibble) and q_{j+16} (high), so both quarters come from bytes
 * 8 h .. 8 h + 7: their low and their high nibbles. */
#define HALF(kind, w, i, h, wa, wb)                                                          \
    do {                                                                                     \
        if ((kind) == 1) {                                                                   \
            const block_q4_1 *b_ = (const block_q4_1 *)(w) + (i);                            \
            const __m256 d_ = _mm256_broadcast_ss(&b_->d), m_ = _mm256_broadcast_ss(&b_->m); \
            const __m128i q_ = _mm_loadl_epi64((const __m128i *)(b_->q + 8 * (h)));         \
            const __m256i c_ = _mm256_cvtepu8_epi32(q_);                                     \
            wa = widen_q4_1(_mm256_and_si256(c_, _mm256_set1_epi32(0x0F)), d_, m_);          \
            wb = widen_q4_1(_mm256_srli_epi32(c_, 4), d_, m_);                               \
        } else if ((kind) == 10) { /* Q4_1's widening with m = -8 d (exact: a power of two) */\
            const block_q4_0 *b_ = (const block_q4_0 *)(w) + (i);                            \
            const __m256 d_ = _mm256_broadcast_ss(&b_->d);                                   \
            const __m256 m_ = _mm256_mul_ps(d_, _mm256_set1_ps(-8.0f));                      \
            const __m128i q_ = _mm_loadl_epi64((const __m128i *)(b_->q + 8 * (h)));         \
            const __m256i c_ = _mm256_cvtepu8_epi32(q_);                                     \
            wa = widen_q4_1(_mm256_and_si256(c_, _mm256_set1_epi32(0x0F)), d_, m_);          \
            wb = widen_q4_1(_mm256_srli_epi32(c_, 4), d_, m_);                               \
        } else if ((kind) == 2) {                                                            \
            const block_q8_0 *b_ = (const block_q8_0 *)(w) + (i);                            \
            const __m256 d_ = _mm256_broadcast_ss(&b_->d);                                   \
            wa = widen_q8_0(b_->q + 8 * (h), d_), wb = widen_q8_0(b_->q + 8 * (h) + 16, d_); \
        } else if ((kind) == 5) {                                                            \
            const block_q8_2 *b_ = (const block_q8_2 *)(w) + (i);                            \
            wa = widen_q8_2(b_->q + 8 * (h), b_->d, b_->m);                                  \
            wb = widen_q8_2(b_->q + 8 * (h) + 16, b_->d + 1, b_->m + 1);                     \
        } else if ((kind) == 9) { /* bfloat16: the upper half of a float32 */                \
            const uint16_t *g_ = (const uint16_t *)(w) + 32 * (i) + 8 * (h);                 \
            wa = widen_bf16(g_), wb = widen_bf16(g_ + 16);                                   \
        } else if (F16_KIND(kind)) {                                                         \
            const uint16_t *g_ = (const uint16_t *)(w) + 32 * (i) + 8 * (h);                 \
            wa = widen_f16(g_), wb = widen_f16(g_ + 16);                                     \
        } else if ((kind) == 7) {                                                            \
            const block_q8_16 *b_ = (const block_q8_16 *)(w) + (i);                          \
            wa = widen_q8_0(b_->q + 8 * (h), _mm256_broadcast_ss(b_->d));                    \
            wb = widen_q8_0(b_->q + 8 * (h) + 16, _mm256_broadcast_ss(b_->d + 1));           \
        } else if ((kind) == 6) { /* fifth bits: lane j of quarter h is bit 8 h + j */       \
            const block_q5_1 *b_ = (const block_q5_1 *)(w) + (i);                            \
            const __m256 d_ = _mm256_broadcast_ss(&b_->d), m_ = _mm256_broadcast_ss(&b_->m); \
            const __m256i c_ = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b_->q + 8 * (h))));\
            const __m256i s_ = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),   \
                                                _mm256_set1_epi32(8 * (h)));                 \
            const __m256i f_ = _mm256_srlv_epi32(_mm256_set1_epi32((int)b_->qh), s_);        \
            const __m256i one_ = _mm256_set1_epi32(1);                                       \
            wa = widen_q4_1(_mm256_or_si256(_mm256_and_si256(c_, _mm256_set1_epi32(0x0F)),   \
                                            _mm256_slli_epi32(_mm256_and_si256(f_, one_), 4)), d_, m_);\
            wb = widen_q4_1(_mm256_or_si256(_mm256_srli_epi32(c_, 4),                        \
                                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(f_, 16), one_), 4)), d_, m_);\
        } else {                                                                             \
            const float *f_ = (const float *)(w) + 32 * (i) + 8 * (h);                       \
            wa = _mm256_loadu_ps(f_), wb = _mm256_loadu_ps(f_ + 16);                          \
        }                                                                                    \
    } while (0)

/* The widened quarters of block i of a weight row (any format). */
#define QUARTERS(kind, w, i, w0, w1, w2, w3)                                                 \
    do {                                                                                     \
        HALF(kind, w, i, 0, w0, w2);                                                         \
        HALF(kind, w, i, 1, w1, w3);                                                         \
    } while (0)

/* Row n of a blocked matrix, widened to float32 into out[0..K). */
FOLDED void dequant_row(int kind, const uint8_t *row, int64_t K, float *out) {
    for (int64_t i = 0; i < K / 32; i++, out += 32) {
        __m256 w0, w1, w2, w3;
        QUARTERS(kind, row, i, w0, w1, w2, w3);
        _mm256_storeu_ps(out, w0), _mm256_storeu_ps(out + 8, w1);
        _mm256_storeu_ps(out + 16, w2), _mm256_storeu_ps(out + 24, w3);
    }
}

/* One row of x against one weight row, widened in registers (no buffer): four independent
 * chains keep the FMA units busy where one chain would wait on its own latency. */
FOLDED float row_dot(int kind, const float *restrict x, const uint8_t *w, int64_t K, float bias) {
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
    for (int64_t i = 0; i < K / 32; i++) {
        const float *xb = x + 32 * i;
        __m256 w0, w1, w2, w3;
        QUARTERS(kind, w, i, w0, w1, w2, w3);
        p0 = _mm256_fmadd_ps(_mm256_loadu_ps(xb), w0, p0);
        p1 = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), w1, p1);
        p2 = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16), w2, p2);
        p3 = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 24), w3, p3);
    }
    return finish(p0, p1, p2, p3, bias);
}

/* Two rows of x (row stride K) against one weight row: row_dot's chains, each block
 * widened once for both. */
FOLDED void rows2_dot(int kind, const float *restrict x, const uint8_t *w, int64_t K,
                      float *restrict y, int64_t ldy, float bias) {
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
    __m256 r0 = p0, r1 = p0, r2 = p0, r3 = p0;
    const float *x1 = x + K;
    for (int64_t i = 0; i < K / 32; i++) {
        __m256 w0, w1, w2, w3;
        QUARTERS(kind, w, i, w0, w1, w2, w3);
        p0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + 32 * i), w0, p0);
        p1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + 32 * i + 8), w1, p1);
        p2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + 32 * i + 16), w2, p2);
        p3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + 32 * i + 24), w3, p3);
        r0 = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + 32 * i), w0, r0);
        r1 = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + 32 * i + 8), w1, r1);
        r2 = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + 32 * i + 16), w2, r2);
        r3 = _mm256_fmadd_ps(_mm256_loadu_ps(x1 + 32 * i + 24), w3, r3);
    }
    y[0] = finish(p0, p1, p2, p3, bias);
    y[ldy] = finish(r0, r1, r2, r3, bias);
}

/* MR rows of x (row stride K) against one weight row, widened in registers: row_dot's
 * chains, two at a time (p_0 and p_2 over the whole row, then p_1 and p_3), so that the
 * 2 MR accumulators fit in registers; each block is widened once in all (half of it per
 * pass; the row's blocks are in L1 for the second). */
#define HALVES(MR)                                                                           \
    FOLDED void rows##MR##_dot(int kind, const float *restrict x, const uint8_t *w,          \
                               int64_t K, float *restrict y, int64_t ldy, float bias) {      \
        __m256 part[4][MR];                                                                  \
        for (int h = 0; h < 2; h++) {                                                        \
            __m256 a[MR], b[MR];                                                             \
            for (int r = 0; r < MR; r++) a[r] = b[r] = _mm256_setzero_ps();                  \
            for (int64_t i = 0; i < K / 32; i++) {                                           \
                __m256 wa, wb;                                                               \
                HALF(kind, w, i, h, wa, wb);                                                 \
                for (int r = 0; r < MR; r++) {                                               \
                    const float *xb = x + r * K + 32 * i + 8 * h;                            \
                    a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), wa, a[r]);                   \
                    b[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16), wb, b[r]);              \
                }                                                                            \
            }                                                                                \
            for (int r = 0; r < MR; r++) part[h][r] = a[r], part[h + 2][r] = b[r];           \
        }                                                                                    \
        for (int r = 0; r < MR; r++)                                                         \
            y[r * ldy] = finish(part[0][r], part[1][r], part[2][r], part[3][r], bias);       \
    }
HALVES(3) HALVES(4) HALVES(5) HALVES(6)

/* M rows of x (row stride K), 1 <= M <= REG_ROWS, against weight rows [n0, n1): one loop
 * for each M, so that the format and M are constants inside it and only the product runs
 * for each weight row. */
FOLDED void rows_range(RANGE_ARGS) {
    switch (M) {
    case 1: EACH_ROW(y[n] = row_dot(kind, x, w, K, b)); break;
    case 2: EACH_ROW(rows2_dot(kind, x, w, K, y + n, ldy, b)); break;
    case 3: EACH_ROW(rows3_dot(kind, x, w, K, y + n, ldy, b)); break;
    case 4: EACH_ROW(rows4_dot(kind, x, w, K, y + n, ldy, b)); break;
    case 5: EACH_ROW(rows5_dot(kind, x, w, K, y + n, ldy, b)); break;
    default: EACH_ROW(rows6_dot(kind, x, w, K, y + n, ldy, b)); break;
    }
}

#if defined(__AVX512F__)
/* Where the compiler may use AVX-512 (-march=native on such a CPU), the few-row products
 * keep the same chains in 16-lane registers: lo holds p_0 | p_1 (a block's indices 0..15),
 * hi holds p_2 | p_3 (16..31), so every lane runs the fused multiply-adds it runs in the
 * eight-lane code, in the same order, and finish16 adds the same four vectors the same way:
 * the same bits, half the instructions. A Q4_1 block's 16 bytes widen at once: their low
 * nibbles are weights 0..15, their high nibbles 16..31. The later formats (Q8_2, Q5_1,
 * Q8_16, F16, BF16, Q4_0) are widened by the eight-lane code and joined: the same values
 * by construction. */
#define IOTA16 _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
/* Two eight-lane vectors as one sixteen-lane one (a in lanes 0..7). */
static inline __m512 join8(__m256 a, __m256 b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(a)),
                                               _mm256_castps_pd(b), 1));
}
#define BLOCK16(kind, w, i, lo, hi)                                                          \
    do {                                                                                     \
        if ((kind) == 1) {                                                                   \
            const block_q4_1 *b_ = (const block_q4_1 *)(w) + (i);                            \
            const __m512 d_ = _mm512_set1_ps(b_->d), m_ = _mm512_set1_ps(b_->m);             \
            const __m512 t_ = _mm512_fmadd_ps(IOTA16, d_, m_); /* the 16 values q d + m */   \
            const __m512i c_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b_->q)); \
            lo = _mm512_permutexvar_ps(c_, t_); /* reads the low 4 bits: the low nibble */   \
            hi = _mm512_permutexvar_ps(_mm512_srli_epi32(c_, 4), t_);                        \
        } else if ((kind) == 2) {                                                            \
            const block_q8_0 *b_ = (const block_q8_0 *)(w) + (i);                            \
            const __m512 d_ = _mm512_set1_ps(b_->d);                                         \
            lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b_->q))), d_); \
            hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b_->q + 16)))), d_); \
        } else if ((kind) >= 5) { /* the later formats: eight lanes at a time, joined */      \
            __m256 a0_, a1_, a2_, a3_;                                                       \
            QUARTERS(kind, w, i, a0_, a1_, a2_, a3_);                                        \
            lo = join8(a0_, a1_), hi = join8(a2_, a3_);                                      \
        } else {                                                                             \
            const float *f_ = (const float *)(w) + 32 * (i);                                 \
            lo = _mm512_loadu_ps(f_), hi = _mm512_loadu_ps(f_ + 16);                          \
        }                                                                                    \
    } while (0)

static inline __m256 upper8(__m512 v) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}
static inline float finish16(__m512 lo, __m512 hi, float bias) {
    return finish(_mm512_castps512_ps256(lo), upper8(lo), _mm512_castps512_ps256(hi), upper8(hi), bias);
}

/* MR rows of x (row stride K) against one weight row, each block widened once for all MR
 * rows; 2 MR accumulators of the 32 registers. (Two weight rows at a time for a single row,
 * for more independent chains, ran 1.4x slower on the Zen 5 EPYC.) */
#define ROWS16(MR)                                                                           \
    FOLDED void rows16_##MR(int kind, const float *restrict x, const uint8_t *w, int64_t K,  \
                            float *restrict y, int64_t ldy, float bias) {                    \
        __m512 lo[MR], hi[MR];                                                               \
        for (int r = 0; r < MR; r++) lo[r] = hi[r] = _mm512_setzero_ps();                    \
        for (int64_t i = 0; i < K / 32; i++) {                                               \
            __m512 wl, wh;                                                                   \
            BLOCK16(kind, w, i, wl, wh);                                                     \
            for (int r = 0; r < MR; r++) {                                                   \
                const float *xb = x + r * K + 32 * i;                                        \
                lo[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xb), wl, lo[r]);                     \
                hi[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xb + 16), wh, hi[r]);                \
            }                                                                                \
        }                                                                                    \
        for (int r = 0; r < MR; r++) y[r * ldy] = finish16(lo[r], hi[r], bias);              \
    }
ROWS16(1) ROWS16(2) ROWS16(3) ROWS16(4) ROWS16(5) ROWS16(6)
ROWS16(7) ROWS16(8) ROWS16(9) ROWS16(10) ROWS16(11) ROWS16(12)

/* Up to this many rows, a block is widened once for all of them in 16-lane registers; on
 * the Zen 5 EPYC (one SmolLM2 forward's products, one thread) 3 to 12 rows cost 4 to 20 %
 * less than the eight-lane code; 16 rows in two such groups cost 12 % more than the buffer. */
#define REG_ROWS16 12

/* M rows (1 <= M <= REG_ROWS16) of x (row stride K) against weight rows [n0, n1), one loop
 * for each M (as rows_range). */
FOLDED void rows16_range(RANGE_ARGS) {
    switch (M) {
    case 1: EACH_ROW(rows16_1(kind, x, w, K, y + n, ldy, b)); break;
    case 2: EACH_ROW(rows16_2(kind, x, w, K, y + n, ldy, b)); break;
    case 3: EACH_ROW(rows16_3(kind, x, w, K, y + n, ldy, b)); break;
    case 4: EACH_ROW(rows16_4(kind, x, w, K, y + n, ldy, b)); break;
    case 5: EACH_ROW(rows16_5(kind, x, w, K, y + n, ldy, b)); break;
    case 6: EACH_ROW(rows16_6(kind, x, w, K, y + n, ldy, b)); break;
    case 7: EACH_ROW(rows16_7(kind, x, w, K, y + n, ldy, b)); break;
    case 8: EACH_ROW(rows16_8(kind, x, w, K, y + n, ldy, b)); break;
    case 9: EACH_ROW(rows16_9(kind, x, w, K, y + n, ldy, b)); break;
    case 10: EACH_ROW(rows16_10(kind, x, w, K, y + n, ldy, b)); break;
    case 11: EACH_ROW(rows16_11(kind, x, w, K, y + n, ldy, b)); break;
    default: EACH_ROW(rows16_12(kind, x, w, K, y + n, ldy, b)); break;
    }
}
#endif

/* MR rows of x (row stride K) against NR_ float32 weight rows (row stride K): the chains of
 * row_dot, one quarter g at a time (so that MR x NR_ accumulators fit in registers), each
 * loaded vector used NR_ or MR times. */
#define MICRO(MR, NR_)                                                                       \
    static void micro_##MR##x##NR_(const float *restrict x, const float *restrict w,         \
                                   int64_t K, float *restrict y, int64_t ldy,                \
                                   const float *restrict bias) {                             \
        __m256 part[4][MR][NR_];                                                             \
        for (int g = 0; g < 4; g++) {                                                        \
            __m256 acc[MR][NR_];                                                             \
            for (int i = 0; i < MR; i++)                                                     \
                for (int j = 0; j < NR_; j++) acc[i][j] = _mm256_setzero_ps();               \
            for (int64_t k = 8 * g; k < K; k += 32) {                                        \
                __m256 wv[NR_];                                                              \
                for (int j = 0; j < NR_; j++) wv[j] = _mm256_loadu_ps(w + j * K + k);        \
                for (int i = 0; i < MR; i++) {                                               \
                    const __m256 xv = _mm256_loadu_ps(x + i * K + k);                        \
                    for (int j = 0; j < NR_; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]); \
                }                                                                            \
            }                                                                                \
            for (int i = 0; i < MR; i++)                                                     \
                for (int j = 0; j < NR_; j++) part[g][i][j] = acc[i][j];                     \
        }                                                                                    \
        for (int i = 0; i < MR; i++)                                                         \
            for (int j = 0; j < NR_; j++)                                                    \
                y[i * ldy + j] = finish(part[0][i][j], part[1][i][j], part[2][i][j],         \
                                        part[3][i][j], bias ? bias[j] : 0.0f);               \
    }
MICRO(1, 4) MICRO(2, 4) MICRO(3, 4) MICRO(1, 1) MICRO(2, 1) MICRO(3, 1)

#define NR 4       /* weight rows per tile of the many-row path */
/* Up to this many rows, weights are widened in registers (rows_dot); beyond, four weight
 * rows at a time into a buffer for the tiles. On the AVX2 EPYC (one SmolLM2 forward's
 * products, one thread): 3 to 6 rows in registers cost 18 to 28 % less than pairs and the
 * buffer did; from 7 rows on, groups of at most six rows were no better than the buffer. */
#define REG_ROWS 6

static void tile(const float *x, int64_t M, int64_t K, const float *w, int nr, float *y,
                 int64_t N, const float *bias) {
    /* rows in threes, but never a lone last row after them (4 = 2 + 2, 7 = 3 + 2 + 2) */
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

/* One copy of the few-row product and of the widening per format (FOLDED above). */
typedef void (*few_rows_fn)(const float *restrict, int64_t, const uint8_t *, int64_t, int64_t,
                            float *restrict, int64_t, const float *, int64_t, int64_t);
typedef void (*widen_fn)(const uint8_t *, int64_t, float *);
#if defined(__AVX512F__)
#define FEW_ROWS rows16_range
#else
#define FEW_ROWS rows_range
#endif
#define KIND_COPIES(k)                                                                       \
    static void few_rows_##k(const float *restrict x, int64_t M, const uint8_t *weight,      \
                             int64_t row_bytes, int64_t K, float *restrict y, int64_t ldy,   \
                             const float *bias, int64_t n0, int64_t n1) {                    \
        FEW_ROWS(k, x, M, weight, row_bytes, K, y, ldy, bias, n0, n1);                       \
    }                                                                                        \
    static void widen_##k(const uint8_t *row, int64_t K, float *out) { dequant_row(k, row, K, out); }
KIND_COPIES(0) KIND_COPIES(1) KIND_COPIES(2) KIND_COPIES(5) KIND_COPIES(6) KIND_COPIES(7)
KIND_COPIES(8) KIND_COPIES(9) KIND_COPIES(10)

static few_rows_fn few_rows_for(int kind) {
    switch (kind) {
    case 1: return few_rows_1;
    case 2: return few_rows_2;
    case 5: return few_rows_5;
    case 6: return few_rows_6;
    case 7: return few_rows_7;
    case 8: return few_rows_8;
    case 9: return few_rows_9;
    case 10: return few_rows_10;
    default: return few_rows_0;
    }
}

static widen_fn widen_for(int kind) {
    switch (kind) {
    case 1: return widen_1;
    case 2: return widen_2;
    case 5: return widen_5;
    case 6: return widen_6;
    case 7: return widen_7;
    case 8: return widen_8;
    case 9: return widen_9;
    case 10: return widen_10;
    default: return widen_0;
    }
}

int vs_linear_int8(int kind, const float *x, int64_t M, int64_t K, const void *weight,
                   int64_t N, const float *bias, float *y, int threads);

/* y (M x N, row-major) = x (M x K, row-major) W^T + bias, on `threads` threads.
 * Returns 0, or -1 if K does not suit the format or memory ran out. */
int vs_linear(int kind, const float *x, int64_t M, int64_t K, const void *weight, int64_t N,
              const float *bias, float *y, int threads) {
    if (kind == 3 || kind == 4 || kind == 12 || kind == 13)
        return vs_linear_int8(kind, x, M, K, weight, N, bias, y, threads);
    if (K % 32 != 0 || (kind != 0 && vs_block_bytes(kind) == 0)) return -1;
    int64_t row_bytes = kind == 0 ? K * 4 : (K / 32) * vs_block_bytes(kind);
    int64_t tiles = (N + NR - 1) / NR;
    int failed = 0;
#if defined(__AVX512F__)
    if (M <= REG_ROWS16) { /* few rows: widen in 16-lane registers, no buffer */
#else
    if (M <= REG_ROWS) { /* few rows: widen in registers, no buffer */
#endif
        const few_rows_fn few_rows = few_rows_for(kind);
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
        { /* a contiguous share of the weight rows for each thread */
            int64_t n0, n1;
            thread_share(N, &n0, &n1);
            few_rows(x, M, (const uint8_t *)weight, row_bytes, K, y, N, bias, n0, n1);
        }
        return 0;
    }
    const widen_fn widen = widen_for(kind);
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
            const float *rows = (const float *)src; /* nr rows of stride K */
            if (kind != 0) {
                for (int j = 0; j < nr; j++) widen(src + j * row_bytes, K, buf + j * K);
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
    if (vs_block_bytes(kind) == 0 || K % 32 != 0) return -1;
    int64_t row_bytes = (K / 32) * vs_block_bytes(kind);
    const widen_fn widen = widen_for(kind);
    for (int64_t n = 0; n < N; n++) widen((const uint8_t *)weight + n * row_bytes, K, out + n * K);
    return 0;
}
