// Standalone harness of the HybridHash hot-tier layer: no TensorFlow, only
// nvcc. A CPU store (hybrid_hash_impl.h) is filled and trained; a hot tier is
// built from its export. The hot lookup and the fused updates (SGD, Adagrad,
// LazyAdam) then run (1) as host loops over hybrid_hash_hot.h, always, and
// (2) as CUDA kernels when a GPU is present; both must equal the CPU store
// bit for bit (rows and slots).
//
//   tools/cuda_harness.sh            # build (and run, when a GPU is present)
#include <cuda_runtime.h>

#include <algorithm>
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
  Expect(std::memcmp(gpu_rows.data(), tier.rows.data(), 4 * before.size()) == 0,
         "gpu hot update == host hot update (bitwise)");
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

int main() {
  using hybridtf::hybrid_hash::Kind;
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  if (!gpu) std::printf("no GPU: running the host loops only\n");
  for (Kind kind : {Kind::kSgd, Kind::kAdagrad, Kind::kLazyAdam}) {
    for (int64_t dim : {1, 8, 16, 33}) hybridtf::hybrid_hash::RunCase(kind, dim, gpu);
  }
  std::printf("hybrid_hash hot tier: %d passed, %d failed\n", hybridtf::hybrid_hash::g_passed,
              hybridtf::hybrid_hash::g_failed);
  return hybridtf::hybrid_hash::g_failed == 0 ? 0 : 1;
}
