/* Helpers shared by verispec's CPU kernels (kernels/cpu/linear.c, int8.c, attention.c,
 * prompt_attention.c, layer.c): a fixed horizontal sum, a vectorised exp, a prefetch ahead of
 * a read, each thread's share of a loop, and a pass's write of its keys and values. */
#ifndef VS_CPU_SIMD_H
#define VS_CPU_SIMD_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Ask for the `bytes` bytes that start `ahead` bytes past p (software prefetch: a hint that
 * never faults), so that a streaming loop finds them in cache when it gets there. Always
 * inlined: as a call, GCC 12 found it free of effects and dropped every call. */
static inline __attribute__((always_inline)) void prefetch_ahead(const void *p, int64_t ahead, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + ahead + o, _MM_HINT_T0);
}

/* The calling OpenMP thread's contiguous share [*from, *to) of n items (all n outside a
 * parallel region or without OpenMP). */
static inline void thread_share(int64_t n, int64_t *from, int64_t *to) {
    int64_t t = 0, T = 1;
#ifdef _OPENMP
    t = omp_get_thread_num(), T = omp_get_num_threads();
#endif
    *from = n * t / T, *to = n * (t + 1) / T;
}

/* A pass's new keys and values, k and v (Q, Hkv, D), into slots [start, start + Q) of a
 * layer's caches: cache_k (Hkv, cap, D) and cache_v (Hkv, cap, D + 1), whose last column
 * (the runtime's column of ones) is left as it is. */
static inline void write_cache(const float *k, const float *v, float *cache_k, float *cache_v,
                               int64_t cap, int64_t Q, int64_t Hkv, int64_t D, int64_t start) {
    for (int64_t i = 0; i < Q; i++)
        for (int64_t g = 0; g < Hkv; g++) {
            memcpy(cache_k + (g * cap + start + i) * D, k + (i * Hkv + g) * D, (size_t)D * 4);
            memcpy(cache_v + (g * cap + start + i) * (D + 1), v + (i * Hkv + g) * D,
                   (size_t)D * 4);
        }
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for x <= 0 (scores minus their maximum), Cephes' polynomial, ~1 ulp. */
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365448f);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#endif
