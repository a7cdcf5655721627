/* One decoder layer of the runtime's Llama (verispec/models/llama.py, Block) in one C call:
 * RMSNorm, the fused query/key/value product, rotary positions, the attention
 * (kernels/cpu/attention.c), the output product and residual, RMSNorm, the gate/up product,
 * SwiGLU, the down product and residual. On a small CPU the ~15 torch operators a layer
 * spends around its products and attention cost more in dispatch than in arithmetic.
 *
 * vs_forward runs a whole tree pass from token ids around the layers (embedding rows,
 * rotary rows, a draft tree's mask and positions from its parents, the final norm, the LM
 * head), so that a decoding step is one call (verispec/models/cpu_layer.py, forward).
 *
 * Built with kernels/cpu/linear.c and kernels/cpu/attention.c into one library
 * (verispec/models/cpu_linear.py). Every step works on one token row at a time (the
 * products and the attention are row-invariant, the norms, rotary, SwiGLU and residuals
 * are per row), so a row's bits depend on that row's input and the keys it sees only:
 * tree rows equal one-token-at-a-time decoding by construction. The rotary product and the
 * residual additions are the same IEEE operations as the torch forward's; the norm's sum
 * of squares and SiLU's exp are this file's own (results differ from the torch forward by
 * rounding).
 *
 * Layouts (float32, row-major): x (Q, E), updated in place; cos, sin (Q, D); caches and
 * mask as for vs_attend. Weights: vs_weights records as vs_linear reads them.
 */
#include "simd.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t kind; /* vs_linear's format number */
    const void *weight;
    const float *bias; /* or NULL */
    int64_t n, k;      /* output and input widths */
} vs_weights;

int vs_linear(int kind, const float *x, int64_t M, int64_t K, const void *weight, int64_t N,
              const float *bias, float *y, int threads);
int vs_attend(const float *q, const float *k, const float *v, float *cache_k, float *cache_v,
              int64_t cap, int64_t Q, int64_t H, int64_t Hkv, int64_t D, int64_t start,
              const uint8_t *mask, int64_t W, float *out, int threads);
int vs_attend_prompt(const float *q, const float *k, const float *v, float *cache_k,
                     float *cache_v, int64_t cap, int64_t Q, int64_t H, int64_t Hkv, int64_t D,
                     int64_t start, float *out, int threads);

static int product(const vs_weights *w, const float *x, int64_t Q, float *y, int threads) {
    return vs_linear((int)w->kind, x, Q, w->k, w->weight, w->n, w->bias, y, threads);
}

/* out = x * (1 / sqrt(mean(x^2) + eps)) * weight, per row; E a multiple of 8. */
static void rms_norm(const float *x, int64_t Q, int64_t E, const float *weight, float eps,
                     float *out) {
    for (int64_t r = 0; r < Q; r++) {
        const float *xr = x + r * E;
        __m256 ss = _mm256_setzero_ps();
        for (int64_t i = 0; i < E; i += 8) {
            const __m256 v = _mm256_loadu_ps(xr + i);
            ss = _mm256_fmadd_ps(v, v, ss);
        }
        const __m256 scale = _mm256_set1_ps(1.0f / sqrtf(hsum8(ss) / (float)E + eps));
        for (int64_t i = 0; i < E; i += 8)
            _mm256_storeu_ps(out + r * E + i,
                             _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), scale),
                                           _mm256_loadu_ps(weight + i)));
    }
}

/* Rotate-half rotary embedding of `heads` heads of width D in place:
 * x * cos + rotate_half(x) * sin, two products and a sum, as the torch forward does. */
static void rope(float *x, int64_t heads, int64_t D, const float *cos, const float *sin) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *v = x + h * D;
        for (int64_t i = 0; i < half; i++) {
            const float a = v[i], b = v[i + half];
            v[i] = a * cos[i] + (-b) * sin[i];
            v[i + half] = b * cos[i + half] + a * sin[i + half];
        }
    }
}

/* silu(g) * u, eight at a time: g * sigmoid(g), sigmoid from exp(-|g|). */
static void swiglu(const float *gate, const float *up, int64_t F, float *out) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < F; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp8(_mm256_or_ps(g, sign)); /* exp(-|g|) <= 1 */
        const __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, e));
        const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
        const __m256 sig = _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv), neg);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
    }
}

/* The feed-forward of a long pass runs this many rows at a time: the products are
 * row-invariant and the rest row by row, so the bits are those of one pass, and a chunk's
 * gate/up rows stay in cache for SwiGLU and the down product. */
#define FFN_ROWS 64

/* x (Q, E) <- the layer's output. w[0..3]: wqkv, wo, w13, w2. With `mask` (Q x W) a tree
 * pass (vs_attend); without, a prompt's causal pass (vs_attend_prompt: each row sees every
 * slot up to its own). `kv_only`: write the keys and values and stop (x is left as it was).
 * Returns 0, or -1 on bad arguments or no memory (x may then be half-updated: the caller
 * raises). */
