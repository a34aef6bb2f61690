"""C source of the fused CPU kernels used by :mod:`compressors.native` (compiled on first use).

Two kernels, both OpenMP-parallel over contiguous float32 input:

- ``sidco_stats``: one pass computing ``Σy``, ``Σy²``, ``Σ ln max(y, FLT_MIN)`` and ``#(y > 0)``
  where ``y = |x|`` or ``y = max(x − shift, 0)`` (the excess of the exceedances); partial sums in float32 over blocks of 4096 elements,
  accumulated in float64.
- ``sidco_select``: compaction of ``{(i, y_i) : y_i > thr}`` (strict), ascending ``i`` (int32), in one
  read pass into caller-provided buffers of capacity ``n``, also summing ``y − thr`` and
  ``(y − thr)²`` over the hits (what the next peak-over-threshold stage fits) and, on request,
  ``Σ|x|`` and ``Σx²`` over all elements (statistics and a speculative selection in one pass); blocks of 64 with nothing above ``thr``
  are skipped after a vectorised test, the rest compacted with AVX-512 where available.
"""

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define BLOCK 4096
#define SCAN 64

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

void sidco_stats(const float* x, int64_t n, float shift, int absolute, int want_sq, int want_log,
                 int threads, double* out) {
    double s1 = 0.0, s2 = 0.0, sl = 0.0, cnt = 0.0;
    #pragma omp parallel for num_threads(threads) schedule(static) reduction(+:s1,s2,sl,cnt)
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t e = b + BLOCK < n ? b + BLOCK : n;
        float a1 = 0.0f, a2 = 0.0f, al = 0.0f;
        int32_t c = 0;
        if (absolute && !want_sq && !want_log) {
            for (int64_t i = b; i < e; i++) a1 += fabsf(x[i]);
        } else if (absolute && want_log) {
            for (int64_t i = b; i < e; i++) {
                float y = fabsf(x[i]);
                a1 += y;
                al += fast_logf(y > 1.17549435e-38f ? y : 1.17549435e-38f);
                c += y > 0.0f;
            }
        } else {
            for (int64_t i = b; i < e; i++) {
                float y = absolute ? fabsf(x[i]) : x[i] - shift;
                y = y > 0.0f ? y : 0.0f;
                a1 += y;
                a2 += y * y;
                c += y > 0.0f;
            }
        }
        s1 += a1; s2 += a2; sl += al; cnt += c;
    }
    out[0] = s1; out[1] = s2; out[2] = sl; out[3] = cnt;
}

/* Selection in one pass: part p of a static partition into `parts` ranges writes its hits at
   idx_buf/mag_buf[lo_p ...] (capacity n, so no part can overflow into the next), then the parts
   are moved together. Returns the number of hits. */
static inline float load_y(const float* x, int64_t i, int absolute) {
    return absolute ? fabsf(x[i]) : x[i];
}

int64_t sidco_select(const float* x, const int32_t* src, int64_t n, float thr, int absolute, int parts,
                     int32_t* idx_buf, float* mag_buf, double* excess, double* whole) {
    int64_t counts[256];
    double sums[256], squares[256], whole_sums[256], whole_squares[256];
    if (parts > 256) parts = 256;
    if (parts < 1) parts = 1;
    #pragma omp parallel for num_threads(parts) schedule(static, 1)
    for (int part = 0; part < parts; part++) {
        int64_t lo = n * part / parts, hi = n * (part + 1) / parts;
        int32_t* io = idx_buf + lo;
        float* mo = mag_buf + lo;
        int64_t cnt = 0;
        double s1 = 0.0, s2 = 0.0, w1 = 0.0, w2 = 0.0;
        for (int64_t b = lo; b < hi; b += SCAN) {
            int64_t e = b + SCAN < hi ? b + SCAN : hi;
            int32_t any = 0;
            if (whole) {
                float t1 = 0.0f, t2 = 0.0f;
                for (int64_t i = b; i < e; i++) {
                    float y = fabsf(x[i]);
                    t1 += y;
                    t2 += y * y;
                    any |= y > thr;
                }
                w1 += t1;
                w2 += t2;
            } else if (absolute) {
                for (int64_t i = b; i < e; i++) any |= fabsf(x[i]) > thr;
            } else {
                for (int64_t i = b; i < e; i++) any |= x[i] > thr;
            }
            if (!any) continue;
            int64_t i = b;
            float b1 = 0.0f, b2 = 0.0f;
#ifdef __AVX512F__
            const __m512 vthr = _mm512_set1_ps(thr);
            const __m512i step = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
            __m512 v1 = _mm512_setzero_ps(), v2 = _mm512_setzero_ps();
            for (; i + 16 <= e; i += 16) {
                __m512 v = _mm512_loadu_ps(x + i);
                if (absolute) v = _mm512_abs_ps(v);
                __mmask16 m = _mm512_cmp_ps_mask(v, vthr, _CMP_GT_OQ);
                if (!m) continue;
                int c = __builtin_popcount(m);
                __m512 d = _mm512_maskz_sub_ps(m, v, vthr);
                v1 = _mm512_add_ps(v1, d);
                v2 = _mm512_fmadd_ps(d, d, v2);
                _mm512_mask_storeu_ps(mo + cnt, (__mmask16)((1u << c) - 1u), _mm512_maskz_compress_ps(m, v));
                __m512i pos = src ? _mm512_loadu_si512((const void*)(src + i))
                                  : _mm512_add_epi32(_mm512_set1_epi32((int32_t)i), step);
                _mm512_mask_storeu_epi32(io + cnt, (__mmask16)((1u << c) - 1u), _mm512_maskz_compress_epi32(m, pos));
                cnt += c;
            }
            b1 = _mm512_reduce_add_ps(v1);
            b2 = _mm512_reduce_add_ps(v2);
#endif
            for (; i < e; i++) {
                float y = load_y(x, i, absolute);
                if (y > thr) {
                    io[cnt] = src ? src[i] : (int32_t)i;
                    mo[cnt] = y;
                    cnt++;
                    b1 += y - thr;
                    b2 += (y - thr) * (y - thr);
                }
            }
            s1 += b1;
            s2 += b2;
        }
        counts[part] = cnt;
        sums[part] = s1;
        squares[part] = s2;
        whole_sums[part] = w1;
        whole_squares[part] = w2;
    }
    excess[0] = 0.0;
    excess[1] = 0.0;
    for (int part = 0; part < parts; part++) {
        excess[0] += sums[part];
        excess[1] += squares[part];
    }
    if (whole) {
        whole[0] = 0.0;
        whole[1] = 0.0;
        for (int part = 0; part < parts; part++) {
            whole[0] += whole_sums[part];
            whole[1] += whole_squares[part];
        }
    }
    int64_t total = counts[0];
    for (int part = 1; part < parts; part++) {
        int64_t lo = n * part / parts;
        if (counts[part]) {
            memmove(idx_buf + total, idx_buf + lo, (size_t)counts[part] * sizeof(int32_t));
            memmove(mag_buf + total, mag_buf + lo, (size_t)counts[part] * sizeof(float));
        }
        total += counts[part];
    }
    return total;
}
"""
