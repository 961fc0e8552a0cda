// ParallelFor over the CPU device's TensorFlow thread pool (for OpKernels).
#ifndef HYBRIDTF_KERNELS_COMMON_TF_PARALLEL_FOR_H_
#define HYBRIDTF_KERNELS_COMMON_TF_PARALLEL_FOR_H_

#include "kernels/common/parallel_for.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace hybridtf {

inline ParallelFor CpuParallelFor(::tensorflow::OpKernelContext* ctx) {
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [pool](int64_t total, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    pool->ParallelFor(total, cost, fn);
  };
}

}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_COMMON_TF_PARALLEL_FOR_H_