static int layer(float *x, int64_t Q, int64_t E, const float *attn_norm, const float *ffn_norm,
                 float eps, const vs_weights *w, const float *cos, const float *sin,
                 float *cache_k, float *cache_v, int64_t cap, int64_t H, int64_t Hkv, int64_t D,
                 int64_t start, const uint8_t *mask, int64_t W, int kv_only, int threads) {
    const int64_t qw = H * D, kvw = Hkv * D, width = qw + 2 * kvw, F = w[3].k;
    if (E % 8 != 0 || D % 8 != 0 || F % 8 != 0 || w[0].k != E || w[0].n != width ||
        w[1].k != qw || w[1].n != E || w[2].k != E || w[2].n != 2 * F || w[3].n != E)
        return -1;
    const int64_t chunk = Q < FFN_ROWS ? Q : FFN_ROWS;
    const int64_t total = Q * (E + width + qw + 2 * kvw + qw + E) + chunk * (2 * F + F);
    float *buf = NULL;
    if (posix_memalign((void **)&buf, 64, (size_t)total * 4) != 0) return -1;
    float *h = buf, *qkv = h + Q * E, *q = qkv + Q * width, *k = q + Q * qw, *v = k + Q * kvw;
    float *att = v + Q * kvw, *o = att + Q * qw, *gu = o + Q * E, *act = gu + chunk * 2 * F;
    int status = 0;
    rms_norm(x, Q, E, attn_norm, eps, h);
    status |= product(&w[0], h, Q, qkv, threads);
    for (int64_t r = 0; r < Q; r++) {
        float *row = qkv + r * width;
        rope(row, H + Hkv, D, cos + r * D, sin + r * D);
        memcpy(q + r * qw, row, qw * 4);
        memcpy(k + r * kvw, row + qw, kvw * 4);
        memcpy(v + r * kvw, row + qw + kvw, kvw * 4);
    }
    if (kv_only) { /* the keys and values written, nothing else read */
        if (status == 0 && start >= 0 && start + Q <= cap)
            write_cache(k, v, cache_k, cache_v, cap, Q, Hkv, D, start);
        else
            status = -1;
        free(buf);
        return status ? -1 : 0;
    }
    status |= mask != NULL
        ? vs_attend(q, k, v, cache_k, cache_v, cap, Q, H, Hkv, D, start, mask, W, att, threads)
        : vs_attend_prompt(q, k, v, cache_k, cache_v, cap, Q, H, Hkv, D, start, att, threads);
    status |= product(&w[1], att, Q, o, threads);
    if (status == 0) {
        for (int64_t i = 0; i < Q * E; i++) x[i] = x[i] + o[i];
        for (int64_t r0 = 0; r0 < Q && status == 0; r0 += chunk) { /* the feed-forward */
            const int64_t n = Q - r0 < chunk ? Q - r0 : chunk;
            float *xr = x + r0 * E;
            rms_norm(xr, n, E, ffn_norm, eps, h);
            status |= product(&w[2], h, n, gu, threads);
            for (int64_t r = 0; r < n; r++) swiglu(gu + r * 2 * F, gu + r * 2 * F + F, F, act + r * F);
            status |= product(&w[3], act, n, o, threads);
            if (status == 0)
                for (int64_t i = 0; i < n * E; i++) xr[i] = xr[i] + o[i];
        }
    }
    free(buf);
    return status ? -1 : 0;
}

/* One decoder layer of a tree pass (layer above, with a mask). */
int vs_layer(float *x, int64_t Q, int64_t E, const float *attn_norm, const float *ffn_norm,
             float eps, const vs_weights *w, const float *cos, const float *sin,
             float *cache_k, float *cache_v, int64_t cap, int64_t H, int64_t Hkv, int64_t D,
             int64_t start, const uint8_t *mask, int64_t W, int threads) {
    if (mask == NULL) return -1;
    return layer(x, Q, E, attn_norm, ffn_norm, eps, w, cos, sin, cache_k, cache_v, cap, H, Hkv,
                 D, start, mask, W, 0, threads);
}

/* Layers 0..L-1 in order on x: `layer` with layer l's norms, its four weight records
 * (w[4 l .. 4 l + 3]) and its caches; mask NULL: a prompt's causal pass; `last_kv_only`:
 * the last layer writes its keys and values only. */
static int layers(int64_t L, float *x, int64_t Q, int64_t E, const float *const *attn_norms,
                  const float *const *ffn_norms, float eps, const vs_weights *w, const float *cos,
                  const float *sin, float *const *cache_k, float *const *cache_v, int64_t cap,
                  int64_t H, int64_t Hkv, int64_t D, int64_t start, const uint8_t *mask,
                  int64_t W, int last_kv_only, int threads) {
    for (int64_t l = 0; l < L; l++)
        if (layer(x, Q, E, attn_norms[l], ffn_norms[l], eps, w + 4 * l, cos, sin, cache_k[l],
                  cache_v[l], cap, H, Hkv, D, start, mask, W, last_kv_only && l == L - 1,
                  threads) != 0)
            return -1;
    return 0;
}

