// The exp core of the AVX-512 kernels (Cephes expf): x = k ln 2 + r with k = round(x / ln 2) and ln 2 in two
// parts (Cody-Waite, so r is exact), exp(r) by a degree-6 minimax polynomial on |r| <= ln 2 / 2. Each caller
// clamps x to the range it needs and applies 2^k its own way (scalef, or the exponent bits).
#pragma once

#ifdef __AVX512F__
#include <immintrin.h>

namespace modelplex_vec {

// exp(r) for x = k ln 2 + r; k is returned through `k`.
inline __m512 exp_reduced(__m512 x, __m512& k) {
  k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  return _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
}

}  // namespace modelplex_vec
#endif
