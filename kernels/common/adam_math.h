// Keras Adam's float operations on one element, shared by every fused Adam update.
//
// The static tables' sparse updates (kernels/sparse_apply) and the HybridHash
// store's (kernels/hybrid_hash) reproduce Keras's Adam bit for bit, so they
// must write its expressions in its order: the data-free start of a sparse
// update, s.assign_add(-s * (1 - beta)), then the gradient's scatter_add, then
// the step. c = 1 - beta; alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t).
// TF-free and header-only: inlined into each caller's (vectorised) loop.
#ifndef HYBRIDTF_KERNELS_COMMON_ADAM_MATH_H_
#define HYBRIDTF_KERNELS_COMMON_ADAM_MATH_H_

#include <cmath>

namespace hybridtf {
namespace adam_math {

// A moment's data-free decay: s + (-s) * c.
inline float Decay(float s, float c) { return s + (-s) * c; }

// The first moment after the gradient: decayed, then + g * c1.
inline float FirstMoment(float m, float g, float c1) { return Decay(m, c1) + g * c1; }

// The second moment after the gradient: decayed, then + (g * g) * c2.
inline float SecondMoment(float v, float g, float c2) { return Decay(v, c2) + (g * g) * c2; }

// The weight after the step: w - (m * alpha) / (sqrt(v) + eps).
inline float Step(float w, float m, float v, float alpha, float eps) {
  return w - (m * alpha) / (std::sqrt(v) + eps);
}

}  // namespace adam_math
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_COMMON_ADAM_MATH_H_
