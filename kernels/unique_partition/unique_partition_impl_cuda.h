// TF-free CUDA implementation layer of the fused Unique&Partition algorithm.
//
// Same contract and the same output order as the CPU layer
// (unique_partition_impl.h), so the two can be compared element by element.
// This header needs no CUDA or TensorFlow headers: streams are passed as
// `void*` (a cudaStream_t) and scratch memory comes from a caller-supplied
// DeviceScratch (TF temp tensors in the OpKernel, cudaMalloc in the standalone
// harness unique_partition_impl_test.cu).
//
// Algorithm (sort based, deterministic):
//   1. stable radix sort of (id, position) pairs by id;
//   2. segment heads -> inclusive scan gives each position its unique index u;
//      the head of a segment holds the id's first position (stable sort);
//   3. per unique: owner partition (validated), key = owner << 32 | first_pos
//      (owner << 32 | rank in id order with spec.sorted),
//      per-partition counts (atomics; counts are order independent);
//   4. one device->host copy + stream sync: number of uniques, counts, first
//      bad position (if any);
//   5. radix sort of uniques by key -> grouped by owner, first-occurrence
//      order inside an owner; scatter to the output and an inverse map.
#ifndef HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_IMPL_CUDA_H_
#define HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_IMPL_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/common/status.h"
#include "kernels/unique_partition/unique_partition_impl.h"

namespace hybridtf {
namespace unique_partition {

// Device memory for one call. Allocate returns at least `bytes` bytes of
// device memory that stays valid until the work queued on the stream by this
// call has finished, or nullptr on failure.
class DeviceScratch {
 public:
  virtual ~DeviceScratch() = default;
  virtual void* Allocate(size_t bytes) = 0;
};

template <typename Id>
class UniquePartitionGpu {
 public:
  // d_ids: device pointer to n ids. spec.bounds: host pointer (copied to the
  // device). stream: a cudaStream_t. Synchronizes the stream once.
  ImplStatus Prepare(const Id* d_ids, int64_t n, const PartitionSpec<Id>& spec,
                     DeviceScratch* scratch, void* stream);
  int64_t num_unique() const { return num_unique_; }
  // d_unique_ids[num_unique()] and d_inverse[n] are device pointers;
  // h_partition_sizes[num_partitions] is host memory (alltoall splits are
  // consumed on the host). Queues work on `stream` without synchronizing.
  template <typename Idx>
  ImplStatus Finish(Id* d_unique_ids, int32_t* h_partition_sizes, Idx* d_inverse, void* stream);

 private:
  int64_t n_ = 0;
  int32_t num_partitions_ = 1;
  int64_t num_unique_ = 0;
  DeviceScratch* scratch_ = nullptr;
  std::vector<int32_t> sizes_;
  // Device scratch from Prepare used by Finish.
  int32_t* sorted_pos_ = nullptr;  // [n] input position of each sorted id
  int32_t* segment_ = nullptr;     // [n] inclusive scan of heads (u + 1)
  Id* uniq_ = nullptr;             // [n] unique ids in id order
  uint64_t* keys_ = nullptr;       // [n] owner << 32 | first position
};

}  // namespace unique_partition
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_IMPL_CUDA_H_
