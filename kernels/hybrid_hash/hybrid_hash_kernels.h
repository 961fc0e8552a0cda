// The HybridHash TF resource: a ResourceBase that owns one TF-free
// hybrid_hash::Store (hybrid_hash_impl.h), held by a resource handle. Every
// HybridTF>HybridHash* kernel looks it up from its first input.
#ifndef HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_KERNELS_H_
#define HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_KERNELS_H_

#include <memory>
#include <string>
#include <utility>

#include "kernels/hybrid_hash/hybrid_hash_impl.h"
#include "tensorflow/core/framework/resource_mgr.h"

namespace hybridtf {
namespace hybrid_hash {

class HybridHashResource : public ::tensorflow::ResourceBase {
 public:
  explicit HybridHashResource(std::unique_ptr<Store> store) : store_(std::move(store)) {}
  std::string DebugString() const override {
    return "HybridHash table '" + store_->config().name + "'";
  }
  ::tensorflow::int64 MemoryUsed() const override {
    const Stats s = store_->GetStats();
    return s.bytes + s.hot_bytes;
  }
  Store* store() const { return store_.get(); }

 private:
  std::unique_ptr<Store> store_;
};

}  // namespace hybrid_hash
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_KERNELS_H_
