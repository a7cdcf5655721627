/* The coupled rule's draw of one CPU row in one call (verispec/kernels/cpu/draw.py): the
 * processed distribution of a float32 logit row (temperature, top-k, top-p, min-p, as
 * SamplingParams.probs) and its seeded two-level exponential race (as seeded_sample, with
 * position_noise's Philox4x64-10 noise).
 *
 * The passes over the row: its maximum (and whether it holds NaN or +inf); with top-k the
 * scores (x - max) / T, their k-th largest by a min-heap of k and the exponentials of the
 * scores at least that; else the exponentials of every score (AVX2, Cephes' polynomial, 0
 * below float32's normal range) and their sum. Then the top-p set: the tokens of probability at least p_max / 2^10 (else 2^14, 2^20,
 * (1 - top_p) / 2V, else all) ranked by a radix sort of (probability, id) keys, their
 * masses summed in float64, the first token whose predecessors hold top_p and every later
 * one dropped (the candidates by a vector compare). Then min-p, the block masses in float64,
 * and the race: block argmin F_b / Q_b, then token argmin E_v / q_v inside it. The race
 * needs no normalised row (it is the same for any scale of q), so none is written, and
 * after a top-k or top-p cut it runs over the kept tokens' list, not the row.
 *
 * Same law as the torch path. Not the same bits: the exponentials, the softmax sums and the
 * logarithm of the noise round differently, so a draw can differ from the torch path's only
 * where two candidates of the race (or the top-p cut) are within rounding of each other.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

/* Philox4x64-10 (Salmon et al. 2011), as NumPy's bit generator: the counter is incremented
 * before each block of four outputs. */
#define PHILOX_M0 0xD2E7470EE14C6C93ULL
#define PHILOX_M1 0xCA5A826395121157ULL
#define PHILOX_W0 0x9E3779B97F4A7C15ULL
#define PHILOX_W1 0xBB67AE8584CAA73BULL

static void philox10(const uint64_t ctr[4], uint64_t k0, uint64_t k1, uint64_t out[4]) {
    uint64_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    for (int round = 0; round < 10; round++) {
        if (round) k0 += PHILOX_W0, k1 += PHILOX_W1;
        const unsigned __int128 p0 = (unsigned __int128)PHILOX_M0 * c0;
        const unsigned __int128 p1 = (unsigned __int128)PHILOX_M1 * c2;
        const uint64_t hi0 = (uint64_t)(p0 >> 64), lo0 = (uint64_t)p0;
        const uint64_t hi1 = (uint64_t)(p1 >> 64), lo1 = (uint64_t)p1;
        c0 = hi1 ^ c1 ^ k0, c1 = lo1, c2 = hi0 ^ c3 ^ k1, c3 = lo0;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* out[i] = -log U(seed, position, stream, i) for i < count (verifiers/coupled.position_noise):
 * key (seed, 0), counter position * 2^128 + stream * 2^64, U = ((bits >> 11) + 1/2) / 2^53. */
void vs_position_noise(uint64_t seed, uint64_t position, uint64_t stream, int64_t count,
                       double *out) {
    uint64_t ctr[4] = {0, stream, position, 0}, bits[4];
    for (int64_t i = 0; i < count; i += 4) {
        if (++ctr[0] == 0 && ++ctr[1] == 0 && ++ctr[2] == 0) ++ctr[3];
        philox10(ctr, seed, 0, bits);
        for (int j = 0; j < 4 && i + j < count; j++) {
            double u = (double)(bits[j] >> 11);
            u += 0.5;
            u *= 0x1p-53;
            out[i + j] = -log(u);
        }
    }
}

/* Sift the min-heap h[0..n) down from i. */
static void sift_down(float *h, int64_t n, int64_t i) {
    const float v = h[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (!(h[c] < v)) break;
        h[i] = h[c], i = c;
    }
    h[i] = v;
}

/* The k-th largest of s[0..V) (counting equal values), with h (k floats) as the heap. */
static float kth_largest(const float *s, int64_t V, int64_t k, float *h) {
    for (int64_t i = 0; i < k; i++) h[i] = s[i];
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
    for (int64_t i = k; i < V; i++)
        if (s[i] > h[0]) h[0] = s[i], sift_down(h, k, 0);
    return h[0];
}

/* Sort keys[0..n) ascending by their high 32 bits, stably (tmp: n entries): four passes of
 * a byte each, least significant first. The candidates come in id order, so equal
 * probabilities stay in id order. */
static void sort_keys(uint64_t *keys, uint64_t *tmp, int64_t n) {
    for (int shift = 32; shift < 64; shift += 8) {
        int64_t count[257] = {0};
        for (int64_t i = 0; i < n; i++) count[((keys[i] >> shift) & 0xFF) + 1]++;
        for (int j = 0; j < 256; j++) count[j + 1] += count[j];
        for (int64_t i = 0; i < n; i++) tmp[count[(keys[i] >> shift) & 0xFF]++] = keys[i];
        uint64_t *swap = keys;
        keys = tmp, tmp = swap;
    }
}

/* A sort key ranking probabilities descending, then ids ascending (p >= 0: its bits order it). */
static inline uint64_t rank_key(float p, int64_t id) {
    uint32_t bits;
    memcpy(&bits, &p, sizeof bits);
    return ((uint64_t)(~bits) << 32) | (uint64_t)id;
}

/* The ids of every token whose e[v] is at least `cut`, ascending, into ids; returns how many. */
static int64_t gather_at_least(const float *e, int64_t V, float cut, uint64_t *ids) {
    int64_t n = 0, v = 0;
    const __m256 c = _mm256_set1_ps(cut);
    for (; v + 8 <= V; v += 8) {
        int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(e + v), c, _CMP_GE_OQ));
        while (bits) {
            const int lane = __builtin_ctz(bits);
            bits &= bits - 1;
            ids[n++] = (uint64_t)(v + lane);
        }
    }
    for (; v < V; v++)
        if (e[v] >= cut) ids[n++] = (uint64_t)v;
    return n;
}

