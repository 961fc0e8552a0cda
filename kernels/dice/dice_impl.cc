// CPU implementation of Dice and its gradient. See dice_impl.h.
#include "kernels/dice/dice_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/checked_math.h"
#include "kernels/common/multiversion.h"

// The row loops compare floats (Exp's clamp); with trapping math, GCC keeps
// those as branches and does not vectorize. No trap is ever enabled, and the
// flag changes no result (only whether a comparison may be speculated).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

namespace hybridtf {
namespace dice {

namespace {

// Always inlined into the HYBRIDTF_MULTIVERSION clones of their callers.
#define HYBRIDTF_DICE_INLINE inline __attribute__((always_inline))

// exp(v) for float, branch-free so that the row loops vectorize: v clamped to
// [-87, 88], v = k ln2 + f with |f| <= ln2 / 2 (k rounded to nearest by the
// 1.5 * 2^23 shift), e^f by its degree-7 Taylor polynomial (truncation below
// 1e-8 relative), times 2^k built in the exponent bits. Within a few ulp of
// std::exp over the clamped range.
HYBRIDTF_DICE_INLINE float Exp(float v) {
  v = v < -87.0f ? -87.0f : v;
  v = v > 88.0f ? 88.0f : v;
  const float shift = 12582912.0f;  // 1.5 * 2^23
  const float k = (v * 1.44269504088896341f + shift) - shift;
  const float f = (v - k * 0.693145751953125f) - k * 1.428606765330187e-06f;
  float e = 1.0f / 5040.0f;
  e = e * f + 1.0f / 720.0f;
  e = e * f + 1.0f / 120.0f;
  e = e * f + 1.0f / 24.0f;
  e = e * f + 1.0f / 6.0f;
  e = e * f + 0.5f;
  e = e * f + 1.0f;
  e = e * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return e * scale;
}

HYBRIDTF_DICE_INLINE float Sigmoid(float z) { return 1.0f / (1.0f + Exp(-z)); }
HYBRIDTF_DICE_INLINE double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

int64_t NumBlocks(int64_t rows) { return rows / kDiceBlockRows + (rows % kDiceBlockRows != 0); }

// partial[b * units + c] = sum over the rows of block b of x[r, c] (double).
template <typename T>
HYBRIDTF_MULTIVERSION void SumBlocks(const T* __restrict x, int64_t rows, int64_t units, int64_t b0,
                                     int64_t b1, double* __restrict partial) {
  for (int64_t b = b0; b < b1; ++b) {
    double* acc = partial + b * units;
    for (int64_t c = 0; c < units; ++c) acc[c] = 0.0;
    const int64_t r1 = std::min(rows, (b + 1) * kDiceBlockRows);
    for (int64_t r = b * kDiceBlockRows; r < r1; ++r) {
      const T* xr = x + r * units;
      for (int64_t c = 0; c < units; ++c) acc[c] += static_cast<double>(xr[c]);
    }
  }
}

// partial[b * units + c] = sum over the rows of block b of (x[r, c] - mean[c])^2 (double).
template <typename T>
HYBRIDTF_MULTIVERSION void SquaredDeviationBlocks(const T* __restrict x,
                                                  const double* __restrict mean, int64_t rows,
                                                  int64_t units, int64_t b0, int64_t b1,
                                                  double* __restrict partial) {
  for (int64_t b = b0; b < b1; ++b) {
    double* acc = partial + b * units;
    for (int64_t c = 0; c < units; ++c) acc[c] = 0.0;
    const int64_t r1 = std::min(rows, (b + 1) * kDiceBlockRows);
    for (int64_t r = b * kDiceBlockRows; r < r1; ++r) {
      const T* xr = x + r * units;
      for (int64_t c = 0; c < units; ++c) {
        const double d = static_cast<double>(xr[c]) - mean[c];
        acc[c] += d * d;
      }
    }
  }
}

// out[c] = sum over blocks, in block order, of partial[b * stride + c].
void CombineBlocks(const double* partial, int64_t blocks, int64_t stride, int64_t units,
                   double* out) {
  for (int64_t c = 0; c < units; ++c) out[c] = 0.0;
  for (int64_t b = 0; b < blocks; ++b) {
    const double* p = partial + b * stride;
    for (int64_t c = 0; c < units; ++c) out[c] += p[c];
  }
}

// y for the rows of blocks [b0, b1): z = x * inv + shift (shift = -mean * inv).
template <typename T>
HYBRIDTF_MULTIVERSION void ForwardBlocks(const T* __restrict x, const T* __restrict alpha,
                                         const T* __restrict inv, const T* __restrict shift,
                                         int64_t rows, int64_t units, int64_t b0, int64_t b1,
                                         T* __restrict y) {
  const int64_t r0 = b0 * kDiceBlockRows, r1 = std::min(rows, b1 * kDiceBlockRows);
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * units;
    T* yr = y + r * units;
    for (int64_t c = 0; c < units; ++c) {
      const T v = xr[c];
      const T p = Sigmoid(v * inv[c] + shift[c]);
      yr[c] = alpha[c] * (T(1) - p) * v + p * v;
    }
  }
}

// The first backward pass for the rows of blocks [b0, b1): the three per-unit
// sums, partial[b * 3 * units + {0, 1, 2} * units + c] = sum of dy * x * (1 - p)
// (dalpha), of dz * (x - mean) and of dz, dz being the gradient of z; and the
// part of dx that needs p (the direct term + dz * inv), so that the second
// pass does not evaluate the sigmoid again.
template <typename T>
HYBRIDTF_MULTIVERSION void BackwardSumBlocks(const T* __restrict dy, const T* __restrict x,
                                             const T* __restrict alpha, const T* __restrict mean,
                                             const T* __restrict inv, const T* __restrict shift,
                                             int64_t rows, int64_t units, int64_t b0, int64_t b1,
                                             double* __restrict partial, T* __restrict dx) {
  for (int64_t b = b0; b < b1; ++b) {
    double* sa = partial + b * 3 * units;
    double* s1 = sa + units;
    double* s2 = s1 + units;
    for (int64_t c = 0; c < 3 * units; ++c) sa[c] = 0.0;
    const int64_t r1 = std::min(rows, (b + 1) * kDiceBlockRows);
    for (int64_t r = b * kDiceBlockRows; r < r1; ++r) {
      const T* xr = x + r * units;
      const T* gr = dy + r * units;
      T* dr = dx + r * units;
      for (int64_t c = 0; c < units; ++c) {
        const T v = xr[c], g = gr[c];
        const T p = Sigmoid(v * inv[c] + shift[c]);
        const T q = T(1) - p;
        const T dz = g * (v - alpha[c] * v) * (p * q);
        dr[c] = g * (alpha[c] * q + p) + dz * inv[c];
        sa[c] += static_cast<double>(g * v * q);
        s1[c] += static_cast<double>(dz * (v - mean[c]));
        s2[c] += static_cast<double>(dz);
      }
    }
  }
}

// dx for the rows of blocks [b0, b1), given the first pass's part of it: plus
// the terms through the variance (coef_var * (x - mean)) and the mean (coef_mean),
// added in that order.
template <typename T>
HYBRIDTF_MULTIVERSION void BackwardBlocks(const T* __restrict x, const T* __restrict mean,
                                          const T* __restrict coef_var,
                                          const T* __restrict coef_mean, int64_t rows,
                                          int64_t units, int64_t b0, int64_t b1, T* __restrict dx) {
  const int64_t r0 = b0 * kDiceBlockRows, r1 = std::min(rows, b1 * kDiceBlockRows);
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * units;
    T* dr = dx + r * units;
    for (int64_t c = 0; c < units; ++c) {
      dr[c] = dr[c] + coef_var[c] * (xr[c] - mean[c]) + coef_mean[c];
    }
  }
}

// inv = 1 / sqrt(variance + epsilon) and shift = -mean * inv, per unit, as
// tf.nn.batch_normalization rounds them (the sum in T, the root in double).
template <typename T>
void Normalizer(const T* mean, const T* variance, int64_t units, T epsilon, std::vector<T>* inv,
                std::vector<T>* shift) {
  inv->resize(units);
  shift->resize(units);
  for (int64_t c = 0; c < units; ++c) {
    const T ve = variance[c] + epsilon;
    (*inv)[c] = static_cast<T>(1.0 / std::sqrt(static_cast<double>(ve)));
    (*shift)[c] = -mean[c] * (*inv)[c];
  }
}

int64_t BlockCost(int64_t units, int64_t per_element) {
  return SaturatingMul(SaturatingMul(kDiceBlockRows, units), per_element);
}

}  // namespace

