// HybridHash store: export (checkpoints, the hot tier written back first)
// and import. See hybrid_hash_impl.h.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/hybrid_hash/hybrid_hash_impl.h"

namespace hybridtf {
namespace hybrid_hash {

void Store::Export(Snapshot* out) {
  const int64_t dim = config_.dim;
  Export([out, dim](int64_t n, int64_t num_slots, ExportBuffers* b) {
    out->num_slots = num_slots;
    out->ids.resize(n);
    out->members.resize(n);
    out->counts.resize(n);
    out->rows.resize(n * dim);
    out->slots.resize(n * num_slots * dim);
    out->slot_init.resize(num_slots);
    *b = {out->ids.data(),    out->members.data(),   out->rows.data(), out->slots.data(),
          out->counts.data(), out->slot_init.data(), &out->step};
    return true;
  });
}

bool Store::Export(const ExportAllocator& allocate) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  WriteBackLocked();  // the hot tier is written back first
  std::vector<uint32_t> live;
  live.reserve(static_cast<size_t>(size_));
  for (uint32_t r = 0; r < next_record_; ++r) {
    if (Record(r)->mark != kDead) live.push_back(r);
  }
  std::sort(live.begin(), live.end(), [&](uint32_t a, uint32_t b) {
    const Header* x = Record(a);
    const Header* y = Record(b);
    const uint32_t mx = MemberOf(x), my = MemberOf(y);
    return mx != my ? mx < my : x->id < y->id;
  });
  const int64_t dim = config_.dim, n = static_cast<int64_t>(live.size());
  ExportBuffers out;
  if (!allocate(n, num_slots_, &out)) return false;
  if (num_slots_)
    std::memcpy(out.slot_init, slot_init_.data(), 4 * static_cast<size_t>(num_slots_));
  *out.step = step_;
  for (int64_t i = 0; i < n; ++i) {
    Header* h = Record(live[i]);
    const float* f = ColdFloats(h);
    out.ids[i] = h->id;
    out.members[i] = MemberOf(h);
    out.counts[i] = h->count;
    std::memcpy(out.rows + i * dim, f, 4 * dim);
    std::memcpy(out.slots + i * num_slots_ * dim, f + dim, 4 * num_slots_ * dim);
  }
  return true;
}

void Store::ClearLocked() {
  ++layout_epoch_;
  chunks_.clear();
  next_record_ = 0;
  free_.clear();
  map_.assign(16, kEmpty);
  ++map_epoch_;
  size_ = 0;
  hot_.clear();
  hot_owner_.clear();
  hot_count_.clear();
  hot_used_ = 0;
  hot_phase_ = false;
  touched_.clear();
  touch_complete_ = false;
}

ImplStatus Store::Import(const int64_t* ids, const float* rows, const float* slots,
                         const int64_t* counts, int64_t n, int64_t num_slots,
                         const float* slot_init, int64_t step, const int64_t* members,
                         int64_t only_member) {
  const std::string t = Quoted(config_);
  ImplStatus valid = CheckMembers(members, n);
  if (!valid.ok()) return valid;
  if (only_member >= num_members()) {
    return ImplStatus::InvalidArgument(t + ": member " + std::to_string(only_member) +
                                       " is not a table of this store (it packs " +
                                       std::to_string(num_members()) + ").");
  }
  for (int64_t i = 0; only_member >= 0 && i < n; ++i) {
    if (M(members, i) != static_cast<uint32_t>(only_member)) {
      return ImplStatus::InvalidArgument(t + ": restoring member " + std::to_string(only_member) +
                                         " got a row of member " + std::to_string(M(members, i)) +
                                         ".");
    }
  }
  if (num_slots < 0 || num_slots > kMaxSlots) {
    return ImplStatus::InvalidArgument(t + ": a checkpoint with " + std::to_string(num_slots) +
                                       " slots per row; at most " + std::to_string(kMaxSlots) +
                                       " are supported.");
  }
  if (config_.capacity > 0 && n > config_.capacity && only_member < 0) {
    return ImplStatus::InvalidArgument(
        t + ": the checkpoint holds " + std::to_string(n) + " rows, more than capacity " +
        std::to_string(config_.capacity) + ". Restore into a table with a larger capacity.");
  }
  if (step < 0 || step > 0xFFFFFFFFll) {
    return ImplStatus::InvalidArgument(t + ": the checkpoint's step " + std::to_string(step) +
                                       " is outside [0, 4294967295] (a 32-bit step counter). "
                                       "Restore a checkpoint this table exported.");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (counts[i] < 0 || counts[i] > 0xFFFFFFFFll) {
      return ImplStatus::InvalidArgument(
          t + ": the checkpoint's counts[" + std::to_string(i) +
          "] = " + std::to_string(counts[i]) +
          " is outside [0, 4294967295] (a row's count is a 32-bit counter). Restore a "
          "checkpoint this table exported.");
    }
  }
  std::vector<std::pair<int64_t, int64_t>> sorted(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sorted[i] = {M(members, i), ids[i]};
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return ImplStatus::InvalidArgument(t + ": the imported ids are not distinct.");
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  ++layout_epoch_;          // records are freed and rows rewritten
  touch_complete_ = false;  // counts are set, not counted
  if (only_member < 0) {
    ClearLocked();
    num_slots_ = static_cast<int>(num_slots);
    slot_init_.assign(slot_init, slot_init + num_slots);
    record_bytes_ = RecordBytes();
    slots_imported_.store(num_slots > 0, std::memory_order_relaxed);
  } else {  // one member of a packed store: the others keep their rows
    WriteBackLocked();
    std::vector<uint32_t> old;
    for (uint32_t r = 0; r < next_record_; ++r) {
      const Header* h = Record(r);
      if (h->mark != kDead && MemberOf(h) == static_cast<uint32_t>(only_member)) old.push_back(r);
    }
    // Checked before the member's rows are removed: a refused restore leaves the table as it was.
    if (num_slots > 0 && num_slots_ > 0 && num_slots != num_slots_) {
      return ImplStatus::InvalidArgument(
          t + ": the checkpoint of member " + std::to_string(only_member) + " has " +
          std::to_string(num_slots) + " optimizer slot(s) per row, the store holds " +
          std::to_string(num_slots_) +
          ". Restore a checkpoint trained with the same optimizer kind.");
    }
    const int64_t others = size_ - static_cast<int64_t>(old.size());
    if (config_.capacity > 0 && others + n > config_.capacity) {
      return ImplStatus::InvalidArgument(t + ": restoring member " + std::to_string(only_member) +
                                         " needs " + std::to_string(others + n) +
                                         " rows, more than capacity " +
                                         std::to_string(config_.capacity) + ".");
    }
    for (uint32_t r : old) {  // removed, not evicted: not counted
      Header* h = Record(r);
      if (h->hot >= 0) hot_owner_[h->hot] = kEmpty;
      h->hot = -1;
      MapErase(MemberOf(h), h->id);
      h->mark = kDead;
      free_.push_back(r);
      --size_;
    }
    if (num_slots > 0 && num_slots_ == 0) {
      RelayoutLocked(static_cast<int>(num_slots), slot_init);
      slots_imported_.store(true, std::memory_order_relaxed);
    }
  }
  step_ = static_cast<uint32_t>(step);
  const int64_t dim = config_.dim;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t r;
    ImplStatus status = Insert(M(members, i), ids[i], &r);
    if (!status.ok()) return status;
    inserts_.fetch_sub(1, std::memory_order_relaxed);  // restored, not inserted
    Header* h = Record(r);
    // Last seen before the checkpoint's step (the export keeps no per-row step): every restored
    // row is an eviction candidate of the next step, as in the table that was saved; LRU order
    // and TTL ages count from the restore.
    h->last_step = step_ > 0 ? step_ - 1 : 0;
    h->count = static_cast<uint32_t>(counts[i]);  // checked above
    float* f = Floats(h);  // a packed store's member import may place new rows in free hot entries
    std::memcpy(f, rows + i * dim, 4 * dim);
    if (num_slots == num_slots_) {  // else (a checkpoint without slots): slot_init stays
      std::memcpy(f + dim, slots + i * num_slots * dim, 4 * num_slots * dim);
    }
  }
  // The hot tier refilled from the restored counts when the saved store had flushed (EndStep
  // flushes at the first step s >= warmup_steps with s % flush_every == 0); before that, nothing is
  // hot yet. Values do not depend on it; the selection may differ from the last flush's, whose
  // counts were those of its own step, until the next flush.
  const int64_t saved_step = step_, warmup = config_.warmup_steps;
  const int64_t fe = config_.flush_every > 0 ? config_.flush_every : 1;
  // Whether the first flush step, warmup + to_first, is before saved_step (no overflow).
  bool flushed = false;
  if (warmup < saved_step) {
    const int64_t rem = warmup % fe;
    flushed = (rem == 0 ? 0 : fe - rem) < saved_step - warmup;
  }
  if (flushed) {
    FlushLocked();
  } else if (only_member >= 0 && hot_phase_) {  // free hot entries may have been left by removals
    FlushLocked();
  }
  return ImplStatus::Ok();
}

}  // namespace hybrid_hash
}  // namespace hybridtf
