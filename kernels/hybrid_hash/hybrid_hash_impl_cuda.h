// TF-free CUDA layer of the HybridHash hot tier: lookup and fused updates of
// the rows held in device memory (bodies in hybrid_hash_hot.h, shared with
// host loops). Pointers are device pointers; streams are passed as `void*`
// (a cudaStream_t). Each call queues one kernel and does not synchronize.
#ifndef HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_IMPL_CUDA_H_
#define HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_IMPL_CUDA_H_

#include <cstdint>

#include "kernels/common/status.h"
#include "kernels/hybrid_hash/hybrid_hash_hot.h"

namespace hybridtf {
namespace hybrid_hash {

struct HotTierGpu {
  hot::HotIndex index;  // device arrays
  float* rows;          // [entries, row_floats]
  int64_t row_floats;
  int64_t dim;
};

ImplStatus HotLookupGpu(const HotTierGpu& tier, const int64_t* ids, int64_t n, float* out,
                        int32_t* entry, void* stream);
// The updates need distinct entries (no two ids of a call in the same hot
// entry): two threads would otherwise update the same floats, and one update
// would be lost. The CPU store refuses repeated ids; here the caller passes the
// entries HotLookupGpu found for distinct ids (a Unique&Partition's output).
// Entries must hold the row and the optimizer's slots: row_floats >=
// (1 + slots) * dim (SGD 0, Adagrad 1, LazyAdam 2), else InvalidArgument.
ImplStatus HotSgdGpu(const HotTierGpu& tier, const int32_t* entry, const float* grad, int64_t n,
                     float lr, void* stream);
ImplStatus HotAdagradGpu(const HotTierGpu& tier, const int32_t* entry, const float* grad, int64_t n,
                         float lr, float eps, void* stream);
ImplStatus HotLazyAdamGpu(const HotTierGpu& tier, const int32_t* entry, const float* grad,
                          int64_t n, float alpha, float c1, float c2, float eps, void* stream);

}  // namespace hybrid_hash
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_IMPL_CUDA_H_
