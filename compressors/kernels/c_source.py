"""C source of the fused CPU kernels used by :mod:`compressors.kernels.native` (compiled on first use).

One kernel, ``sidco_scan``, OpenMP-parallel over contiguous float32 input, does in one read pass
what a SIDCo stage needs (``y = |x|`` or ``y = x``):

- statistics of the exceedances of ``shift``: ``#(y > shift)``, ``Σ(y − shift)`` and, on
  request, ``Σ(y − shift)²`` over them (``shift = 0`` gives the plain sums of ``|x|``), and on
  request ``Σ ln max(y, FLT_MIN)`` over all elements with ``#(y > 0)`` (summed exponents plus a
  few logarithms per part: each vector lane multiplies the mantissas in [1, 2) of at most 64
  elements, a product below 2^64, which is split into exponent and mantissa and that mantissa
  multiplied into the lane's running product, itself split again; float32 rounding adds < 6e-8
  per element to the sum of logarithms);
- optionally, compaction of ``{(i, y_i) : y_i > thr}`` (strict), ascending ``i`` (int32, or
  ``src[i]`` when positions are given), into caller-provided buffers of capacity ``n``.

Each combination of what a pass computes (``|x|`` or ``x``, ``shift`` zero or not, squares, logarithms,
selection, and whether the selection's threshold is ``shift``) is its own branch-free loop
(compile-time flags of one always-inlined function). The input is swept once in groups of four
vectors (64 elements with AVX-512, 32 with AVX2; two vectors for AVX2's logarithms, whose
accumulators would not fit its 16 registers): every group is loaded once and each of its vectors
feeds its own accumulator of every sum (so that the adds do not wait on each other;
float32 within a chunk of 1024 elements, float64 across chunks; counts are popcounts of the
comparison masks on the scalar ports); with a selection each block of 64 elements is tested
against ``thr`` (one branch per block: fewer mispredictions than one per AVX2 group at a few
percent kept; one comparison of the block's running maximum, or the count's comparisons when
``thr`` is ``shift``) and a block with a hit is compacted, from registers where the block is one group
(AVX-512) and from L1 otherwise, with AVX-512 compress instructions, AVX2 permutes from a
256-entry lookup table (only the block's vectors with a hit, found from its 64-bit hit mask), or (neither available: the vector layer is then plain scalar C) a
branch-free store of every element that advances the output by ``y > thr``. The < 64 elements
left at the end of a part take a scalar loop.
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
#define UNROLL 4
#define LN2 0.6931471805599453

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

/* The vector layer: vf holds VL floats, vi VL int32, vm a comparison's result. */
#if defined(__AVX512F__)
#define VL 16
typedef __m512 vf; typedef __m512i vi; typedef __mmask16 vm;
static inline vf v_load(const float* p) { return _mm512_loadu_ps(p); }
static inline vf v_set(float a) { return _mm512_set1_ps(a); }
static inline vi vi_set(int32_t a) { return _mm512_set1_epi32(a); }
static inline vf v_abs(vf a) { return _mm512_abs_ps(a); }
static inline vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
/* a > b ? a : b, and b when either is NaN */
static inline vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vi vi_add(vi a, vi b) { return _mm512_add_epi32(a, b); }
/* y <= s ? 0 : y - s, as max(0, y - s): y > s exactly when y - s > 0 (gradual underflow), and
   max returns its second operand when either is NaN, so a NaN y gives NaN */
static inline vf v_excess(vf y, vf s) { return _mm512_max_ps(_mm512_setzero_ps(), _mm512_sub_ps(y, s)); }
static inline vm v_gt(vf y, vf t) { return _mm512_cmp_ps_mask(y, t, _CMP_GT_OQ); }
static inline vm m_or(vm a, vm b) { return a | b; }
static inline int m_any(vm a) { return a != 0; }
typedef int64_t vc;  /* counts: popcounts of comparison masks, on the scalar ports */
static inline vc c_zero(void) { return 0; }
static inline vc c_add(vc c, vm m) { return c + __builtin_popcount(m); }
static inline int64_t c_sum(vc c) { return c; }
static inline vi v_bits(vf a) { return _mm512_castps_si512(a); }
static inline vf v_float(vi a) { return _mm512_castsi512_ps(a); }
static inline vi vi_max(vi a, vi b) { return _mm512_max_epi32(a, b); }
static inline vi vi_and(vi a, vi b) { return _mm512_and_si512(a, b); }
static inline vi vi_or(vi a, vi b) { return _mm512_or_si512(a, b); }
static inline vi vi_shr23(vi a) { return _mm512_srli_epi32(a, 23); }
static inline double v_sum(vf a) {
    return _mm512_reduce_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(a)))
         + _mm512_reduce_add_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
}
static inline int64_t vi_sum(vi a) { return _mm512_reduce_add_epi32(a); }
static inline float v_hprod(vf a) { return _mm512_reduce_mul_ps(a); }
#elif defined(__AVX2__)
#define VL 8
typedef __m256 vf; typedef __m256i vi; typedef __m256 vm;
static inline vf v_load(const float* p) { return _mm256_loadu_ps(p); }
static inline vf v_set(float a) { return _mm256_set1_ps(a); }
static inline vi vi_set(int32_t a) { return _mm256_set1_epi32(a); }
static inline vf v_abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
static inline vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
#if defined(__FMA__)
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
#else
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_add_ps(_mm256_mul_ps(a, b), c); }
#endif
static inline vi vi_add(vi a, vi b) { return _mm256_add_epi32(a, b); }
static inline vf v_excess(vf y, vf s) { return _mm256_max_ps(_mm256_setzero_ps(), _mm256_sub_ps(y, s)); }
static inline vm v_gt(vf y, vf t) { return _mm256_cmp_ps(y, t, _CMP_GT_OQ); }
static inline vm m_or(vm a, vm b) { return _mm256_or_ps(a, b); }
static inline int m_any(vm a) { return _mm256_movemask_ps(a) != 0; }
typedef int64_t vc;  /* counts: popcounts of comparison masks, on the scalar ports (16 registers) */
static inline vc c_zero(void) { return 0; }
static inline vc c_add(vc c, vm m) { return c + __builtin_popcount(_mm256_movemask_ps(m)); }
static inline int64_t c_sum(vc c) { return c; }
static inline vi v_bits(vf a) { return _mm256_castps_si256(a); }
static inline vf v_float(vi a) { return _mm256_castsi256_ps(a); }
static inline vi vi_max(vi a, vi b) { return _mm256_max_epi32(a, b); }
static inline vi vi_and(vi a, vi b) { return _mm256_and_si256(a, b); }
static inline vi vi_or(vi a, vi b) { return _mm256_or_si256(a, b); }
static inline vi vi_shr23(vi a) { return _mm256_srli_epi32(a, 23); }
static inline double v_sum(vf a) {
    __m256d d = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)), _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
    return _mm_cvtsd_f64(h) + _mm_cvtsd_f64(_mm_unpackhi_pd(h, h));
}
static inline int64_t vi_sum(vi a) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}
static inline float v_hprod(vf a) {
    __m128 h = _mm_mul_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_mul_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_mul_ss(h, _mm_shuffle_ps(h, h, 1)));
}
#else
#define VL 1
typedef float vf; typedef int32_t vi; typedef int32_t vm;
static inline vf v_load(const float* p) { return *p; }
static inline vf v_set(float a) { return a; }
static inline vi vi_set(int32_t a) { return a; }
static inline vf v_abs(vf a) { return fabsf(a); }
static inline vf v_add(vf a, vf b) { return a + b; }
static inline vf v_mul(vf a, vf b) { return a * b; }
static inline vf v_max(vf a, vf b) { return a > b ? a : b; }
static inline vf v_fma(vf a, vf b, vf c) { return a * b + c; }
static inline vi vi_add(vi a, vi b) { return a + b; }
static inline vf v_excess(vf y, vf s) { return y <= s ? 0.0f : y - s; }
static inline vm v_gt(vf y, vf t) { return y > t; }
static inline vm m_or(vm a, vm b) { return a | b; }
static inline int m_any(vm a) { return a != 0; }
typedef int64_t vc;
static inline vc c_zero(void) { return 0; }
static inline vc c_add(vc c, vm m) { return c + m; }
static inline int64_t c_sum(vc c) { return c; }
static inline vi v_bits(vf a) { int32_t b; memcpy(&b, &a, sizeof b); return b; }
static inline vf v_float(vi a) { float f; memcpy(&f, &a, sizeof f); return f; }
static inline vi vi_max(vi a, vi b) { return a > b ? a : b; }
static inline vi vi_and(vi a, vi b) { return a & b; }
static inline vi vi_or(vi a, vi b) { return a | b; }
static inline vi vi_shr23(vi a) { return (vi)((uint32_t)a >> 23); }
static inline double v_sum(vf a) { return a; }
static inline int64_t vi_sum(vi a) { return a; }
static inline float v_hprod(vf a) { return a; }
#endif


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

/* Compaction of one vector y (element i onwards) by its mask m = y > thr, appending at io/mo + hits.
   Safe to store whole vectors: hits never outnumber the elements before them, so a store at hits
   of up to VL lanes stays below the current element's own slot + VL, inside this part's region of
   the buffers. */
static inline __attribute__((always_inline)) int64_t vec_select(
        vf y, vm m, int64_t i, const int32_t* restrict src, int32_t* restrict io, float* restrict mo, int64_t hits) {
#if defined(__AVX512F__)
    const __m512i step = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    _mm512_storeu_ps(mo + hits, _mm512_maskz_compress_ps(m, y));
    __m512i p = src ? _mm512_loadu_si512((const void*)(src + i)) : _mm512_add_epi32(_mm512_set1_epi32((int32_t)i), step);
    _mm512_storeu_si512((void*)(io + hits), _mm512_maskz_compress_epi32(m, p));
    return hits + __builtin_popcount(m);
#elif defined(__AVX2__)
    const __m256i step = _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    int bits = _mm256_movemask_ps(m);
    __m256i perm = _mm256_load_si256((const __m256i*)lut[bits]);
    _mm256_storeu_ps(mo + hits, _mm256_permutevar8x32_ps(y, perm));
    __m256i p = src ? _mm256_loadu_si256((const __m256i*)(src + i)) : _mm256_add_epi32(_mm256_set1_epi32((int32_t)i), step);
    _mm256_storeu_si256((__m256i*)(io + hits), _mm256_permutevar8x32_epi32(p, perm));
    return hits + __builtin_popcount(bits);
#else
    io[hits] = src ? src[i] : (int32_t)i;
    mo[hits] = y;
    return hits + m;
#endif
}

typedef struct { double cnt, s1, s2, sl, pos; int64_t hits; } sums_t;

/* One part [lo, hi): groups of G = U·VL elements, each vector of a group feeding its own
   accumulator of every sum (so the adds do not wait on each other; float32 within a chunk of
   CHUNK elements, float64 across), in blocks of BLOCK elements, then the < BLOCK elements left
   element by element. A group is loaded once: its sums are updated and, with a selection, its
   vectors tested against thr; a block with a hit is compacted, from registers when it is one
   group, else from L1. ABS: y = |x|; SH: shift != 0 (else y itself is the excess: no
   comparison); SQ: Σ excess²; LOG: Σ ln max(y, FLT_MIN) and #(y > 0); SEL: compact y > thr (2:
   thr == shift, the count's comparison serves). Each is a compile-time constant at each
   instantiation (always_inline). */
#define BLOCK 64  /* elements per test for a hit: one group with AVX-512, two or four with AVX2 */
static inline __attribute__((always_inline)) void scan_part(
        const float* restrict x, const int32_t* restrict src, int64_t lo, int64_t hi, float shift, float thr,
        int32_t* restrict io, float* restrict mo, sums_t* out, const int ABS, const int SH, const int SQ,
        const int LOG, const int SEL) {
    /* accumulators per sum: four, but two for AVX2's logarithms (its 16 registers would spill) */
    const int U = LOG && VL == 8 ? 2 : UNROLL, G = U * VL;
    const vf vs = v_set(shift), vt = v_set(thr), zero = v_set(0.0f), one = v_set(1.0f);
    const vi floor_bits = vi_set(0x00800000), mant_mask = vi_set(0x007fffff), one_bits = vi_set(0x3f800000);
    double s1 = 0.0, s2 = 0.0, sl = 0.0;
    int64_t cnt = 0, pos = 0, hits = 0, exps = 0;
    vf run = one;  /* per lane: the running product of mantissas, in [1, 2) */
    const int64_t end = lo + (hi - lo) / BLOCK * BLOCK;
    for (int64_t c = lo; c < end; c += CHUNK) {
        const int64_t ce = c + CHUNK < end ? c + CHUNK : end;
        vf a1[UNROLL], a2[UNROLL], pr[UNROLL];
        /* one accumulator each for the counts and the exponents: integer adds take one cycle */
        vc ac = c_zero(), ap = c_zero();
        vi ex = vi_set(0);
        for (int u = 0; u < U; u++) {
            a1[u] = zero; a2[u] = zero; pr[u] = one;
        }
        int logged = 0;
        for (int64_t b = c; b < ce; b += BLOCK) {
          vm any = v_gt(zero, one);  /* no hit yet */
          vf top = zero;  /* the block's largest y (a NaN y leaves it: never above thr) */
          for (int64_t g = b; g < b + BLOCK; g += G) {
            vf y[UNROLL];
            vm hit[UNROLL];
            for (int u = 0; u < U; u++) {
                y[u] = v_load(x + g + u * VL);
                if (ABS) y[u] = v_abs(y[u]);
                vf d = SH ? v_excess(y[u], vs) : y[u];
                a1[u] = v_add(a1[u], d);
                if (SQ) a2[u] = v_fma(d, d, a2[u]);
                vm above = v_gt(y[u], SH ? vs : zero);
                ac = c_add(ac, above);
                if (LOG) {
                    if (SH) ap = c_add(ap, v_gt(y[u], zero));
                    vi bits = vi_max(v_bits(y[u]), floor_bits);  /* max(y, FLT_MIN); y >= 0 */
                    ex = vi_add(ex, vi_shr23(bits));
                    pr[u] = v_mul(pr[u], v_float(vi_or(vi_and(bits, mant_mask), one_bits)));
                }
                if (SEL == 2) hit[u] = above;
                if (SEL == 1) top = v_max(y[u], top);
            }
            if (LOG && (++logged == 16 || g + G == ce)) {
                /* each lane's product of <= 16·U mantissas (< 2^64) split into exponent and
                   mantissa; the mantissa multiplied into the lane's running one (< 4), split again */
                vf p = pr[0];
                for (int u = 1; u < U; u++) p = v_mul(p, pr[u]);
                vi q = v_bits(p);
                vi r = v_bits(v_mul(run, v_float(vi_or(vi_and(q, mant_mask), one_bits))));
                ex = vi_add(ex, vi_add(vi_shr23(q), vi_shr23(r)));
                exps -= 2 * 127 * VL;
                run = v_float(vi_or(vi_and(r, mant_mask), one_bits));
                for (int u = 0; u < U; u++) pr[u] = one;
                logged = 0;
            }
            if (SEL) {
                /* at thr != shift one comparison of the group's largest y tests it */
                vm group_hit = SEL == 1 ? v_gt(top, vt) : hit[0];
                for (int u = 1; SEL == 2 && u < U; u++) group_hit = m_or(group_hit, hit[u]);
                if (G == BLOCK) {  /* the block is this group: compact from registers */
                    if (m_any(group_hit))
                        for (int u = 0; u < U; u++)
                            hits = vec_select(y[u], SEL == 2 ? hit[u] : v_gt(y[u], vt), g + u * VL, src, io, mo, hits);
                } else if (SEL == 2) {
                    any = m_or(any, group_hit);
                }
            }
          }
          if (SEL == 1 && G < BLOCK) any = v_gt(top, vt);
          if (SEL && G < BLOCK && m_any(any)) {  /* one test per block, then its vectors again (from L1) */
#if defined(__AVX2__) && !defined(__AVX512F__)
              /* the block's 64-bit hit mask, then only its vectors with a hit */
              const vf t = SEL == 2 ? (SH ? vs : zero) : vt;
              uint64_t m = 0;
              for (int j = 0; j < BLOCK; j += VL) {
                  vf y = v_load(x + b + j);
                  if (ABS) y = v_abs(y);
                  m |= (uint64_t)(uint32_t)_mm256_movemask_ps(v_gt(y, t)) << j;
              }
              while (m) {
                  int j = __builtin_ctzll(m) & ~(VL - 1);
                  m &= ~(0xffULL << j);
                  vf y = v_load(x + b + j);
                  if (ABS) y = v_abs(y);
                  hits = vec_select(y, v_gt(y, t), b + j, src, io, mo, hits);
              }
#else
              for (int64_t i = b; i < b + BLOCK; i += VL) {
                  vf y = v_load(x + i);
                  if (ABS) y = v_abs(y);
                  hits = vec_select(y, v_gt(y, SEL == 2 ? (SH ? vs : zero) : vt), i, src, io, mo, hits);
              }
#endif
          }
        }
        vf t1 = a1[0], t2 = a2[0];
        for (int u = 1; u < U; u++) {
            t1 = v_add(t1, a1[u]); t2 = v_add(t2, a2[u]);
        }
        s1 += v_sum(t1);
        if (SQ) s2 += v_sum(t2);
        cnt += c_sum(ac);
        if (LOG) {
            exps += vi_sum(ex);
            if (SH) pos += c_sum(ap);
        }
    }
    /* the last < BLOCK elements */
    float t1 = 0.0f, t2 = 0.0f, prod = 1.0f;
    for (int64_t i = end; i < hi; i++) {
        float y = ABS ? fabsf(x[i]) : x[i];
        float d = SH ? (y <= shift ? 0.0f : y - shift) : y;
        t1 += d;
        if (SQ) t2 += d * d;
        cnt += SH ? y > shift : y > 0.0f;
        if (LOG) {
            if (SH) pos += y > 0.0f;
            int32_t bits;
            memcpy(&bits, &y, sizeof bits);
            bits = bits > 0x00800000 ? bits : 0x00800000;
            exps += bits >> 23;
            bits = (bits & 0x007fffff) | 0x3f800000;
            float m;
            memcpy(&m, &bits, sizeof m);
            prod *= m;
        }
        if (SEL) {
            io[hits] = src ? src[i] : (int32_t)i;
            mo[hits] = y;
            hits += y > thr;
        }
    }
    if (LOG) {
        sl += (double)fast_logf(prod) + fast_logf(v_hprod(run)) + (double)(exps - 127 * (hi - lo)) * LN2;
        if (!SH) pos = cnt;
    }
    out->cnt = (double)cnt; out->s1 = s1 + t1; out->s2 = s2 + t2; out->sl = sl; out->pos = (double)pos;
    out->hits = hits;
}

typedef void (*part_fn)(const float*, const int32_t*, int64_t, int64_t, float, float, int32_t*, float*, sums_t*);
#define PART(A, S, Q, L, E)                                                                         \
    static void part_##A##S##Q##L##E(const float* x, const int32_t* src, int64_t lo, int64_t hi,   \
                                     float shift, float thr, int32_t* io, float* mo, sums_t* out) { \
        scan_part(x, src, lo, hi, shift, thr, io, mo, out, A, S, Q, L, E);                          \
    }
#define PARTS3(A, S, Q, L) PART(A, S, Q, L, 0) PART(A, S, Q, L, 1) PART(A, S, Q, L, 2)
#define PARTS6(A, S, Q) PARTS3(A, S, Q, 0) PARTS3(A, S, Q, 1)
PARTS6(1, 0, 0) PARTS6(1, 0, 1) PARTS6(1, 1, 0) PARTS6(1, 1, 1)
PARTS3(0, 1, 0, 0) PARTS3(0, 1, 1, 0)
#define ROW(A, S, Q, L) {part_##A##S##Q##L##0, part_##A##S##Q##L##1, part_##A##S##Q##L##2}
/* [absolute][shift != 0][squares][logs][select: none, at thr, at shift]; |x| is never below a zero
   shift, x can be: x always takes the shifted loops, and no logarithms */
static const part_fn parts_table[2][2][2][2][3] = {
    {{{ROW(0, 1, 0, 0), ROW(0, 1, 0, 0)}, {ROW(0, 1, 1, 0), ROW(0, 1, 1, 0)}},
     {{ROW(0, 1, 0, 0), ROW(0, 1, 0, 0)}, {ROW(0, 1, 1, 0), ROW(0, 1, 1, 0)}}},
    {{{ROW(1, 0, 0, 0), ROW(1, 0, 0, 1)}, {ROW(1, 0, 1, 0), ROW(1, 0, 1, 1)}},
     {{ROW(1, 1, 0, 0), ROW(1, 1, 0, 1)}, {ROW(1, 1, 1, 0), ROW(1, 1, 1, 1)}}}};

/* out[0..4]: #(y > shift), Σ(y − shift), Σ(y − shift)² over them (want_sq only, else 0),
   Σ ln max(y, FLT_MIN) and #(y > 0) (want_log only, with absolute only; else 0).
   Part p of a static partition into `parts` ranges compacts into idx_buf/mag_buf[lo_p ...]; the
   parts are then moved together. Returns the number of hits (0 without select). */
int64_t sidco_scan(const float* x, const int32_t* src, int64_t n, int absolute, float shift, int want_sq,
                   int want_log, int select, float thr, int parts, int32_t* idx_buf, float* mag_buf,
                   double* out) {
    sums_t part_sums[256];
    if (parts > 256) parts = 256;
    if (parts < 1) parts = 1;
    absolute = absolute != 0;
    int shifted = !absolute || shift != 0.0f;
    int mode = !select ? 0 : thr == (shifted ? shift : 0.0f) ? 2 : 1;
    part_fn fn = parts_table[absolute][shifted][want_sq != 0][absolute && want_log][mode];
    if (parts == 1) {  /* no parallel region: entering even a one-thread one costs 0.6 us */
        fn(x, src, 0, n, shift, thr, select ? idx_buf : NULL, select ? mag_buf : NULL, &part_sums[0]);
    } else {
        #pragma omp parallel for num_threads(parts) schedule(static, 1)
        for (int part = 0; part < parts; part++) {
            int64_t lo = n * part / parts, hi = n * (part + 1) / parts;
            fn(x, src, lo, hi, shift, thr, select ? idx_buf + lo : NULL, select ? mag_buf + lo : NULL,
               &part_sums[part]);
        }
    }
    sums_t t = {0, 0, 0, 0, 0, 0};
    for (int part = 0; part < parts; part++) {
        t.cnt += part_sums[part].cnt; t.s1 += part_sums[part].s1; t.s2 += part_sums[part].s2;
        t.sl += part_sums[part].sl; t.pos += part_sums[part].pos;
    }
    out[0] = t.cnt; out[1] = t.s1; out[2] = t.s2; out[3] = t.sl; out[4] = t.pos;
    if (!select) return 0;
    int64_t total = part_sums[0].hits;
    for (int part = 1; part < parts; part++) {
        int64_t lo = n * part / parts, count = part_sums[part].hits;
        if (count && total != lo) {
            memmove(idx_buf + total, idx_buf + lo, (size_t)count * sizeof(int32_t));
            memmove(mag_buf + total, mag_buf + lo, (size_t)count * sizeof(float));
        }
        total += count;
    }
    return total;
}
"""