ImplStatus CheckDiceShapes(int64_t rows, int64_t units, int64_t alpha_len, double epsilon) {
  if (rows < 1 || units < 1) {
    return ImplStatus::InvalidArgument(
        "Dice needs at least one row and one unit, got x with " + std::to_string(rows) +
        " rows of " + std::to_string(units) +
        " units; batch statistics of an empty batch are undefined (feed a non-empty batch).");
  }
  if (alpha_len != units) {
    return ImplStatus::InvalidArgument("Dice: alpha has " + std::to_string(alpha_len) +
                                       " values but x has " + std::to_string(units) +
                                       " units (its last axis); alpha needs one value per unit.");
  }
  int64_t n = 0;
  if (!CheckedMul(rows, units, &n)) {
    return ImplStatus::InvalidArgument("Dice: rows * units overflows int64 (" +
                                       std::to_string(rows) + " x " + std::to_string(units) +
                                       "); split the input.");
  }
  if (!std::isfinite(epsilon) || epsilon < 0) {
    return ImplStatus::InvalidArgument("Dice: epsilon must be finite and >= 0, got " +
                                       std::to_string(epsilon) + ".");
  }
  return ImplStatus::Ok();
}

template <typename T>
ImplStatus DiceForward(const T* x, const T* alpha, int64_t rows, int64_t units, T epsilon, T* y,
                       T* mean, T* variance, const ParallelFor& parallel_for) {
  const ImplStatus shapes = CheckDiceShapes(rows, units, units, static_cast<double>(epsilon));
  if (!shapes.ok()) return shapes;
  const int64_t blocks = NumBlocks(rows);
  std::vector<double> partial(blocks * units);  // blocks * units <= rows * units: fits
  std::vector<double> total(units), mean_d(units);
  parallel_for(blocks, BlockCost(units, 1),
               [&](int64_t b0, int64_t b1) { SumBlocks(x, rows, units, b0, b1, partial.data()); });
  CombineBlocks(partial.data(), blocks, units, units, total.data());
  for (int64_t c = 0; c < units; ++c) {  // the deviations from the unrounded mean
    mean_d[c] = total[c] / static_cast<double>(rows);
    mean[c] = static_cast<T>(mean_d[c]);
  }
  parallel_for(blocks, BlockCost(units, 2), [&](int64_t b0, int64_t b1) {
    SquaredDeviationBlocks(x, mean_d.data(), rows, units, b0, b1, partial.data());
  });
  CombineBlocks(partial.data(), blocks, units, units, total.data());
  for (int64_t c = 0; c < units; ++c) {
    variance[c] = static_cast<T>(total[c] / static_cast<double>(rows));
  }
  std::vector<T> inv, shift;
  Normalizer(mean, variance, units, epsilon, &inv, &shift);
  parallel_for(blocks, BlockCost(units, 20), [&](int64_t b0, int64_t b1) {
    ForwardBlocks(x, alpha, inv.data(), shift.data(), rows, units, b0, b1, y);
  });
  return ImplStatus::Ok();
}

