// HybridHash fused optimizer updates. Each row update repeats, operation by
// operation, the formulas of kernels/sparse_apply/sparse_apply_impl.cc (Keras
// 2.15 exact); they are restated here because a HybridHash row is reached
// through its record (hot or cold tier), not through a row index of one
// array. Rows move with their slots, so the tier a row is in never matters.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/common/adam_math.h"
#include "kernels/hybrid_hash/hybrid_hash_impl.h"

namespace hybridtf {
namespace hybrid_hash {

namespace {
ImplStatus CheckSlots(const Config& config, int held, int needed, const char* what) {
  if (held == needed) return ImplStatus::Ok();
  return ImplStatus::InvalidArgument(std::string(what) + " of HybridHash table '" + config.name +
                                     "' needs " + std::to_string(needed) +
                                     " optimizer slot(s) per row, the table holds " +
                                     std::to_string(held) + ". Call EnsureSlots first.");
}
}  // namespace

// The updates' probe with the lookup's record hints (see ApplySgd in the header).
void Store::FindBlockHinted(const int64_t* ids, const int64_t* members, const int64_t* hints,
                            int64_t begin, int64_t end, uint32_t* out) const {
  const int64_t n = end - begin;
  const uint64_t limit = next_record_;  // records [0, limit) exist (fixed under the shared lock)
  const uint64_t hot_entries = hot_owner_.size();
  const int64_t row_bytes = 4 * RowFloats();
  uint32_t rec[kBlock];
  for (int64_t k = 0; k < n; ++k) {
    // Any int64 is safe here: the record part is range-checked, the hot part
    // only prefetches a line of the hot tier.
    const uint64_t h = static_cast<uint64_t>(hints[begin + k]);
    rec[k] = static_cast<uint32_t>(h);
    if (rec[k] < limit) __builtin_prefetch(Record(rec[k]));
    const uint64_t hot1 = h >> 32;
    if (hot1 != 0 && hot1 <= hot_entries) {  // the hot row with the header, not after it
      const char* row = reinterpret_cast<const char*>(hot_.data() + (hot1 - 1) * RowFloats());
      __builtin_prefetch(row, 1);
      __builtin_prefetch(row + row_bytes - 1, 1);
    }
  }
  bool probe = false;
  for (int64_t k = 0; k < n; ++k) {
    out[k] = kEmpty;
    if (rec[k] < limit) {
      const Header* r = Record(rec[k]);
      if (__atomic_load_n(&r->mark, __ATOMIC_RELAXED) != kDead && r->id == ids[begin + k] &&
          MemberOf(r) == M(members, begin + k)) {
        out[k] = rec[k];
      }
    }
    probe = probe || out[k] == kEmpty;
  }
  if (!probe) return;
  for (int64_t k = 0; k < n; ++k) {
    if (out[k] == kEmpty) out[k] = Find(M(members, begin + k), ids[begin + k]);
  }
}

bool Store::HintsProven(const int64_t* ids, const int64_t* members, const int64_t* hints,
                        int64_t n) const {
  std::unique_lock<std::mutex> guard(hinted_mu_, std::try_to_lock);
  if (!guard.owns_lock()) return false;
  const HintedBatch& h = hinted_;
  const size_t bytes = sizeof(int64_t) * static_cast<size_t>(n);
  return h.valid && h.epoch == layout_epoch_ && static_cast<int64_t>(h.ids.size()) == n &&
         h.packed == (members != nullptr) && std::memcmp(h.ids.data(), ids, bytes) == 0 &&
         std::memcmp(h.hints.data(), hints, bytes) == 0 &&
         (members == nullptr || std::memcmp(h.members.data(), members, bytes) == 0);
}

template <typename RowFn>
ImplStatus Store::ApplyRows(const int64_t* ids, const int64_t* members, const int64_t* hints,
                            int64_t n, const char* what, const ParallelFor& pf, RowFn&& fn) {
  ImplStatus valid = CheckMembers(members, n);
  if (!valid.ok()) return valid;
  std::shared_lock<std::shared_mutex> lock(mu_);
  const uint32_t serial =
      (__atomic_add_fetch(&update_serial_, 1, __ATOMIC_RELAXED) % 0xFFFFFFF0u) + 1;
  std::vector<uint32_t> records(static_cast<size_t>(n));
  std::vector<float*> rows(static_cast<size_t>(n));  // fixed under the shared lock
  std::atomic<int64_t> bad{n};                       // first bad position
  const int64_t row_bytes = 4 * RowFloats();
  // Fast path: the hints are exactly those of the last training lookup and no
  // row moved since, so each names its key's present record and where its row
  // is (HintsProven): no header is read. Only distinctness is left to check, on
  // the record indices (distinct keys have distinct records): a bitmap. A
  // repeated id falls through to the checked pass, which reports it.
  bool proven = hints != nullptr && n > 0 && HintsProven(ids, members, hints, n);
  if (proven) {
    std::vector<uint64_t> seen((static_cast<size_t>(next_record_) + 63) / 64, 0);
    const float* hot = hot_.data();
    for (int64_t i = 0; i < n && proven; ++i) {
      const uint64_t hint = static_cast<uint64_t>(hints[i]);
      const uint32_t r = static_cast<uint32_t>(hint);
      const uint64_t bit = uint64_t{1} << (r & 63);
      proven = (seen[r >> 6] & bit) == 0;
      seen[r >> 6] |= bit;
      records[i] = r;
      const uint64_t hot1 = hint >> 32;
      rows[i] =
          hot1 != 0 ? const_cast<float*>(hot) + (hot1 - 1) * RowFloats() : ColdFloats(Record(r));
    }
  }
  if (!proven)
    pf(n, 16, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t e = std::min(end, b + kBlock);
        if (hints) {
          FindBlockHinted(ids, members, hints, b, e, records.data() + b);
        } else {
          FindBlock(ids, members, b, e, records.data() + b);
        }
        for (int64_t i = b; i < e; ++i) {
          const uint32_t r = records[i];
          bool ok = r != kEmpty;
          if (ok) {
            Header* h = Record(r);
            rows[i] = Floats(h);
            // Fetched now, while this pass waits on the next headers: the update
            // pass then finds most rows in cache.
            __builtin_prefetch(rows[i], 1);
            __builtin_prefetch(reinterpret_cast<const char*>(rows[i]) + row_bytes - 1, 1);
            ok = __atomic_exchange_n(&h->mark, serial, __ATOMIC_RELAXED) != serial;
          }
          if (!ok) {
            int64_t cur = bad.load();
            while (i < cur && !bad.compare_exchange_weak(cur, i)) {
            }
          }
        }
      }
    });
  const int64_t b = bad.load();
  if (b < n) {
    const bool absent = records[b] == kEmpty;
    // A duplicate: its first occurrence is before b, so b's record holds our serial.
    return ImplStatus::InvalidArgument(
        std::string(what) + " of HybridHash table '" + config_.name + "': ids[" +
        std::to_string(b) + "] = " + std::to_string(ids[b]) +
        (members ? " (member " + std::to_string(members[b]) + ")" : std::string()) +
        (absent ? " is not in the table. Update only ids looked up (with training=True) in "
                  "this step."
                : " is repeated; fused updates need distinct ids (sum the gradient rows of "
                  "repeated ids first, e.g. with tf.math.unsorted_segment_sum)."));
  }
  pf(n, 8 * config_.dim, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kBlock < end) {  // the row kBlock ahead: its miss overlaps this block's updates
        const char* ahead = reinterpret_cast<const char*>(rows[i + kBlock]);
        __builtin_prefetch(ahead, 1);
        __builtin_prefetch(ahead + row_bytes - 1, 1);
      }
      const uint32_t even = LockStripe(records[i]);
      fn(rows[i], i);
      UnlockStripe(records[i], even);
    }
  });
  return ImplStatus::Ok();
}