/* The top-p cut of ranked candidates keys[0..n) (rank keys of e[id] / z, ids ascending):
 * sorted, the first token whose predecessors hold top_p and every later one dropped, the
 * kept ones as keys[0..kept) = (id << 32 | the bits of e[id]), ids ascending. Returns kept,
 * or -1 where the candidates hold less than top_p and are not `complete` (the whole
 * support). keys holds 2 V entries. */
static int64_t keep_prefix(const float *e, int64_t V, double top_p, uint64_t *keys, int64_t n,
                           int complete) {
    sort_keys(keys, keys + V, n); /* four passes: the sorted keys end in keys */
    double cumulative = 0.0;
    int64_t kept = n;
    for (int64_t i = 0; i < n; i++) {
        float p;
        const uint32_t bits = ~(uint32_t)(keys[i] >> 32);
        memcpy(&p, &bits, sizeof p);
        cumulative += p;
        if (kept == n && cumulative - p >= top_p) kept = i;
    }
    if (!(cumulative >= top_p) && !complete) return -1;
    for (int64_t i = 0; i < kept; i++) {
        const uint64_t id = keys[i] & 0xFFFFFFFFULL;
        uint32_t bits;
        memcpy(&bits, &e[id], sizeof bits);
        keys[i] = (id << 32) | bits;
    }
    sort_keys(keys, keys + V, kept); /* by id */
    return kept;
}

/* The top-p cut of the row's probabilities e[v] / z (top: the largest e), as keep_prefix. */
static int64_t top_p_cut(const float *e, int64_t V, float z, float top, double top_p,
                         uint64_t *keys) {
    const float most = top / z;
    /* the candidates: e[v] at least floor * z, the first floor whose set holds the mass;
     * every other token ranks after all of them */
    const double floors[4] = {most / 1024.0f, most / 16384.0f, most / 1048576.0f,
                              (1.0 - top_p) / (2.0 * (double)V)};
    int64_t n = 0;
    for (int f = 0; f < 4; f++) {
        double mass = 0.0;
        n = gather_at_least(e, V, (float)(floors[f] * (double)z), keys);
        for (int64_t i = 0; i < n; i++) {
            const float p = e[keys[i]] / z;
            keys[i] = rank_key(p, (int64_t)keys[i]), mass += p;
        }
        if (mass >= top_p) break;
    }
    const int64_t kept = keep_prefix(e, V, top_p, keys, n, n == V);
    if (kept >= 0) return kept;
    n = 0; /* rounding left the set short of the mass: rank every token */
    for (int64_t v = 0; v < V; v++) keys[n++] = rank_key(e[v] / z, v);
    return keep_prefix(e, V, top_p, keys, n, 1);
}

