// CUDA kernels of the HybridHash hot tier (TF-free): one thread per looked-up
// id, running the bodies of hybrid_hash_hot.h on the range [i, i + 1).
#include <cuda_runtime.h>

#include <string>

#include "kernels/hybrid_hash/hybrid_hash_impl_cuda.h"

namespace hybridtf {
namespace hybrid_hash {
namespace {

constexpr int kThreads = 256;

inline int Blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

ImplStatus Launched(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return ImplStatus::Ok();
  return ImplStatus::Internal(std::string("CUDA error launching ") + what + ": " +
                              cudaGetErrorString(err));
}

__global__ void LookupKernel(HotTierGpu tier, const int64_t* ids, int64_t n, float* out,
                             int32_t* entry) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n)
    hot::LookupRange(tier.index, tier.rows, tier.row_floats, tier.dim, ids, out, entry, i, i + 1);
}

__global__ void SgdKernel(HotTierGpu tier, const int32_t* entry, const float* grad, int64_t n,
                          float lr) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) hot::SgdRange(entry, tier.rows, tier.row_floats, tier.dim, grad, lr, i, i + 1);
}

__global__ void AdagradKernel(HotTierGpu tier, const int32_t* entry, const float* grad, int64_t n,
                              float lr, float eps) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n)
    hot::AdagradRange(entry, tier.rows, tier.row_floats, tier.dim, grad, lr, eps, i, i + 1);
}

__global__ void LazyAdamKernel(HotTierGpu tier, const int32_t* entry, const float* grad, int64_t n,
                               float alpha, float c1, float c2, float eps) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) {
    hot::LazyAdamRange(entry, tier.rows, tier.row_floats, tier.dim, grad, alpha, c1, c2, eps, i,
                       i + 1);
  }
}

}  // namespace

// Updates need distinct ids (as on the CPU): one thread per id, no two threads share a row.
ImplStatus HotLookupGpu(const HotTierGpu& tier, const int64_t* ids, int64_t n, float* out,
                        int32_t* entry, void* stream) {
  if (n == 0) return ImplStatus::Ok();
  LookupKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(tier, ids, n, out,
                                                                              entry);
  return Launched("HybridHash hot lookup");
}

ImplStatus HotSgdGpu(const HotTierGpu& tier, const int32_t* entry, const float* grad, int64_t n,
                     float lr, void* stream) {
  if (n == 0) return ImplStatus::Ok();
  SgdKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(tier, entry, grad, n,
                                                                           lr);
  return Launched("HybridHash hot SGD");
}

ImplStatus HotAdagradGpu(const HotTierGpu& tier, const int32_t* entry, const float* grad, int64_t n,
                         float lr, float eps, void* stream) {
  if (n == 0) return ImplStatus::Ok();
  AdagradKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(tier, entry, grad, n,
                                                                               lr, eps);
  return Launched("HybridHash hot Adagrad");
}

ImplStatus HotLazyAdamGpu(const HotTierGpu& tier, const int32_t* entry, const float* grad,
                          int64_t n, float alpha, float c1, float c2, float eps, void* stream) {
  if (n == 0) return ImplStatus::Ok();
  LazyAdamKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      tier, entry, grad, n, alpha, c1, c2, eps);
  return Launched("HybridHash hot LazyAdam");
}

}  // namespace hybrid_hash
}  // namespace hybridtf
