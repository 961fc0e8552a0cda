// TF-free implementation layer of Dice (CPU): DIN's data-adaptive activation
// with its train-mode batch normalization, forward and backward in two passes
// each instead of TensorFlow's chain of element-wise ops and reductions.
//
// x is a [rows, units] matrix (any leading axes flattened into rows), alpha a
// [units] vector. Per unit c, over all rows:
//
//   mean[c]     = sum_r x[r, c] / rows
//   variance[c] = sum_r (x[r, c] - mean[c])^2 / rows          (biased, as tf.nn.moments)
//   inv[c]      = 1 / sqrt(variance[c] + epsilon)
//   z           = x * inv + (-mean * inv)                     (tf.nn.batch_normalization,
//                                                              no offset, no scale)
//   p           = sigmoid(z)
//   y           = alpha * (1 - p) * x + p * x
//
// Backward (dy given, plus optional gradients of the mean and variance
// outputs) is the full train-mode gradient: through z directly and through
// mean and variance (the variance's own use of the mean contributes nothing:
// its derivative sums x - mean over rows, which is zero, and
// tf.nn.moments stops that gradient too).
//
// Determinism: the per-unit reductions are summed in double over fixed blocks
// of kDiceBlockRows rows, then the blocks' partial sums in block order. The
// result depends neither on the thread count nor on how ParallelFor shards
// the blocks. Element-wise work is independent per element.
#ifndef HYBRIDTF_KERNELS_DICE_DICE_IMPL_H_
#define HYBRIDTF_KERNELS_DICE_DICE_IMPL_H_

#include <cstdint>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"

namespace hybridtf {
namespace dice {

// Rows per reduction block (fixed: it decides the summation order).
constexpr int64_t kDiceBlockRows = 256;

// InvalidArgument unless rows >= 1, units >= 1, alpha_len == units,
// rows * units fits int64 and epsilon is finite and >= 0.
ImplStatus CheckDiceShapes(int64_t rows, int64_t units, int64_t alpha_len, double epsilon);

// y[rows, units], mean[units], variance[units] as above.
template <typename T>
ImplStatus DiceForward(const T* x, const T* alpha, int64_t rows, int64_t units, T epsilon, T* y,
                       T* mean, T* variance, const ParallelFor& parallel_for);

// dx[rows, units] and dalpha[units] for dy ([rows, units]) and the gradients
// of the mean and variance outputs (dmean, dvariance: [units] each, or
// nullptr for zero), given the forward's inputs and its mean and variance.
template <typename T>
ImplStatus DiceBackward(const T* dy, const T* dmean, const T* dvariance, const T* x, const T* alpha,
                        const T* mean, const T* variance, int64_t rows, int64_t units, T epsilon,
                        T* dx, T* dalpha, const ParallelFor& parallel_for);

}  // namespace dice
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_DICE_DICE_IMPL_H_