template <typename T>
ImplStatus DiceBackward(const T* dy, const T* dmean, const T* dvariance, const T* x, const T* alpha,
                        const T* mean, const T* variance, int64_t rows, int64_t units, T epsilon,
                        T* dx, T* dalpha, const ParallelFor& parallel_for) {
  const ImplStatus shapes = CheckDiceShapes(rows, units, units, static_cast<double>(epsilon));
  if (!shapes.ok()) return shapes;
  const int64_t blocks = NumBlocks(rows);
  std::vector<T> inv, shift;
  Normalizer(mean, variance, units, epsilon, &inv, &shift);
  std::vector<double> partial(SaturatingMul(blocks, 3 * units));  // <= 3 * rows * units doubles
  std::vector<double> sums(3 * units);
  parallel_for(blocks, BlockCost(units, 25), [&](int64_t b0, int64_t b1) {
    BackwardSumBlocks(dy, x, alpha, mean, inv.data(), shift.data(), rows, units, b0, b1,
                      partial.data(), dx);
  });
  CombineBlocks(partial.data(), blocks, 3 * units, 3 * units, sums.data());
  const double n = static_cast<double>(rows);
  std::vector<T> coef_var(units), coef_mean(units);
  for (int64_t c = 0; c < units; ++c) {
    dalpha[c] = static_cast<T>(sums[c]);
    const double ve = static_cast<double>(static_cast<T>(variance[c] + epsilon));
    const double r = static_cast<double>(inv[c]);
    // z = x * r - mean * r: dz/dr = x - mean, dz/dmean = -r; r = ve^(-1/2): dr/dvariance =
    // -ve^(-3/2) / 2.
    double d_mean = -r * sums[2 * units + c];
    double d_var = -0.5 / (ve * std::sqrt(ve)) * sums[units + c];
    if (dmean != nullptr) d_mean += static_cast<double>(dmean[c]);
    if (dvariance != nullptr) d_var += static_cast<double>(dvariance[c]);
    coef_var[c] = static_cast<T>(2.0 * d_var / n);
    coef_mean[c] = static_cast<T>(d_mean / n);
  }
  parallel_for(blocks, BlockCost(units, 4), [&](int64_t b0, int64_t b1) {
    BackwardBlocks(x, mean, coef_var.data(), coef_mean.data(), rows, units, b0, b1, dx);
  });
  return ImplStatus::Ok();
}

#define HYBRIDTF_INSTANTIATE(T)                                                                   \
  template ImplStatus DiceForward<T>(const T*, const T*, int64_t, int64_t, T, T*, T*, T*,         \
                                     const ParallelFor&);                                         \
  template ImplStatus DiceBackward<T>(const T*, const T*, const T*, const T*, const T*, const T*, \
                                      const T*, int64_t, int64_t, T, T*, T*, const ParallelFor&);

HYBRIDTF_INSTANTIATE(float)
HYBRIDTF_INSTANTIATE(double)
#undef HYBRIDTF_INSTANTIATE
#undef HYBRIDTF_DICE_INLINE

}  // namespace dice
}  // namespace hybridtf
