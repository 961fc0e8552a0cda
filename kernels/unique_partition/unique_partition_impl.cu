// CUDA implementation of the fused Unique&Partition algorithm (TF-free).
// See unique_partition_impl_cuda.h for the algorithm and the contract.
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <limits>
#include <string>

#include "kernels/unique_partition/unique_partition_device.h"
#include "kernels/unique_partition/unique_partition_impl_cuda.h"

namespace hybridtf {
namespace unique_partition {
namespace {

constexpr int kThreads = 256;

#define HYBRIDTF_CUDA_RETURN_IF_ERROR(expr)                                  \
  do {                                                                       \
    const cudaError_t err_ = (expr);                                         \
    if (err_ != cudaSuccess) {                                               \
      return ImplStatus::Internal(std::string("CUDA error in " #expr ": ") + \
                                  cudaGetErrorString(err_));                 \
    }                                                                        \
  } while (0)

inline int Blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

template <typename T>
ImplStatus AllocateArray(DeviceScratch* scratch, int64_t count, T** out) {
  const size_t bytes = static_cast<size_t>(count > 0 ? count : 1) * sizeof(T);
  *out = static_cast<T*>(scratch->Allocate(bytes));
  if (*out == nullptr) {
    return ImplStatus::Internal("out of GPU memory: UniquePartition needs " +
                                std::to_string(bytes) + " bytes of scratch.");
  }
  return ImplStatus::Ok();
}

// Summary copied to the host in Prepare's single synchronization.
struct PrepareSummary {
  int32_t num_unique;
  int32_t first_bad_position;  // INT32_MAX when every id is valid
};

__global__ void IotaKernel(int32_t* out, int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = static_cast<int32_t>(i);
}

template <typename Id>
__global__ void MarkHeadsKernel(const Id* sorted, int64_t n, int32_t* heads) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j < n) device::MarkHead(sorted, j, heads);
}

template <typename Id>
__global__ void CollectUniquesKernel(device::CollectArgs<Id> args) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j < args.n) device::CollectUnique(args, j);
}

template <typename Id>
__global__ void ScatterUniquesKernel(const int32_t* order, const Id* uniq, int64_t num_unique,
                                     Id* out, int32_t* slot) {
  const int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (k < num_unique) device::ScatterUnique(order, uniq, k, out, slot);
}

template <typename Idx>
__global__ void InverseKernel(const int32_t* sorted_pos, const int32_t* segment,
                              const int32_t* slot, int64_t n, Idx* inverse) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j < n) device::Inverse(sorted_pos, segment, slot, j, inverse);
}

}  // namespace

template <typename Id>
ImplStatus UniquePartitionGpu<Id>::Prepare(const Id* d_ids, int64_t n,
                                           const PartitionSpec<Id>& spec, DeviceScratch* scratch,
                                           void* stream_ptr) {
  ImplStatus status = ValidateSpec(spec);
  if (!status.ok()) return status;
  status = ValidateLength(n);
  if (!status.ok()) return status;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  n_ = n;
  num_partitions_ = spec.num_partitions;
  scratch_ = scratch;
  sizes_.assign(static_cast<size_t>(num_partitions_), 0);
  num_unique_ = 0;
  if (n == 0) return ImplStatus::Ok();

  const bool range = spec.strategy == Strategy::kRange;
  Id* d_bounds = nullptr;
  if (range) {
    status = AllocateArray(scratch, spec.num_bounds, &d_bounds);
    if (!status.ok()) return status;
    HYBRIDTF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        d_bounds, spec.bounds, spec.num_bounds * sizeof(Id), cudaMemcpyHostToDevice, stream));
  }
  int32_t* positions = nullptr;
  Id* sorted = nullptr;
  int32_t* heads = nullptr;
  int32_t* counts = nullptr;
  PrepareSummary* d_summary = nullptr;
  for (ImplStatus s :
       {AllocateArray(scratch, n, &positions), AllocateArray(scratch, n, &sorted),
        AllocateArray(scratch, n, &sorted_pos_), AllocateArray(scratch, n, &heads),
        AllocateArray(scratch, n, &segment_), AllocateArray(scratch, n, &uniq_),
        AllocateArray(scratch, n, &keys_), AllocateArray(scratch, num_partitions_, &counts),
        AllocateArray(scratch, 1, &d_summary)}) {
    if (!s.ok()) return s;
  }
  const int num = static_cast<int>(n);
  IotaKernel<<<Blocks(n), kThreads, 0, stream>>>(positions, n);

  size_t sort_bytes = 0, scan_bytes = 0;
  HYBRIDTF_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, d_ids, sorted, positions, sorted_pos_,
                                      num, 0, static_cast<int>(sizeof(Id) * 8), stream));
  HYBRIDTF_CUDA_RETURN_IF_ERROR(
      cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, heads, segment_, num, stream));
  char* temp = nullptr;
  status = AllocateArray(scratch, static_cast<int64_t>(std::max(sort_bytes, scan_bytes)), &temp);
  if (!status.ok()) return status;
  HYBRIDTF_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortPairs(temp, sort_bytes, d_ids, sorted, positions, sorted_pos_, num,
                                      0, static_cast<int>(sizeof(Id) * 8), stream));
  MarkHeadsKernel<Id><<<Blocks(n), kThreads, 0, stream>>>(sorted, n, heads);
  HYBRIDTF_CUDA_RETURN_IF_ERROR(
      cub::DeviceScan::InclusiveSum(temp, scan_bytes, heads, segment_, num, stream));

  PrepareSummary init{0, std::numeric_limits<int32_t>::max()};
  HYBRIDTF_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d_summary, &init, sizeof(init), cudaMemcpyHostToDevice, stream));
  HYBRIDTF_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(counts, 0, num_partitions_ * sizeof(int32_t), stream));
  const device::CollectArgs<Id> collect{sorted,
                                        sorted_pos_,
                                        heads,
                                        segment_,
                                        n,
                                        num_partitions_,
                                        range,
                                        spec.sorted,
                                        d_bounds,
                                        uniq_,
                                        keys_,
                                        counts,
                                        &d_summary->num_unique,
                                        &d_summary->first_bad_position};
  CollectUniquesKernel<Id><<<Blocks(n), kThreads, 0, stream>>>(collect);
  HYBRIDTF_CUDA_RETURN_IF_ERROR(cudaGetLastError());

  PrepareSummary summary{};
  HYBRIDTF_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&summary, d_summary, sizeof(summary), cudaMemcpyDeviceToHost, stream));
  HYBRIDTF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      sizes_.data(), counts, num_partitions_ * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  HYBRIDTF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));

  if (summary.first_bad_position != std::numeric_limits<int32_t>::max()) {
    Id bad_id{};  // read on the call's stream: the legacy default stream would wait for every
                  // stream
    HYBRIDTF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&bad_id, d_ids + summary.first_bad_position,
                                                  sizeof(Id), cudaMemcpyDeviceToHost, stream));
    HYBRIDTF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return BadRangeIdError(summary.first_bad_position, static_cast<int64_t>(bad_id),
                           static_cast<int64_t>(spec.bounds[num_partitions_]));
  }
  num_unique_ = summary.num_unique;
  return ImplStatus::Ok();
}

