// CUDA kernels of the HybridHash hot tier (TF-free), running the bodies of
// hybrid_hash_hot.h: the lookup's search with one thread per id, the row
// copies and the updates with one thread per (id, column) element, so that a
// warp reads and writes whole rows contiguously.
#include <cuda_runtime.h>

#include <string>

#include "kernels/hybrid_hash/hybrid_hash_impl_cuda.h"

namespace hybridtf {
namespace hybrid_hash {
namespace {

constexpr int kThreads = 256;

// The most threads one launch of a 1-D grid can have.
constexpr int64_t kMaxThreads = int64_t{2147483647} * kThreads;

inline int Blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

ImplStatus Launched(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return ImplStatus::Ok();
  return ImplStatus::Internal(std::string("CUDA error launching ") + what + ": " +
                              cudaGetErrorString(err));
}

// The lookup in two launches: one thread per id finds its entry (a binary
// search), then one thread per (id, column) element copies the hot rows.
__global__ void FindKernel(hot::HotIndex index, const int64_t* ids, int64_t n, int32_t* entry) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) entry[i] = hot::FindEntry(index, ids[i]);
}

__global__ void CopyKernel(HotTierGpu tier, const int32_t* entry, int64_t elements, float* out) {
  const int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (k < elements) hot::CopyElem(tier.rows, tier.row_floats, tier.dim, entry, out, k);
}

__global__ void SgdKernel(HotTierGpu tier, const int32_t* entry, const float* grad,
                          int64_t elements, float lr) {
  const int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (k >= elements) return;
  const int64_t at = hot::ElementOffset(tier.row_floats, tier.dim, entry, k);
  if (at >= 0) hot::SgdElem(tier.rows + at, grad[k], lr);
}

__global__ void AdagradKernel(HotTierGpu tier, const int32_t* entry, const float* grad,
                              int64_t elements, float lr, float eps) {
  const int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (k >= elements) return;
  const int64_t at = hot::ElementOffset(tier.row_floats, tier.dim, entry, k);
  if (at >= 0) hot::AdagradElem(tier.rows + at, tier.rows + at + tier.dim, grad[k], lr, eps);
}

__global__ void LazyAdamKernel(HotTierGpu tier, const int32_t* entry, const float* grad,
                               int64_t elements, float alpha, float c1, float c2, float eps) {
  const int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (k >= elements) return;
  const int64_t at = hot::ElementOffset(tier.row_floats, tier.dim, entry, k);
  if (at >= 0) {
    float* w = tier.rows + at;
    hot::LazyAdamElem(w, w + tier.dim, w + 2 * tier.dim, grad[k], alpha, c1, c2, eps);
  }
}

// n ids of tier.dim columns: the number of element threads, overflow-checked;
// and entries wide enough for the row and `slots` optimizer slots.
ImplStatus Elements(const HotTierGpu& tier, int64_t n, int64_t slots, int64_t* elements) {
  if (n < 0 || tier.dim <= 0 || n > kMaxThreads / tier.dim) {
    return ImplStatus::InvalidArgument("HybridHash hot tier: " + std::to_string(n) + " ids of " +
                                       std::to_string(tier.dim) +
                                       " columns is out of range; split the batch");
  }
  if (tier.row_floats < (1 + slots) * tier.dim) {  // dim <= kMaxThreads: no overflow
    return ImplStatus::InvalidArgument(
        "HybridHash hot tier: entries of " + std::to_string(tier.row_floats) +
        " floats cannot hold a row of " + std::to_string(tier.dim) + " and " +
        std::to_string(slots) + " optimizer slot(s); build the tier for this optimizer");
  }
  *elements = n * tier.dim;
  return ImplStatus::Ok();
}

}  // namespace

// Updates need distinct entries (as the CPU store needs distinct ids): no two threads
// share an element. Not checked on the device: callers pass the entries of a
// lookup of distinct ids (a Unique&Partition's output, as the packed chain has).
ImplStatus HotLookupGpu(const HotTierGpu& tier, const int64_t* ids, int64_t n, float* out,
                        int32_t* entry, void* stream) {
  int64_t elements = 0;
  ImplStatus s = Elements(tier, n, 0, &elements);
  if (!s.ok() || elements == 0) return s;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  FindKernel<<<Blocks(n), kThreads, 0, st>>>(tier.index, ids, n, entry);
  s = Launched("HybridHash hot lookup (find)");
  if (!s.ok()) return s;
  CopyKernel<<<Blocks(elements), kThreads, 0, st>>>(tier, entry, elements, out);
  return Launched("HybridHash hot lookup");
}

ImplStatus HotSgdGpu(const HotTierGpu& tier, const int32_t* entry, const float* grad, int64_t n,
                     float lr, void* stream) {
  int64_t elements = 0;
  ImplStatus s = Elements(tier, n, 0, &elements);
  if (!s.ok() || elements == 0) return s;
  SgdKernel<<<Blocks(elements), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(tier, entry, grad,
                                                                                  elements, lr);
  return Launched("HybridHash hot SGD");
}

ImplStatus HotAdagradGpu(const HotTierGpu& tier, const int32_t* entry, const float* grad, int64_t n,
                         float lr, float eps, void* stream) {
  int64_t elements = 0;
  ImplStatus s = Elements(tier, n, 1, &elements);
  if (!s.ok() || elements == 0) return s;
  AdagradKernel<<<Blocks(elements), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      tier, entry, grad, elements, lr, eps);
  return Launched("HybridHash hot Adagrad");
}

ImplStatus HotLazyAdamGpu(const HotTierGpu& tier, const int32_t* entry, const float* grad,
                          int64_t n, float alpha, float c1, float c2, float eps, void* stream) {
  int64_t elements = 0;
  ImplStatus s = Elements(tier, n, 2, &elements);
  if (!s.ok() || elements == 0) return s;
  LazyAdamKernel<<<Blocks(elements), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      tier, entry, grad, elements, alpha, c1, c2, eps);
  return Launched("HybridHash hot LazyAdam");
}

}  // namespace hybrid_hash
}  // namespace hybridtf
