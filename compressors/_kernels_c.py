"""C source of the fused CPU kernels used by :mod:`compressors.native` (compiled on first use).

One kernel, ``sidco_scan``, OpenMP-parallel over contiguous float32 input, does in one read pass
what a SIDCo stage needs (``y = |x|`` or ``y = x``):

- statistics of the exceedances of ``shift``: ``#(y > shift)``, ``Σ(y − shift)`` and
  ``Σ(y − shift)²`` over them (``shift = 0`` gives the plain sums of ``|x|``), and on request
  ``Σ ln max(y, FLT_MIN)`` over all elements with ``#(y > 0)`` (summed exponents plus one
  logarithm per product of 64 mantissas, not one per element). These loops are branch-free, so
  the compiler vectorises them for whatever instruction set it targets (SSE2, AVX2, AVX-512);
  partial sums are float32 over chunks of 1024 elements, accumulated in float64;
- optionally, compaction of ``{(i, y_i) : y_i > thr}`` (strict), ascending ``i`` (int32, or
  ``src[i]`` when positions are given), into caller-provided buffers of capacity ``n``. Blocks of 64 elements with nothing above
  ``thr`` are skipped after a test (with AVX-512 four compares of the whole block: the
  per-element loop the other builds keep cost a quarter more at a 0.5 % pool there); the rest are
  compacted with AVX-512 compress stores, AVX2 permutes from a 256-entry lookup table, or
  (neither available) a branch-free scalar loop that stores every element and advances the output
  by ``y > thr``.
"""

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define CHUNK 1024
#define SCAN 64
#define FLOOR 1.17549435e-38f

static inline float fast_logf(float x) {
    /* Cephes logf for normal positive x (|error| < 2e-7 relative); branch-free so it vectorises. */
    int32_t bits;
    memcpy(&bits, &x, sizeof bits);
    float e = (float)(((bits >> 23) & 0xff) - 126);
    bits = (bits & 0x807fffff) | 0x3f000000;
    float m;
    memcpy(&m, &bits, sizeof m);
    float low = m < 0.707106781186547524f ? 1.0f : 0.0f;
    e -= low;
    m = m + low * m - 1.0f;
    float z = m * m;
    float y = ((((((((7.0376836292e-2f * m - 1.1514610310e-1f) * m + 1.1676998740e-1f) * m
              - 1.2420140846e-1f) * m + 1.4249322787e-1f) * m - 1.6668057665e-1f) * m
              + 2.0000714765e-1f) * m - 2.4999993993e-1f) * m + 3.3333331174e-1f) * m * z;
    y += -2.12194440e-4f * e;
    y += -0.5f * z;
    return m + y + 0.693359375f * e;
}

typedef struct { double cnt, s1, s2, sl, pos; } sums_t;

/* Σ ln max(|x|, FLT_MIN) over [b, e) without a logarithm per element: ln y = e·ln 2 + ln m with
   y = m·2^e, m in [1, 2); the exponents are summed as integers and the mantissas multiplied in
   groups of 64 (a product below 2^64, one logarithm per group; float32 rounding of 64 products
   adds < 4e-6 relative to it, i.e. < 1e-7 per element to the sum of logarithms). */
static inline float mantissa_product(const float* x, int count, int32_t* exps_out) {
    float prod = 1.0f;
    int32_t exps = 0;
    for (int i = 0; i < count; i++) {
        int32_t bits;
        memcpy(&bits, x + i, sizeof bits);
        bits &= 0x7fffffff;                            /* |x| */
        bits = bits > 0x00800000 ? bits : 0x00800000;  /* max(|x|, FLT_MIN) */
        exps += (bits >> 23) - 127;
        bits = (bits & 0x007fffff) | 0x3f800000;
        float m;
        memcpy(&m, &bits, sizeof m);
        prod *= m;
    }
    *exps_out = exps;
    return prod;
}

static inline double chunk_logs(const float* x, int64_t b, int64_t e) {
    double total = 0.0;
    for (int64_t s = b; s < e; s += 64) {
        int32_t exps;
        float prod = mantissa_product(x + s, (int)(s + 64 < e ? 64 : e - s), &exps);
        total += exps * 0.6931471805599453 + fast_logf(prod);
    }
    return total;
}