ImplStatus Store::ApplySgd(const int64_t* ids, const float* grad, int64_t n, float lr,
                           const ParallelFor& pf, const int64_t* members, const int64_t* records) {
  const int64_t dim = config_.dim;
  return ApplyRows(ids, members, records, n, "SGD update", pf, [&](float* w, int64_t i) {
    const float* g = grad + i * dim;
    for (int64_t c = 0; c < dim; ++c) w[c] = w[c] + (-g[c]) * lr;
  });
}

ImplStatus Store::ApplyAdagrad(const int64_t* ids, const float* grad, int64_t n, float lr,
                               float eps, const ParallelFor& pf, const int64_t* members,
                               const int64_t* records) {
  const int64_t dim = config_.dim;
  const float neg_lr = -lr;
  ImplStatus slots = CheckSlots(config_, num_slots_, 1, "Adagrad update");
  if (!slots.ok()) return slots;
  return ApplyRows(ids, members, records, n, "Adagrad update", pf, [&](float* w, int64_t i) {
    const float* g = grad + i * dim;
    float* a = w + dim;
    for (int64_t c = 0; c < dim; ++c) {
      const float acc = a[c] + g[c] * g[c];
      a[c] = acc;
      w[c] = w[c] + (neg_lr * g[c]) / std::sqrt(acc + eps);
    }
  });
}

