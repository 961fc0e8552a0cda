// Standalone GPU test harness of the CUDA Unique&Partition layer: no
// TensorFlow, only nvcc. It runs the CUDA implementation and the CPU
// implementation on the same inputs (empty to 10^6 ids, uniform and Zipf-like,
// int32/int64, 1..4096 partitions, both strategies, bad ids) and requires
// identical outputs and identical error messages. With or without a GPU it
// also runs the GPU algorithm on the host (EmulateGpu: the kernels' per-index
// bodies of unique_partition_device.h in loops, std::stable_sort and
// std::inclusive_scan for CUB's stable radix sort and scan) against the CPU
// layer, on the same cases and on random ones.
//
//   tools/cuda_harness.sh --run      # build and run (host checks only without a GPU)
//   tools/cuda_harness.sh --sanitize # run under compute-sanitizer (needs a GPU)
//   tools/cuda_harness.sh --time     # also time the GPU layer against the CPU layer
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/unique_partition/unique_partition_device.h"
#include "kernels/unique_partition/unique_partition_impl.h"
#include "kernels/unique_partition/unique_partition_impl_cuda.h"

namespace hybridtf {
namespace unique_partition {
namespace {

class CudaMallocScratch : public DeviceScratch {
 public:
  ~CudaMallocScratch() override {
    for (void* p : blocks_) cudaFree(p);
  }
  void* Allocate(size_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    blocks_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> blocks_;
};

int g_passed = 0;
int g_failed = 0;

void Check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

template <typename Id>
std::vector<Id> MakeIds(int64_t n, int64_t vocab, bool zipf, bool negative, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Id> ids(static_cast<size_t>(n));
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (auto& id : ids) {
    int64_t v;
    if (zipf) {  // approximately Zipf(1.1) by inverse transform of a power law
      v = static_cast<int64_t>(std::pow(static_cast<double>(vocab), unit(rng))) - 1;
      v = (v * 2654435761LL) % vocab;
    } else {
      v = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    }
    if (negative && (rng() & 1)) v = -v - 1;
    id = static_cast<Id>(v);
  }
  return ids;
}

// UniquePartitionGpu's Prepare + Finish on the host: the same steps and
// per-index bodies, one index at a time; CUB's radix sorts are stable, and
// order signed ids as signed numbers and the owner/rank keys by their low
// KeyEndBit bits, as std::stable_sort does with these comparisons.
template <typename Id>
ImplStatus EmulateGpu(const std::vector<Id>& ids, const PartitionSpec<Id>& spec,
                      std::vector<Id>* unique, std::vector<int32_t>* sizes,
                      std::vector<int32_t>* inverse) {
  ImplStatus status = ValidateSpec(spec);
  if (!status.ok()) return status;
  const int64_t n = static_cast<int64_t>(ids.size());
  status = ValidateLength(n);
  if (!status.ok()) return status;
  const int32_t parts = spec.num_partitions;
  sizes->assign(static_cast<size_t>(parts), 0);
  unique->clear();
  inverse->assign(static_cast<size_t>(n), 0);
  if (n == 0) return ImplStatus::Ok();
  std::vector<int32_t> sorted_pos(n), heads(n), segment(n);
  std::iota(sorted_pos.begin(), sorted_pos.end(), 0);
  std::stable_sort(sorted_pos.begin(), sorted_pos.end(),
                   [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  std::vector<Id> sorted(n), uniq(n);
  for (int64_t j = 0; j < n; ++j) sorted[j] = ids[sorted_pos[j]];
  for (int64_t j = 0; j < n; ++j) device::MarkHead(sorted.data(), j, heads.data());
  std::inclusive_scan(heads.begin(), heads.end(), segment.begin());
  std::vector<uint64_t> keys(n);
  int32_t num_unique = 0, first_bad = std::numeric_limits<int32_t>::max();
  const device::CollectArgs<Id> args{sorted.data(),
                                     sorted_pos.data(),
                                     heads.data(),
                                     segment.data(),
                                     n,
                                     parts,
                                     spec.strategy == Strategy::kRange,
                                     spec.sorted,
                                     spec.bounds,
                                     uniq.data(),
                                     keys.data(),
                                     sizes->data(),
                                     &num_unique,
                                     &first_bad};
  for (int64_t j = 0; j < n; ++j) device::CollectUnique(args, j);
  if (first_bad != std::numeric_limits<int32_t>::max()) {
    sizes->assign(static_cast<size_t>(parts), 0);
    return BadRangeIdError(first_bad, static_cast<int64_t>(ids[first_bad]),
                           static_cast<int64_t>(spec.bounds[parts]));
  }
  const int end_bit = device::KeyEndBit(parts);
  const uint64_t mask = end_bit >= 64 ? ~uint64_t{0} : (uint64_t{1} << end_bit) - 1;
  std::vector<int32_t> order(num_unique), slot(num_unique);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return (keys[a] & mask) < (keys[b] & mask); });
  unique->resize(num_unique);
  for (int64_t k = 0; k < num_unique; ++k) {
    device::ScatterUnique(order.data(), uniq.data(), k, unique->data(), slot.data());
  }
  for (int64_t j = 0; j < n; ++j) {
    device::Inverse(sorted_pos.data(), segment.data(), slot.data(), j, inverse->data());
  }
  return ImplStatus::Ok();
}

template <typename Id>
void CompareEmulated(const std::vector<Id>& ids, const PartitionSpec<Id>& spec,
                     const std::string& name) {
  std::vector<Id> cpu_unique, emu_unique;
  std::vector<int32_t> cpu_sizes, cpu_inverse, emu_sizes, emu_inverse;
  const int64_t n = static_cast<int64_t>(ids.size());
  const ImplStatus cpu =
      UniquePartitionToVectors(ids.data(), n, spec, &cpu_unique, &cpu_sizes, &cpu_inverse);
  const ImplStatus emu = EmulateGpu(ids, spec, &emu_unique, &emu_sizes, &emu_inverse);
  bool same = cpu.ok() == emu.ok() && cpu.message() == emu.message();
  if (same && cpu.ok()) {
    same = cpu_unique == emu_unique && cpu_sizes == emu_sizes && cpu_inverse == emu_inverse;
  }
  Check(same, name + " (GPU algorithm on the host): cpu '" + cpu.message() + "' emulated '" +
                  emu.message() + "'");
}

// Random shapes of input: lengths 0..3000, 1..4096 partitions, empty range
// partitions, bounds short of the vocabulary, negative and huge ids.
template <typename Id>
void FuzzEmulated(int cases, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int32_t partition_counts[] = {1, 2, 3, 7, 64, 4096};
  for (int c = 0; c < cases; ++c) {
    const int64_t n = static_cast<int64_t>(rng() % 3001);
    const int32_t parts = partition_counts[rng() % 6];
    const bool range = rng() & 1, negative = rng() % 4 == 0;
    const int64_t vocab = 1 + static_cast<int64_t>(rng() % 5000);
    std::vector<Id> ids(static_cast<size_t>(n));
    for (auto& id : ids) {
      int64_t v = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
      if (negative && rng() % 50 == 0) v = -v - 1;
      if (!range && rng() % 100 == 0) v = static_cast<int64_t>(rng());  // any id, wrapped to Id
      id = static_cast<Id>(v);
    }
    PartitionSpec<Id> spec;
    spec.num_partitions = parts;
    spec.sorted = rng() & 1;
    std::vector<Id> bounds;
    if (range) {
      spec.strategy = Strategy::kRange;
      bounds.push_back(0);
      for (int32_t p = 1; p <= parts; ++p) {  // some partitions empty, the last bound maybe short
        bounds.push_back(static_cast<Id>(rng() % 4 == 0 ? bounds.back() : vocab * p / parts));
      }
      if (rng() % 3 == 0) bounds.back() = static_cast<Id>(std::max<int64_t>(vocab - 1, 0));
      std::sort(bounds.begin(), bounds.end());
      spec.bounds = bounds.data();
      spec.num_bounds = static_cast<int64_t>(bounds.size());
    }
    CompareEmulated(ids, spec,
                    "random case " + std::to_string(c) + " id" + std::to_string(sizeof(Id) * 8));
  }
}

template <typename Id>
void RunCase(int64_t n, int32_t partitions, Strategy strategy, bool zipf, bool negative,
             uint64_t seed, bool sorted = false, bool on_gpu = true) {
  const int64_t vocab = 1000003;
  std::vector<Id> ids = MakeIds<Id>(n, vocab, zipf, negative, seed);
  std::vector<Id> bounds;
  PartitionSpec<Id> spec;
  spec.num_partitions = partitions;
  spec.strategy = strategy;
  spec.sorted = sorted;
  if (strategy == Strategy::kRange) {
    for (int32_t p = 0; p <= partitions; ++p)
      bounds.push_back(static_cast<Id>(vocab * p / partitions));
    spec.bounds = bounds.data();
    spec.num_bounds = static_cast<int64_t>(bounds.size());
  }
  const std::string name = "n=" + std::to_string(n) + " P=" + std::to_string(partitions) +
                           (strategy == Strategy::kRange ? " range" : " mod") +
                           (zipf ? " zipf" : " uniform") + (negative ? " negative" : "") + " id" +
                           std::to_string(sizeof(Id) * 8);

  std::vector<Id> cpu_unique;
  std::vector<int32_t> cpu_sizes, cpu_inverse;
  ImplStatus cpu_status =
      UniquePartitionToVectors(ids.data(), n, spec, &cpu_unique, &cpu_sizes, &cpu_inverse);
  if (n <= 65537) CompareEmulated(ids, spec, name);
  if (!on_gpu) return;

  CudaMallocScratch scratch;
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  Id* d_ids = static_cast<Id*>(scratch.Allocate(std::max<int64_t>(n, 1) * sizeof(Id)));
  cudaMemcpy(d_ids, ids.data(), n * sizeof(Id), cudaMemcpyHostToDevice);
  UniquePartitionGpu<Id> gpu;
  ImplStatus gpu_status = gpu.Prepare(d_ids, n, spec, &scratch, stream);
  Check(cpu_status.ok() == gpu_status.ok() && cpu_status.message() == gpu_status.message(),
        name + " status: cpu '" + cpu_status.message() + "' gpu '" + gpu_status.message() + "'");
  if (cpu_status.ok() && gpu_status.ok()) {
    const int64_t u = gpu.num_unique();
    Id* d_unique = static_cast<Id*>(scratch.Allocate(std::max<int64_t>(u, 1) * sizeof(Id)));
    int32_t* d_inverse = static_cast<int32_t*>(scratch.Allocate(std::max<int64_t>(n, 1) * 4));
    std::vector<int32_t> sizes(partitions);
    ImplStatus s = gpu.Finish(d_unique, sizes.data(), d_inverse, stream);
    Check(s.ok(), name + " finish: " + s.message());
    std::vector<Id> unique(u);
    std::vector<int32_t> inverse(n);
    cudaMemcpyAsync(unique.data(), d_unique, u * sizeof(Id), cudaMemcpyDeviceToHost, stream);
    cudaMemcpyAsync(inverse.data(), d_inverse, n * 4, cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    Check(unique == cpu_unique, name + " unique_ids");
    Check(sizes == cpu_sizes, name + " partition_sizes");
    Check(inverse == cpu_inverse, name + " inverse");
  }
  cudaStreamDestroy(stream);
}

// Scratch for timing: one cudaMalloc up front, bump-allocated and reset per
// call (as TF's allocator hands out pooled memory), so cudaMalloc is not timed.
class PoolScratch : public DeviceScratch {
 public:
  explicit PoolScratch(size_t bytes) : size_(bytes) {
    if (cudaMalloc(&base_, bytes) != cudaSuccess) base_ = nullptr;
  }
  ~PoolScratch() override { cudaFree(base_); }
  void Reset() { used_ = 0; }
  void* Allocate(size_t bytes) override {
    const size_t start = (used_ + 255) / 256 * 256;
    if (base_ == nullptr || start > size_ || bytes > size_ - start) return nullptr;
    used_ = start + bytes;
    return static_cast<char*>(base_) + start;
  }

 private:
  void* base_ = nullptr;
  size_t size_;
  size_t used_ = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Wall time of the whole call (Prepare's one host sync included) against the
// CPU layer on one thread; Zipf-like int64 ids over a 10^7 vocabulary.
void TimeCase(int64_t n, int32_t partitions) {
  const std::vector<int64_t> ids = MakeIds<int64_t>(n, 10000019, true, false, 99);
  PartitionSpec<int64_t> spec;
  spec.num_partitions = partitions;
  PoolScratch pool(static_cast<size_t>(n) * 96 + (size_t{64} << 20));
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  int64_t* d_ids = nullptr;
  int64_t* d_unique = nullptr;
  int32_t* d_inverse = nullptr;
  cudaMalloc(&d_ids, n * 8);
  cudaMalloc(&d_unique, n * 8);
  cudaMalloc(&d_inverse, n * 4);
  cudaMemcpy(d_ids, ids.data(), n * 8, cudaMemcpyHostToDevice);
  std::vector<int32_t> sizes(partitions);
  std::vector<double> gpu_ms;
  int64_t unique = 0;
  bool ok = true;
  for (int rep = 0; rep < 23; ++rep) {
    pool.Reset();
    const auto t0 = std::chrono::steady_clock::now();
    UniquePartitionGpu<int64_t> gpu;
    ok &= gpu.Prepare(d_ids, n, spec, &pool, stream).ok();
    ok &= gpu.Finish(d_unique, sizes.data(), d_inverse, stream).ok();
    cudaStreamSynchronize(stream);
    const auto t1 = std::chrono::steady_clock::now();
    unique = gpu.num_unique();
    if (rep >= 3) gpu_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::vector<double> cpu_ms;
  std::vector<int64_t> cpu_unique;
  std::vector<int32_t> cpu_sizes, cpu_inverse;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    ok &= UniquePartitionToVectors(ids.data(), n, spec, &cpu_unique, &cpu_sizes, &cpu_inverse).ok();
    const auto t1 = std::chrono::steady_clock::now();
    cpu_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  ok &= cudaGetLastError() == cudaSuccess && unique == static_cast<int64_t>(cpu_unique.size()) &&
        sizes == cpu_sizes;
  Check(ok, "timed case n=" + std::to_string(n));
  const double g = Median(gpu_ms), c = Median(cpu_ms);
  std::printf(
      "TIME unique_partition n=%lld P=%d unique=%lld gpu_ms=%.3f cpu_1thread_ms=%.3f "
      "gpu_mids_per_s=%.1f speedup=%.1f\n",
      static_cast<long long>(n), partitions, static_cast<long long>(unique), g, c, n / g / 1e3,
      c / g);
  cudaFree(d_ids);
  cudaFree(d_unique);
  cudaFree(d_inverse);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace unique_partition
}  // namespace hybridtf

int main(int argc, char** argv) {
  using hybridtf::unique_partition::RunCase;
  using hybridtf::unique_partition::Strategy;
  int device_count = 0;
  const bool gpu = cudaGetDeviceCount(&device_count) == cudaSuccess && device_count > 0;
  if (!gpu) std::printf("no CUDA device: the GPU algorithm runs on the host only\n");
  // HYBRIDTF_HARNESS_MAX_IDS caps the batch sizes (compute-sanitizer runs are slow).
  const char* cap_env = std::getenv("HYBRIDTF_HARNESS_MAX_IDS");
  const long long cap = cap_env != nullptr ? std::atoll(cap_env) : 0;
  uint64_t seed = 1;
  for (int64_t n : {0LL, 1LL, 17LL, 1000LL, 65537LL, 1000000LL}) {
    if (cap > 0 && n > cap) continue;
    for (int32_t p : {1, 2, 8, 64, 4096}) {
      for (Strategy s : {Strategy::kModulo, Strategy::kRange}) {
        for (bool zipf : {false, true}) {
          RunCase<int64_t>(n, p, s, zipf, false, seed++, false, gpu);
          RunCase<int32_t>(n, p, s, zipf, false, seed++, false, gpu);
          RunCase<int64_t>(n, p, s, zipf, false, seed++, /*sorted=*/true, gpu);
        }
      }
      RunCase<int64_t>(n, p, Strategy::kModulo, false, true, seed++, false, gpu);  // negative, mod
      RunCase<int64_t>(n, p, Strategy::kRange, false, true, seed++, false, gpu);   // error
    }
  }
  hybridtf::unique_partition::FuzzEmulated<int32_t>(1500, 11);
  hybridtf::unique_partition::FuzzEmulated<int64_t>(1500, 12);
  if (gpu && argc > 1 && std::strcmp(argv[1], "--time") == 0) {
    for (int64_t n : {65536LL, 819200LL, 4194304LL, 16777216LL}) {
      for (int32_t p : {1, 8}) hybridtf::unique_partition::TimeCase(n, p);
    }
  }
  std::printf("%d passed, %d failed\n", hybridtf::unique_partition::g_passed,
              hybridtf::unique_partition::g_failed);
  return hybridtf::unique_partition::g_failed == 0 ? 0 : 1;
}
