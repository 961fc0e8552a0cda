// Compile-time row widths for the per-row loops of the *_impl layers.
//
// DispatchDim(dim, fn) calls fn(std::integral_constant<int, D>()) with D == dim
// for the common embedding widths, so that a loop over D values has a
// constant trip count and vectorizes; any other width gets D == 0, meaning
// "use the run-time dim".
#ifndef HYBRIDTF_KERNELS_COMMON_DISPATCH_DIM_H_
#define HYBRIDTF_KERNELS_COMMON_DISPATCH_DIM_H_

#include <cstdint>
#include <type_traits>

namespace hybridtf {

template <typename Fn>
void DispatchDim(int64_t dim, Fn&& fn) {
  switch (dim) {
    case 1:
      return fn(std::integral_constant<int, 1>());
    case 4:
      return fn(std::integral_constant<int, 4>());
    case 8:
      return fn(std::integral_constant<int, 8>());
    case 16:
      return fn(std::integral_constant<int, 16>());
    case 32:
      return fn(std::integral_constant<int, 32>());
    case 64:
      return fn(std::integral_constant<int, 64>());
    default:
      return fn(std::integral_constant<int, 0>());
  }
}

}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_COMMON_DISPATCH_DIM_H_
