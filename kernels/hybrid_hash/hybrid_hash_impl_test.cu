// Standalone harness of the HybridHash hot-tier layer: no TensorFlow, only
// nvcc. A CPU store (hybrid_hash_impl.h) is filled and trained; a hot tier is
// built from its export. The hot lookup and the fused updates (SGD, Adagrad,
// LazyAdam) then run (1) as host loops over hybrid_hash_hot.h, always, and
// (2) as CUDA kernels when a GPU is present; both must equal the CPU store
// bit for bit (rows and slots).
//
//   tools/cuda_harness.sh            # build (and run, when a GPU is present)
//   tools/cuda_harness.sh --time     # also time the kernels against the host loops
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/hybrid_hash/hybrid_hash_impl.h"
#include "kernels/hybrid_hash/hybrid_hash_impl_cuda.h"

namespace hybridtf {
namespace hybrid_hash {
namespace {

int g_passed = 0;
int g_failed = 0;

void Expect(bool ok, const char* what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAILED: %s\n", what);
  }
}

enum class Kind { kSgd, kAdagrad, kLazyAdam };

struct HostTier {
  std::vector<int64_t> ids;  // ascending
  std::vector<int32_t> entries;
  std::vector<float> rows;
  int64_t row_floats = 0;
};

// Runs one case; gpu: also run the CUDA kernels.
void RunCase(Kind kind, int64_t dim, bool gpu) {
  const int num_slots = kind == Kind::kSgd ? 0 : (kind == Kind::kAdagrad ? 1 : 2);
  Config config;
  config.name = "harness";
  config.dim = dim;
  config.hot_rows = 32;
  config.seed = 11;
  std::unique_ptr<Store> store;
  Expect(Store::Create(config, &store).ok(), "create");
  std::vector<int64_t> all(200);
  std::mt19937_64 rng(5);
  for (auto& id : all) id = static_cast<int64_t>(rng());
  std::vector<float> scratch(all.size() * dim);
  store->Lookup(all.data(), nullptr, static_cast<int64_t>(all.size()), true, scratch.data(),
                SequentialFor);
  const float init[2] = {0.1f, 0.f};
  if (num_slots > 0) store->EnsureSlots(num_slots, init);

  // The hot tier: every 3rd id, from the store's export (rows + slots).
  Snapshot snap;
  store->Export(&snap);
  HostTier tier;
  tier.row_floats = (1 + num_slots) * dim;
  for (size_t i = 0; i < snap.ids.size(); i += 3) {
    tier.ids.push_back(snap.ids[i]);
    tier.entries.push_back(static_cast<int32_t>(tier.entries.size()));
    tier.rows.insert(tier.rows.end(), snap.rows.begin() + i * dim,
                     snap.rows.begin() + (i + 1) * dim);
    tier.rows.insert(tier.rows.end(), snap.slots.begin() + i * num_slots * dim,
                     snap.slots.begin() + (i + 1) * num_slots * dim);
  }
  // Queries: distinct ids, some hot, some not, some absent from the tier.
  std::vector<int64_t> query(all.begin(), all.begin() + 120);
  const int64_t n = static_cast<int64_t>(query.size());
  std::vector<float> grad(n * dim);
  std::normal_distribution<float> normal;
  for (auto& g : grad) g = normal(rng);

  // Host loops over the shared bodies.
  hot::HotIndex index{tier.ids.data(), tier.entries.data(), static_cast<int64_t>(tier.ids.size())};
  std::vector<float> out(n * dim, 0.f);
  std::vector<int32_t> entry(n);
  hot::LookupRange(index, tier.rows.data(), tier.row_floats, dim, query.data(), out.data(),
                   entry.data(), 0, n);
  std::vector<float> expected(n * dim);
  store->Lookup(query.data(), nullptr, n, false, expected.data(), SequentialFor);
  bool lookup_ok = true;
  for (int64_t i = 0; i < n; ++i) {
    if (entry[i] >= 0) {
      lookup_ok &= std::memcmp(&out[i * dim], &expected[i * dim], 4 * dim) == 0;
    }
  }
  Expect(lookup_ok, "host hot lookup == CPU store rows");

  std::vector<float> before = tier.rows;
  const float lr = 0.05f, eps = 1e-7f, alpha = 0.01f, c1 = 0.1f, c2 = 0.001f;
  switch (kind) {
    case Kind::kSgd:
      hot::SgdRange(entry.data(), tier.rows.data(), tier.row_floats, dim, grad.data(), lr, 0, n);
      store->ApplySgd(query.data(), grad.data(), n, lr, SequentialFor);
      break;
    case Kind::kAdagrad:
      hot::AdagradRange(entry.data(), tier.rows.data(), tier.row_floats, dim, grad.data(), lr, eps,
                        0, n);
      store->ApplyAdagrad(query.data(), grad.data(), n, lr, eps, SequentialFor);
      break;
    case Kind::kLazyAdam:
      hot::LazyAdamRange(entry.data(), tier.rows.data(), tier.row_floats, dim, grad.data(), alpha,
                         c1, c2, eps, 0, n);
      store->ApplyAdam(query.data(), grad.data(), n, alpha, c1, c2, eps, true, SequentialFor);
      break;
  }
  Snapshot after;
  store->Export(&after);
  bool update_ok = true;
  for (size_t j = 0; j < tier.ids.size(); ++j) {
    const size_t i =
        std::lower_bound(after.ids.begin(), after.ids.end(), tier.ids[j]) - after.ids.begin();
    const float* row = &tier.rows[j * tier.row_floats];
    update_ok &= std::memcmp(row, &after.rows[i * dim], 4 * dim) == 0;
    update_ok &=
        std::memcmp(row + dim, &after.slots[i * num_slots * dim], 4 * num_slots * dim) == 0;
  }
  Expect(update_ok, "host hot update == CPU store rows and slots");
  if (!gpu) return;

  // The same on the device, from the tier as it was before the host update.
  int64_t *d_ids, *d_query;
  int32_t *d_entries, *d_entry;
  float *d_rows, *d_out, *d_grad;
  cudaMalloc(&d_ids, 8 * tier.ids.size());
  cudaMalloc(&d_entries, 4 * tier.entries.size());
  cudaMalloc(&d_rows, 4 * before.size());
  cudaMalloc(&d_query, 8 * n);
  cudaMalloc(&d_entry, 4 * n);
  cudaMalloc(&d_out, 4 * n * dim);
  cudaMalloc(&d_grad, 4 * n * dim);
  cudaMemcpy(d_ids, tier.ids.data(), 8 * tier.ids.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_entries, tier.entries.data(), 4 * tier.entries.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_rows, before.data(), 4 * before.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_query, query.data(), 8 * n, cudaMemcpyHostToDevice);
  cudaMemcpy(d_grad, grad.data(), 4 * n * dim, cudaMemcpyHostToDevice);
  cudaMemset(d_out, 0xff, 4 * n * dim);  // poisoned: rows not hot stay so, hot rows are compared
  HotTierGpu gpu_tier{
      {d_ids, d_entries, static_cast<int64_t>(tier.ids.size())}, d_rows, tier.row_floats, dim};
  Expect(HotLookupGpu(gpu_tier, d_query, n, d_out, d_entry, nullptr).ok(), "gpu lookup launch");
  ImplStatus status;
  switch (kind) {
    case Kind::kSgd:
      status = HotSgdGpu(gpu_tier, d_entry, d_grad, n, lr, nullptr);
      break;
    case Kind::kAdagrad:
      status = HotAdagradGpu(gpu_tier, d_entry, d_grad, n, lr, eps, nullptr);
      break;
    case Kind::kLazyAdam:
      status = HotLazyAdamGpu(gpu_tier, d_entry, d_grad, n, alpha, c1, c2, eps, nullptr);
      break;
  }
  Expect(status.ok(), "gpu update launch");
  std::vector<float> gpu_rows(before.size());
  std::vector<int32_t> gpu_entry(n);
  cudaMemcpy(gpu_rows.data(), d_rows, 4 * before.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(gpu_entry.data(), d_entry, 4 * n, cudaMemcpyDeviceToHost);
  Expect(gpu_entry == entry, "gpu entries == host entries");
  std::vector<float> gpu_out(n * dim);
  cudaMemcpy(gpu_out.data(), d_out, 4 * n * dim, cudaMemcpyDeviceToHost);
  bool gpu_lookup_ok = true;
  for (int64_t i = 0; i < n; ++i) {
    if (entry[i] >= 0) gpu_lookup_ok &= std::memcmp(&gpu_out[i * dim], &out[i * dim], 4 * dim) == 0;
  }
  Expect(gpu_lookup_ok, "gpu hot lookup rows == host hot lookup rows");
  Expect(std::memcmp(gpu_rows.data(), tier.rows.data(), 4 * before.size()) == 0,
         "gpu hot update == host hot update (bitwise)");
  for (void* p :
       {static_cast<void*>(d_ids), static_cast<void*>(d_entries), static_cast<void*>(d_rows),
        static_cast<void*>(d_query), static_cast<void*>(d_entry), static_cast<void*>(d_out),
        static_cast<void*>(d_grad)}) {
    cudaFree(p);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A hot tier of `hot` rows (dim 16 + an Adagrad slot) and `n` distinct
// queries, 80% of them hot: median kernel time (CUDA events) against the same
// bodies as one host loop on one thread. Results must agree bitwise.
void TimeHotTier(int64_t hot, int64_t n) {
  const int64_t dim = 16, row_floats = 2 * dim;
  std::mt19937_64 rng(3);
  std::vector<int64_t> ids(hot);
  for (auto& id : ids) id = static_cast<int64_t>(rng());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  hot = static_cast<int64_t>(ids.size());
  std::vector<int32_t> entries(hot);
  std::iota(entries.begin(), entries.end(), 0);
  std::shuffle(entries.begin(), entries.end(), rng);
  std::vector<float> rows(hot * row_floats);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  for (auto& r : rows) r = unit(rng);
  std::vector<int64_t> query(n);
  std::vector<int64_t> pick(ids);
  std::shuffle(pick.begin(), pick.end(), rng);
  for (int64_t i = 0; i < n; ++i) {
    query[i] = i % 5 == 4 ? static_cast<int64_t>(rng() | 1) : pick[i % hot];  // misses: odd
  }
  std::vector<float> grad(n * dim);
  for (auto& g : grad) g = unit(rng) - 0.5f;

  int64_t *d_ids, *d_query;
  int32_t *d_entries, *d_entry;
  float *d_rows, *d_out, *d_grad;
  cudaMalloc(&d_ids, 8 * hot);
  cudaMalloc(&d_entries, 4 * hot);
  cudaMalloc(&d_rows, 4 * rows.size());
  cudaMalloc(&d_query, 8 * n);
  cudaMalloc(&d_entry, 4 * n);
  cudaMalloc(&d_out, 4 * n * dim);
  cudaMalloc(&d_grad, 4 * n * dim);
  cudaMemcpy(d_ids, ids.data(), 8 * hot, cudaMemcpyHostToDevice);
  cudaMemcpy(d_entries, entries.data(), 4 * hot, cudaMemcpyHostToDevice);
  cudaMemcpy(d_rows, rows.data(), 4 * rows.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_query, query.data(), 8 * n, cudaMemcpyHostToDevice);
  cudaMemcpy(d_grad, grad.data(), 4 * n * dim, cudaMemcpyHostToDevice);
  HotTierGpu tier{{d_ids, d_entries, hot}, d_rows, row_floats, dim};
  cudaEvent_t e0, e1, e2;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventCreate(&e2);
  std::vector<double> lookup_ms, update_ms;
  bool ok = true;
  for (int rep = 0; rep < 23; ++rep) {
    cudaEventRecord(e0);
    ok &= HotLookupGpu(tier, d_query, n, d_out, d_entry, nullptr).ok();
    cudaEventRecord(e1);
    ok &= HotAdagradGpu(tier, d_entry, d_grad, n, 0.01f, 1e-7f, nullptr).ok();
    cudaEventRecord(e2);
    cudaEventSynchronize(e2);
    float a = 0.f, b = 0.f;
    cudaEventElapsedTime(&a, e0, e1);
    cudaEventElapsedTime(&b, e1, e2);
    if (rep >= 3) {
      lookup_ms.push_back(a);
      update_ms.push_back(b);
    }
  }
  // The host loops, once, from the state the device had after its 23 updates.
  std::vector<float> host_rows = rows;
  std::vector<float> host_out(n * dim);
  std::vector<int32_t> host_entry(n);
  hot::HotIndex index{ids.data(), entries.data(), hot};
  double host_lookup = 0, host_update = 0;
  for (int rep = 0; rep < 23; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    hot::LookupRange(index, host_rows.data(), row_floats, dim, query.data(), host_out.data(),
                     host_entry.data(), 0, n);
    const auto t1 = std::chrono::steady_clock::now();
    hot::AdagradRange(host_entry.data(), host_rows.data(), row_floats, dim, grad.data(), 0.01f,
                      1e-7f, 0, n);
    const auto t2 = std::chrono::steady_clock::now();
    if (rep == 22) {
      host_lookup = std::chrono::duration<double, std::milli>(t1 - t0).count();
      host_update = std::chrono::duration<double, std::milli>(t2 - t1).count();
    }
  }
  std::vector<float> gpu_rows(rows.size());
  cudaMemcpy(gpu_rows.data(), d_rows, 4 * rows.size(), cudaMemcpyDeviceToHost);
  ok &= cudaGetLastError() == cudaSuccess &&
        std::memcmp(gpu_rows.data(), host_rows.data(), 4 * rows.size()) == 0;
  Expect(ok, "timed hot tier: device rows == host rows after 23 steps (bitwise)");
  const double l = Median(lookup_ms), u = Median(update_ms);
  std::printf(
      "TIME hot_tier hot=%lld n=%lld dim=16 adagrad lookup_ms=%.3f update_ms=%.3f "
      "host_1thread_lookup_ms=%.3f host_1thread_update_ms=%.3f mlookups_per_s=%.1f\n",
      static_cast<long long>(hot), static_cast<long long>(n), l, u, host_lookup, host_update,
      n / l / 1e3);
  for (void* p :
       {static_cast<void*>(d_ids), static_cast<void*>(d_entries), static_cast<void*>(d_rows),
        static_cast<void*>(d_query), static_cast<void*>(d_entry), static_cast<void*>(d_out),
        static_cast<void*>(d_grad)}) {
    cudaFree(p);
  }
}

}  // namespace
}  // namespace hybrid_hash
}  // namespace hybridtf

int main(int argc, char** argv) {
  using hybridtf::hybrid_hash::Kind;
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  if (!gpu) std::printf("no GPU: running the host loops only\n");
  for (Kind kind : {Kind::kSgd, Kind::kAdagrad, Kind::kLazyAdam}) {
    for (int64_t dim : {1, 8, 16, 33}) hybridtf::hybrid_hash::RunCase(kind, dim, gpu);
  }
  {  // sizes past one launch's grid are refused before any launch (no GPU needed)
    using hybridtf::hybrid_hash::Expect;
    const hybridtf::hybrid_hash::HotTierGpu big{{nullptr, nullptr, 0}, nullptr, 32, 16};
    Expect(!hybridtf::hybrid_hash::HotAdagradGpu(big, nullptr, nullptr, int64_t{1} << 40, 0.1f,
                                                 1e-7f, nullptr)
                .ok(),
           "an update of 2^40 ids x 16 columns is refused");
    Expect(!hybridtf::hybrid_hash::HotLookupGpu(big, nullptr, int64_t{1} << 45, nullptr, nullptr,
                                                nullptr)
                .ok(),
           "a lookup of 2^45 ids is refused");
    Expect(!hybridtf::hybrid_hash::HotSgdGpu(big, nullptr, nullptr, -1, 0.1f, nullptr).ok(),
           "a negative id count is refused");
    // entries of one row and one slot (32 floats of dim 16): LazyAdam needs two slots
    Expect(!hybridtf::hybrid_hash::HotLazyAdamGpu(big, nullptr, nullptr, 4, 0.1f, 0.9f, 0.999f,
                                                  1e-7f, nullptr)
                .ok(),
           "LazyAdam on entries without room for both moments is refused");
    const hybridtf::hybrid_hash::HotTierGpu bare{{nullptr, nullptr, 0}, nullptr, 16, 16};
    Expect(
        !hybridtf::hybrid_hash::HotAdagradGpu(bare, nullptr, nullptr, 4, 0.1f, 1e-7f, nullptr).ok(),
        "Adagrad on entries without an accumulator is refused");
  }
  if (gpu && argc > 1 && std::strcmp(argv[1], "--time") == 0) {
    for (int64_t hot : {int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 23}) {
      hybridtf::hybrid_hash::TimeHotTier(hot, std::min(hot, int64_t{1} << 20));  // distinct
    }
  }
  std::printf("hybrid_hash hot tier: %d passed, %d failed\n", hybridtf::hybrid_hash::g_passed,
              hybridtf::hybrid_hash::g_failed);
  return hybridtf::hybrid_hash::g_failed == 0 ? 0 : 1;
}