/* The value of a kept token's key (its e). */
static inline float kept_value(uint64_t key) {
    const uint32_t bits = (uint32_t)key;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* The float64 sum of q[0..n): eight lanes, then the lanes in order, then the tail. */
static double block_mass(const float *q, int64_t n) {
    __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm_loadu_ps(q + i)));
        b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm_loadu_ps(q + i + 4)));
    }
    double lanes[8], s = 0.0;
    _mm256_storeu_pd(lanes, a);
    _mm256_storeu_pd(lanes + 4, b);
    for (int j = 0; j < 8; j++) s += lanes[j];
    for (; i < n; i++) s += q[i];
    return s;
}

/* argmin_i noise[i] / w[i] over i < n (w[i] = 0: +inf); the first among equal ratios. */
static int64_t race(const double *noise, const double *w, int64_t n) {
    int64_t best = 0;
    double low = INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const double r = noise[i] / w[i];
        if (r < low) low = r, best = i;
    }
    return best;
}

/* The token drawn at `position` for `seed` from the processed distribution of row x[0..V).
 *
 * temperature >= 0 (0: the first maximum; below 2^-126, 2^-126); top_k
 * 0 or k (kept when k >= V); top_p in (0, 1]; min_p in [0, 1). block: tokens per block of
 * the race (V <= block: one level). Work buffers: e (V floats) and keys (2 V + 2 ceil(V /
 * block) + 2 block uint64).
 * Returns the token, or -1 when the row holds NaN or +inf or no finite value (the caller's
 * torch path says which), -2 for an argument out of range. */
