// Standalone GPU test harness of the CUDA Unique&Partition layer: no
// TensorFlow, only nvcc. It runs the CUDA implementation and the CPU
// implementation on the same inputs (empty to 10^6 ids, uniform and Zipf-like,
// int32/int64, 1..4096 partitions, both strategies, bad ids) and requires
// identical outputs and identical error messages.
//
//   tools/cuda_harness.sh            # build (and run, when a GPU is present)
//   tools/cuda_harness.sh --sanitize # run under compute-sanitizer (needs a GPU)
//   tools/cuda_harness.sh --time     # also time the GPU layer against the CPU layer
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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

template <typename Id>
void RunCase(int64_t n, int32_t partitions, Strategy strategy, bool zipf, bool negative,
             uint64_t seed, bool sorted = false) {
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
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::printf("no CUDA device: nothing run\n");
    return 2;
  }
  // HYBRIDTF_HARNESS_MAX_IDS caps the batch sizes (compute-sanitizer runs are slow).
  const char* cap_env = std::getenv("HYBRIDTF_HARNESS_MAX_IDS");
  const long long cap = cap_env != nullptr ? std::atoll(cap_env) : 0;
  uint64_t seed = 1;
  for (int64_t n : {0LL, 1LL, 17LL, 1000LL, 65537LL, 1000000LL}) {
    if (cap > 0 && n > cap) continue;
    for (int32_t p : {1, 2, 8, 64, 4096}) {
      for (Strategy s : {Strategy::kModulo, Strategy::kRange}) {
        for (bool zipf : {false, true}) {
          RunCase<int64_t>(n, p, s, zipf, false, seed++);
          RunCase<int32_t>(n, p, s, zipf, false, seed++);
          RunCase<int64_t>(n, p, s, zipf, false, seed++, /*sorted=*/true);
        }
      }
      RunCase<int64_t>(n, p, Strategy::kModulo, false, true, seed++);  // negative ids, mod
      RunCase<int64_t>(n, p, Strategy::kRange, false, true, seed++);   // negative ids: error
    }
  }
  if (argc > 1 && std::strcmp(argv[1], "--time") == 0) {
    for (int64_t n : {65536LL, 819200LL, 4194304LL, 16777216LL}) {
      for (int32_t p : {1, 8}) hybridtf::unique_partition::TimeCase(n, p);
    }
  }
  std::printf("%d passed, %d failed\n", hybridtf::unique_partition::g_passed,
              hybridtf::unique_partition::g_failed);
  return hybridtf::unique_partition::g_failed == 0 ? 0 : 1;
}