/* Statistics of one chunk; `absolute` and `want_log` are compile-time constants at each call
   site (always_inline), so every variant is a separate branch-free, vectorisable loop. Returns
   whether anything in the chunk is above `thr`. */
static inline __attribute__((always_inline)) int32_t chunk_stats(
        const float* x, int64_t b, int64_t e, int absolute, int want_log, float shift, float thr, sums_t* acc) {
    float s1 = 0.0f, s2 = 0.0f;
    int32_t cnt = 0, pos = 0, any = 0;
    for (int64_t i = b; i < e; i++) {
        float y = absolute ? fabsf(x[i]) : x[i];
        int32_t hit = y > shift;
        float d = y <= shift ? 0.0f : y - shift;  /* NaN propagates into the sums */
        s1 += d;
        s2 += d * d;
        cnt += hit;
        any |= y > thr;
        if (want_log) pos += y > 0.0f;
    }
    if (want_log) acc->sl += chunk_logs(x, b, e);
    acc->cnt += cnt; acc->s1 += s1; acc->s2 += s2; acc->pos += pos;
    return any;
}

#if defined(__AVX2__) && !defined(__AVX512F__)
static int32_t lut[256][8] __attribute__((aligned(32)));
__attribute__((constructor)) static void init_lut(void) {
    for (int m = 0; m < 256; m++) {
        int c = 0;
        for (int j = 0; j < 8; j++) if (m & (1 << j)) lut[m][c++] = j;
        for (; c < 8; c++) lut[m][c] = 0;
    }
}
#endif

/* Compaction of y > thr over [b, e) appending at io/mo + *cnt. Safe to store whole vectors:
   hits never outnumber the elements before them, so a store at *cnt of up to 16 lanes stays
   below the current element's own slot + 16, inside this part's region of the buffers. */
static inline __attribute__((always_inline)) void chunk_select(
        const float* x, const int32_t* src, int64_t b, int64_t e, int absolute, float thr,
        int32_t* io, float* mo, int64_t* cnt_io) {
    int64_t cnt = *cnt_io;
    for (int64_t s = b; s < e; s += SCAN) {
        int64_t t = s + SCAN < e ? s + SCAN : e;
        int64_t i = s;
#if defined(__AVX512F__)
        const __m512 vthr = _mm512_set1_ps(thr);
        const __m512i step = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        if (t - s == SCAN) {  /* a whole block: one vectorised test before any compaction */
            __m512 a0 = _mm512_loadu_ps(x + s), a1 = _mm512_loadu_ps(x + s + 16);
            __m512 a2 = _mm512_loadu_ps(x + s + 32), a3 = _mm512_loadu_ps(x + s + 48);
            if (absolute) { a0 = _mm512_abs_ps(a0); a1 = _mm512_abs_ps(a1); a2 = _mm512_abs_ps(a2); a3 = _mm512_abs_ps(a3); }
            if (!(_mm512_cmp_ps_mask(a0, vthr, _CMP_GT_OQ) | _mm512_cmp_ps_mask(a1, vthr, _CMP_GT_OQ)
                  | _mm512_cmp_ps_mask(a2, vthr, _CMP_GT_OQ) | _mm512_cmp_ps_mask(a3, vthr, _CMP_GT_OQ)))
                continue;
        }
        for (; i + 16 <= t; i += 16) {
            __m512 v = _mm512_loadu_ps(x + i);
            if (absolute) v = _mm512_abs_ps(v);
            __mmask16 m = _mm512_cmp_ps_mask(v, vthr, _CMP_GT_OQ);
            _mm512_storeu_ps(mo + cnt, _mm512_maskz_compress_ps(m, v));
            __m512i p = src ? _mm512_loadu_si512((const void*)(src + i))
                            : _mm512_add_epi32(_mm512_set1_epi32((int32_t)i), step);
            _mm512_storeu_si512((void*)(io + cnt), _mm512_maskz_compress_epi32(m, p));
            cnt += __builtin_popcount(m);
        }
#elif defined(__AVX2__)
        const __m256 vthr = _mm256_set1_ps(thr);
        const __m256 sign = _mm256_set1_ps(-0.0f);
        const __m256i step = _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0);
        int32_t any = 0;
        for (int64_t j = s; j < t; j++) any |= (absolute ? fabsf(x[j]) : x[j]) > thr;
        if (!any) continue;
        for (; i + 8 <= t; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            if (absolute) v = _mm256_andnot_ps(sign, v);
            int m = _mm256_movemask_ps(_mm256_cmp_ps(v, vthr, _CMP_GT_OQ));
            __m256i perm = _mm256_load_si256((const __m256i*)lut[m]);
            _mm256_storeu_ps(mo + cnt, _mm256_permutevar8x32_ps(v, perm));
            __m256i p = src ? _mm256_loadu_si256((const __m256i*)(src + i))
                            : _mm256_add_epi32(_mm256_set1_epi32((int32_t)i), step);
            _mm256_storeu_si256((__m256i*)(io + cnt), _mm256_permutevar8x32_epi32(p, perm));
            cnt += __builtin_popcount(m);
        }
#else
        int32_t any = 0;
        for (int64_t j = s; j < t; j++) any |= (absolute ? fabsf(x[j]) : x[j]) > thr;
        if (!any) continue;
#endif
        for (; i < t; i++) {
            float y = absolute ? fabsf(x[i]) : x[i];
            io[cnt] = src ? src[i] : (int32_t)i;
            mo[cnt] = y;
            cnt += y > thr;
        }
    }
    *cnt_io = cnt;
}