int64_t vs_coupled_draw(const float *x, int64_t V, double temperature_given, int64_t top_k,
                        double top_p, float min_p, uint64_t seed, uint64_t position,
                        int64_t block, float *e, uint64_t *keys) {
    /* torch divides by it in float32, and by float32's smallest normal number where float32
     * rounds it to 0 (SamplingParams.probs) */
    float temperature = (float)temperature_given;
    if (temperature_given > 0.0 && temperature < 0x1p-126f) temperature = 0x1p-126f;
    if (V < 1 || block < 1 || !(temperature_given >= 0.0) || top_k < 0 || !(top_p > 0.0) ||
        !(top_p <= 1.0) || !(min_p >= 0.0f) || !(min_p < 1.0f))
        return -2;
    /* the maximum, and NaN / +inf */
    __m256 hi = _mm256_set1_ps(-INFINITY), bad = _mm256_setzero_ps();
    int64_t v = 0;
    for (; v + 8 <= V; v += 8) {
        const __m256 y = _mm256_loadu_ps(x + v);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
        hi = _mm256_max_ps(hi, y);
    }
    float m = -INFINITY;
    {
        float lanes[8];
        _mm256_storeu_ps(lanes, hi);
        for (int j = 0; j < 8; j++) m = lanes[j] > m ? lanes[j] : m;
    }
    int nan = _mm256_movemask_ps(bad) != 0;
    for (; v < V; v++) {
        nan |= x[v] != x[v];
        m = x[v] > m ? x[v] : m;
    }
    if (nan || !isfinite(m)) return -1;
    if (temperature_given == 0.0) {
        for (v = 0; v < V; v++)
            if (x[v] == m) return v;
    }
    /* The probabilities are e / z: the cuts compare them, the race needs no normalising.
     * After a top-k or top-p cut the row is the kept list, keys[0..kept) = (id << 32 | the
     * bits of e[id]), ids ascending; else the row e. */
    int64_t kept = -1;
    float z = 0.0f, top = 0.0f;
    if (top_k && top_k < V) {
        /* the scores, their k-th largest, and the exponentials of those at least that */
        for (v = 0; v < V; v++) e[v] = temperature != 1.0f ? (x[v] - m) / temperature : x[v] - m;
        const float kth = kth_largest(e, V, top_k, (float *)keys);
        kept = gather_at_least(e, V, kth, keys); /* ids ascending */
        for (int64_t i = 0; i < kept; i++) {
            const uint64_t id = keys[i];
            e[id] = e[id] < -87.3365448f ? 0.0f : expf(e[id]);
            z += e[id], top = e[id] > top ? e[id] : top;
        }
        if (top_p < 1.0) {
            for (int64_t i = 0; i < kept; i++) {
                const uint64_t id = keys[i];
                keys[i] = rank_key(e[id] / z, (int64_t)id);
            }
            kept = keep_prefix(e, V, top_p, keys, kept, 1);
        } else {
            for (int64_t i = 0; i < kept; i++) {
                const uint64_t id = keys[i];
                uint32_t bits;
                memcpy(&bits, &e[id], sizeof bits);
                keys[i] = (id << 32) | bits;
            }
        }
    } else {
        /* the exponentials of the scores (x - m) / T, 0 below float32's normal range */
        const __m256 lo = _mm256_set1_ps(-87.3365448f), vm = _mm256_set1_ps(m);
        const __m256 vt = _mm256_set1_ps(temperature);
        __m256 acc = _mm256_setzero_ps(), big = _mm256_setzero_ps();
        for (v = 0; v + 8 <= V; v += 8) {
            __m256 s = _mm256_sub_ps(_mm256_loadu_ps(x + v), vm);
            if (temperature != 1.0f) s = _mm256_div_ps(s, vt);
            const __m256 y = _mm256_andnot_ps(_mm256_cmp_ps(s, lo, _CMP_LT_OQ), exp8(s));
            _mm256_storeu_ps(e + v, y);
            acc = _mm256_add_ps(acc, y), big = _mm256_max_ps(big, y);
        }
        z = hsum8(acc);
        float lanes[8];
        _mm256_storeu_ps(lanes, big);
        for (int j = 0; j < 8; j++) top = lanes[j] > top ? lanes[j] : top;
        for (; v < V; v++) {
            float s = x[v] - m;
            if (temperature != 1.0f) s = s / temperature;
            e[v] = s < -87.3365448f ? 0.0f : expf(s);
            z += e[v], top = e[v] > top ? e[v] : top;
        }
        if (top_p < 1.0) kept = top_p_cut(e, V, z, top, top_p, keys);
    }
    if (kept >= 0) {
        z = 0.0f, top = 0.0f;
        for (int64_t i = 0; i < kept; i++) {
            const float value = kept_value(keys[i]);
            z += value, top = value > top ? value : top;
        }
    }
    if (min_p > 0.0f) {
        const float floor = min_p * (top / z);
        if (kept < 0) {
            for (v = 0; v < V; v++)
                if (e[v] / z < floor) e[v] = 0.0f;
        } else {
            int64_t k = 0;
            for (int64_t i = 0; i < kept; i++)
                if (!(kept_value(keys[i]) / z < floor)) keys[k++] = keys[i];
            kept = k;
        }
    }
    /* the race: a block by its float64 mass, then a token inside it */
    const int64_t blocks = (V + block - 1) / block;
    double *mass = (double *)(keys + (kept < 0 ? 0 : kept)), *noise = mass + blocks;
    int64_t chosen = 0;
    if (blocks > 1) {
        if (kept < 0) {
            for (int64_t b = 0; b < blocks; b++)
                mass[b] = block_mass(e + b * block, (b + 1) * block < V ? block : V - b * block);
        } else {
            for (int64_t b = 0; b < blocks; b++) mass[b] = 0.0;
            for (int64_t i = 0; i < kept; i++) mass[(keys[i] >> 32) / block] += kept_value(keys[i]);
        }
        vs_position_noise(seed, position, 0, blocks, noise);
        chosen = race(noise, mass, blocks);
    }
    const int64_t start = chosen * block, n = start + block < V ? block : V - start;
    double *weight = mass, *inside = weight + n;
    if (kept < 0) {
        for (int64_t i = 0; i < n; i++) weight[i] = e[start + i];
    } else {
        for (int64_t i = 0; i < n; i++) weight[i] = 0.0;
        for (int64_t i = 0; i < kept; i++) {
            const int64_t id = (int64_t)(keys[i] >> 32);
            if (id >= start && id < start + n) weight[id - start] = kept_value(keys[i]);
        }
    }
    vs_position_noise(seed, position, (uint64_t)chosen + 1, n, inside);
    return start + race(inside, weight, n);
}