ImplStatus Store::ApplyAdam(const int64_t* ids, const float* grad, int64_t n, float alpha, float c1,
                            float c2, float eps, bool lazy, const ParallelFor& pf,
                            const int64_t* members, const int64_t* records) {
  const int64_t dim = config_.dim;
  ImplStatus slots = CheckSlots(config_, num_slots_, 2, "Adam update");
  if (!slots.ok()) return slots;
  if (lazy) {
    return ApplyRows(ids, members, records, n, "LazyAdam update", pf, [&](float* w, int64_t i) {
      const float* g = grad + i * dim;
      float* m = w + dim;
      float* v = w + 2 * dim;
      for (int64_t c = 0; c < dim; ++c) {
        float mi = m[c];
        float vi = v[c];
        mi = adam_math::FirstMoment(mi, g[c], c1);
        vi = adam_math::SecondMoment(vi, g[c], c2);
        m[c] = mi;
        v[c] = vi;
        w[c] = adam_math::Step(w[c], mi, vi, alpha, eps);
      }
    });
  }
  // Keras Adam on an IndexedSlices gradient: the moments of every row decay,
  // the touched rows get the gradient, every row moves. Rows never inserted
  // have zero moments in Keras too, so they would not move: skipping them is
  // exact. Runs under the exclusive lock (it touches every row).
  // Validate and add the gradient first (through ApplyRows, so that a bad id
  // changes nothing), keeping decay-then-add order per element:
  //   m' = (m + (-m) * c1) + g * c1.
  ImplStatus status =
      ApplyRows(ids, members, records, n, "Adam update", pf, [&](float* w, int64_t) {
        (void)w;  // validation pass only
      });
  if (!status.ok()) return status;
  std::unique_lock<std::shared_mutex> lock(mu_);
  std::vector<float*> touched_grad(static_cast<size_t>(next_record_), nullptr);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t r = Find(M(members, i), ids[i]);
    if (r == kEmpty) {
      return ImplStatus::InvalidArgument("Adam update of HybridHash table '" + config_.name +
                                         "': ids[" + std::to_string(i) +
                                         "] was evicted concurrently.");
    }
    touched_grad[r] = const_cast<float*>(grad + i * dim);
  }
  pf(next_record_, 12 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      Header* h = Record(static_cast<uint32_t>(r));
      if (h->mark == kDead) continue;
      float* w = Floats(h);
      float* m = w + dim;
      float* v = w + 2 * dim;
      const float* g = touched_grad[r];
      for (int64_t c = 0; c < dim; ++c) {
        m[c] = adam_math::Decay(m[c], c1);
        v[c] = adam_math::Decay(v[c], c2);
      }
      if (g != nullptr) {
        for (int64_t c = 0; c < dim; ++c) {
          m[c] = m[c] + g[c] * c1;
          v[c] = v[c] + (g[c] * g[c]) * c2;
        }
      }
      for (int64_t c = 0; c < dim; ++c) w[c] = adam_math::Step(w[c], m[c], v[c], alpha, eps);
    }
  });
  return ImplStatus::Ok();
}

ImplStatus Store::DecayAdamMoments(float c1, float c2, const ParallelFor& pf) {
  const int64_t dim = config_.dim;
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (num_slots_ == 0) return ImplStatus::Ok();
  ImplStatus slots = CheckSlots(config_, num_slots_, 2, "Adam moments' decay");
  if (!slots.ok()) return slots;
  pf(next_record_, 4 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      Header* h = Record(static_cast<uint32_t>(r));
      if (h->mark == kDead) continue;
      float* m = Floats(h) + dim;
      float* v = m + dim;
      for (int64_t c = 0; c < dim; ++c) {
        m[c] = adam_math::Decay(m[c], c1);
        v[c] = adam_math::Decay(v[c], c2);
      }
    }
  });
  return ImplStatus::Ok();
}

}  // namespace hybrid_hash
}  // namespace hybridtf