/* The layers of a tree pass (mask Q x W) in one call. */
int vs_layers(int64_t L, float *x, int64_t Q, int64_t E, const float *const *attn_norms,
              const float *const *ffn_norms, float eps, const vs_weights *w, const float *cos,
              const float *sin, float *const *cache_k, float *const *cache_v, int64_t cap,
              int64_t H, int64_t Hkv, int64_t D, int64_t start, const uint8_t *mask, int64_t W,
              int threads) {
    if (mask == NULL) return -1;
    return layers(L, x, Q, E, attn_norms, ffn_norms, eps, w, cos, sin, cache_k, cache_v, cap, H,
                  Hkv, D, start, mask, W, 0, threads);
}

/* A tree pass from token ids, in one call: x = the tokens' embedding rows, each row's
 * rotary cos / sin rows (row `positions[r]` of the tables), the layers, the final RMSNorm;
 * then, with a head, its product on the last `rows` rows into out (rows x head->n, a
 * decoding step's logits), else the normed rows into out (Q x E). The same operators, row
 * by row, as the caller doing each step itself (the embedding and rotary rows are copies),
 * so a row's bits do not depend on which way it ran.
 *
 * With `parents` (a root and the Q - 1 nodes of a draft tree below it, node i's parent
 * parents[i] < i, -1 for the root), `positions` holds the root's position only: a node sits
 * one position below its parent, and sees the root, its ancestors and itself (mask NULL).
 * Without, `positions` holds Q positions and `mask` (Q x W) what each row sees; with no
 * mask either, a prompt's causal pass: each row sees every slot up to its own, through the
 * prompt attention (kernels/cpu/prompt_attention.c, not row-invariant), and with no head
 * and out NULL the last layer writes its keys and values only (a prefill chunk whose rows
 * nobody reads). Returns 0, or -1 on bad arguments (a token id or position out of its
 * table, a parent not before its node, rows not in 1..Q) or no memory; nothing is written
 * before the arguments are checked. */
int vs_forward(int64_t L, const int64_t *tokens, const int64_t *positions,
               const int64_t *parents, int64_t Q, int64_t E, const float *embedding,
               int64_t vocab, const float *cos_table, const float *sin_table,
               int64_t max_positions, const float *const *attn_norms,
               const float *const *ffn_norms, const float *final_norm, float eps,
               const vs_weights *w, const vs_weights *head, int64_t rows,
               float *const *cache_k, float *const *cache_v, int64_t cap, int64_t H,
               int64_t Hkv, int64_t D, int64_t start, const uint8_t *mask, int64_t W,
               float *out, int threads) {
    const int prompt = mask == NULL && parents == NULL, kv_only = out == NULL;
    if (Q < 1 || E % 8 != 0 || (head != NULL && (rows < 1 || rows > Q || head->k != E)) ||
        (kv_only && (head != NULL || !prompt)))
        return -1;
    const size_t floats = (size_t)(Q * (2 * E + 2 * D)), tree = parents ? (size_t)(Q * Q) : 0;
    float *buf = NULL;
    if (posix_memalign((void **)&buf, 64, floats * 4 + (size_t)Q * 8 + tree) != 0) return -1;
    float *x = buf, *normed = x + Q * E, *cos = normed + Q * E, *sin = cos + Q * D;
    int64_t *pos = (int64_t *)(buf + floats);
    uint8_t *own = (uint8_t *)(pos + Q);
    int status = 0;
    if (parents != NULL) { /* row 0 the root, row i + 1 node i */
        memset(own, 0, tree);
        pos[0] = positions[0];
        own[0] = 1;
        for (int64_t i = 0; i + 1 < Q && status == 0; i++) {
            const int64_t p = parents[i];
            if (p < -1 || p >= i) { status = -1; break; }
            pos[i + 1] = pos[p + 1] + 1;
            uint8_t *row = own + (i + 1) * Q;
            memcpy(row, own + (p + 1) * Q, (size_t)(i + 1)); /* the parent's row: its ancestors */
            row[i + 1] = 1;
        }
        mask = own, W = Q;
    } else {
        memcpy(pos, positions, (size_t)Q * 8);
    }
    for (int64_t r = 0; r < Q && status == 0; r++)
        if (tokens[r] < 0 || tokens[r] >= vocab || pos[r] < 0 || pos[r] >= max_positions)
            status = -1;
    if (status != 0) {
        free(buf);
        return -1;
    }
    for (int64_t r = 0; r < Q; r++) {
        memcpy(x + r * E, embedding + tokens[r] * E, E * 4);
        memcpy(cos + r * D, cos_table + pos[r] * D, D * 4);
        memcpy(sin + r * D, sin_table + pos[r] * D, D * 4);
    }
    status = layers(L, x, Q, E, attn_norms, ffn_norms, eps, w, cos, sin, cache_k, cache_v, cap,
                    H, Hkv, D, start, mask, prompt ? Q : W, kv_only, threads);
    if (status == 0 && !kv_only) {
        if (head == NULL) {
            rms_norm(x, Q, E, final_norm, eps, out);
        } else {
            rms_norm(x + (Q - rows) * E, rows, E, final_norm, eps, normed);
            status = product(head, normed, rows, out, threads);
        }
    }
    free(buf);
    return status;
}
