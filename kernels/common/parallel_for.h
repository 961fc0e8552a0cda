// The TF-free parallel-for interface of the *_impl layers.
//
// An implementation layer takes a ParallelFor and calls fn(begin, end) over
// [0, total); the caller decides how: TensorFlow's CPU thread pool in the
// OpKernels (tf_parallel_for.h), SequentialFor in the pybind11 module and
// tests. cost_per_unit is a rough cost of one unit of work, used for sharding.
#ifndef HYBRIDTF_KERNELS_COMMON_PARALLEL_FOR_H_
#define HYBRIDTF_KERNELS_COMMON_PARALLEL_FOR_H_

#include <cstdint>
#include <functional>

namespace hybridtf {

using ParallelFor = std::function<void(int64_t total, int64_t cost_per_unit,
                                       const std::function<void(int64_t, int64_t)>& fn)>;

inline void SequentialFor(int64_t total, int64_t /*cost_per_unit*/,
                          const std::function<void(int64_t, int64_t)>& fn) {
  fn(0, total);
}

}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_COMMON_PARALLEL_FOR_H_