template <typename Id>
template <typename Idx>
ImplStatus UniquePartitionGpu<Id>::Finish(Id* d_unique_ids, int32_t* h_partition_sizes,
                                          Idx* d_inverse, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  for (int32_t p = 0; p < num_partitions_; ++p) h_partition_sizes[p] = sizes_[p];
  if (n_ == 0) return ImplStatus::Ok();
  const int64_t u = num_unique_;
  int32_t* order_in = nullptr;
  int32_t* order = nullptr;
  uint64_t* keys_sorted = nullptr;
  int32_t* slot = nullptr;
  for (ImplStatus s :
       {AllocateArray(scratch_, u, &order_in), AllocateArray(scratch_, u, &order),
        AllocateArray(scratch_, u, &keys_sorted), AllocateArray(scratch_, u, &slot)}) {
    if (!s.ok()) return s;
  }
  IotaKernel<<<Blocks(u), kThreads, 0, stream>>>(order_in, u);
  // Keys are owner << 32 | first position: sort the low 32 bits and as many
  // owner bits as num_partitions - 1 needs.
  const int end_bit = device::KeyEndBit(num_partitions_);
  size_t sort_bytes = 0;
  HYBRIDTF_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys_, keys_sorted, order_in, order,
                                      static_cast<int>(u), 0, end_bit, stream));
  char* temp = nullptr;
  ImplStatus status = AllocateArray(scratch_, static_cast<int64_t>(sort_bytes), &temp);
  if (!status.ok()) return status;
  HYBRIDTF_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys_, keys_sorted, order_in, order,
                                      static_cast<int>(u), 0, end_bit, stream));
  ScatterUniquesKernel<Id><<<Blocks(u), kThreads, 0, stream>>>(order, uniq_, u, d_unique_ids, slot);
  InverseKernel<Idx>
      <<<Blocks(n_), kThreads, 0, stream>>>(sorted_pos_, segment_, slot, n_, d_inverse);
  HYBRIDTF_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ImplStatus::Ok();
}

#define HYBRIDTF_INSTANTIATE_GPU(Id)                                                           \
  template class UniquePartitionGpu<Id>;                                                       \
  template ImplStatus UniquePartitionGpu<Id>::Finish<int32_t>(Id*, int32_t*, int32_t*, void*); \
  template ImplStatus UniquePartitionGpu<Id>::Finish<int64_t>(Id*, int32_t*, int64_t*, void*);

HYBRIDTF_INSTANTIATE_GPU(int32_t)
HYBRIDTF_INSTANTIATE_GPU(int64_t)
#undef HYBRIDTF_INSTANTIATE_GPU

}  // namespace unique_partition
}  // namespace hybridtf