#define PART_LOOP(ABS, LOG)                                                                     \
    for (int64_t b = lo; b < hi; b += CHUNK) {                                                  \
        int64_t e = b + CHUNK < hi ? b + CHUNK : hi;                                            \
        int32_t any = chunk_stats(x, b, e, ABS, LOG, shift, thr, &acc);                         \
        if (select && any) chunk_select(x, src, b, e, ABS, thr, io, mo, &cnt);             \
    }

/* out[0..4]: #(y > shift), Σ(y − shift), Σ(y − shift)² over them, Σ ln max(y, FLT_MIN) and
   #(y > 0) (want_log only).
   Part p of a static partition into `parts` ranges compacts into idx_buf/mag_buf[lo_p ...]; the
   parts are then moved together. Returns the number of hits (0 without select). */
int64_t sidco_scan(const float* x, const int32_t* src, int64_t n, int absolute, float shift, int want_log,
                   int select, float thr, int parts, int32_t* idx_buf, float* mag_buf, double* out) {
    int64_t counts[256];
    sums_t part_sums[256];
    if (parts > 256) parts = 256;
    if (parts < 1) parts = 1;
    #pragma omp parallel for num_threads(parts) schedule(static, 1)
    for (int part = 0; part < parts; part++) {
        int64_t lo = n * part / parts, hi = n * (part + 1) / parts;
        int32_t* io = select ? idx_buf + lo : NULL;
        float* mo = select ? mag_buf + lo : NULL;
        int64_t cnt = 0;
        sums_t acc = {0, 0, 0, 0, 0};
        if (absolute && want_log) { PART_LOOP(1, 1) }
        else if (absolute) { PART_LOOP(1, 0) }
        else { PART_LOOP(0, 0) }
        counts[part] = cnt;
        part_sums[part] = acc;
    }
    sums_t t = {0, 0, 0, 0, 0};
    for (int part = 0; part < parts; part++) {
        t.cnt += part_sums[part].cnt; t.s1 += part_sums[part].s1; t.s2 += part_sums[part].s2;
        t.sl += part_sums[part].sl; t.pos += part_sums[part].pos;
    }
    out[0] = t.cnt; out[1] = t.s1; out[2] = t.s2; out[3] = t.sl; out[4] = t.pos;
    if (!select) return 0;
    int64_t total = counts[0];
    for (int part = 1; part < parts; part++) {
        int64_t lo = n * part / parts;
        if (counts[part] && total != lo) {
            memmove(idx_buf + total, idx_buf + lo, (size_t)counts[part] * sizeof(int32_t));
            memmove(mag_buf + total, mag_buf + lo, (size_t)counts[part] * sizeof(float));
        }
        total += counts[part];
    }
    return total;
}
"""
