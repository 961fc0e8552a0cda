// HybridHash store: hash map, arena, hot tier, eviction. The find-or-insert
// lookup is in hybrid_hash_lookup_impl.cc, the optimizer updates in
// hybrid_hash_apply_impl.cc, Algorithm 1's step end and flush in
// hybrid_hash_flush_impl.cc, export and import in
// hybrid_hash_io_impl.cc, the configuration and initial rows in
// hybrid_hash_config_impl.cc. See hybrid_hash_impl.h for the design and the locking.
#include "kernels/hybrid_hash/hybrid_hash_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>

namespace hybridtf {
namespace hybrid_hash {

Store::Store(const Config& config) : config_(config), inits_(MemberInits(config)) {
  key_bytes_ = config.members.size() > 1 ? 8 : 0;
  record_bytes_ = RecordBytes();
  map_.assign(16, kEmpty);
  tracking_ = config.count_decay == 1.f && config.ttl_steps == 0;
}

Store::~Store() = default;

ImplStatus Store::Create(const Config& config, std::unique_ptr<Store>* out) {
  ImplStatus status = ValidateConfig(config);
  if (!status.ok()) return status;
  out->reset(new Store(config));
  return ImplStatus::Ok();
}

Store::Header* Store::Record(uint32_t index) const {
  return reinterpret_cast<Header*>(chunks_[index >> kChunkBits].get() +
                                   (index & (kChunkRows - 1)) * record_bytes_);
}

float* Store::Floats(Header* h) const {
  if (h->hot >= 0) return const_cast<float*>(hot_.data()) + int64_t{h->hot} * RowFloats();
  return ColdFloats(h);
}

ImplStatus Store::CheckMembers(const int64_t* members, int64_t n) const {
  if (members == nullptr) return ImplStatus::Ok();
  const int64_t num = num_members();
  for (int64_t i = 0; i < n; ++i) {
    if (members[i] < 0 || members[i] >= num) {
      return ImplStatus::InvalidArgument(
          Quoted(config_) + ": members[" + std::to_string(i) + "] = " + std::to_string(members[i]) +
          " is not a table of this store, which packs " + std::to_string(num) +
          " table(s). Pass member indices in [0, " + std::to_string(num) + ").");
    }
  }
  return ImplStatus::Ok();
}

uint64_t Store::Slot(uint32_t member, int64_t id) const {
  const uint64_t key = static_cast<uint64_t>(id) ^ (uint64_t{member} * 0xD6E8FEB86659FD93ull);
  return Mix(key) & (map_.size() - 1);
}

uint32_t Store::Find(uint32_t member, int64_t id) const {
  return FindFrom(Slot(member, id), member, id);
}

uint32_t Store::FindFrom(uint64_t slot, uint32_t member, int64_t id, uint64_t* end) const {
  const uint64_t mask = map_.size() - 1;
  for (uint64_t s = slot;; s = (s + 1) & mask) {
    const uint32_t index = map_[s];
    const Header* h = index == kEmpty ? nullptr : Record(index);
    if (h == nullptr || (h->id == id && MemberOf(h) == member)) {
      if (end) *end = s;
      return index;
    }
  }
}

void Store::FindBlock(const int64_t* ids, const int64_t* members, int64_t begin, int64_t end,
                      uint32_t* out, uint64_t* ends) const {
  uint64_t slots[kBlock];
  const int64_t n = end - begin;
  for (int64_t k = 0; k < n; ++k) {
    slots[k] = Slot(M(members, begin + k), ids[begin + k]);
    __builtin_prefetch(&map_[slots[k]]);
  }
  // The records of the first kProbeAhead occupied slots of each probe: a probe
  // compares the key of every record it passes, so a collision or a miss at a
  // high load would otherwise wait for those records one after the other.
  const uint64_t mask = map_.size() - 1;
  for (int64_t k = 0; k < n; ++k) {
    for (uint64_t s = slots[k], j = 0; j < kProbeAhead; ++j, s = (s + 1) & mask) {
      const uint32_t index = map_[s];
      if (index == kEmpty) break;
      __builtin_prefetch(Record(index));
    }
  }
  for (int64_t k = 0; k < n; ++k) {
    out[k] = FindFrom(slots[k], M(members, begin + k), ids[begin + k], ends ? ends + k : nullptr);
  }
}

void Store::PrefetchFloats(uint32_t index) const {
  const char* f = reinterpret_cast<const char*>(Floats(Record(index)));
  __builtin_prefetch(f);
  __builtin_prefetch(f + 4 * config_.dim - 1);  // the row's last float (a row may span two lines)
}

void Store::MapInsert(uint32_t member, int64_t id, uint32_t index) {
  const uint64_t mask = map_.size() - 1;
  uint64_t s = Slot(member, id);
  while (map_[s] != kEmpty) s = (s + 1) & mask;
  map_[s] = index;
  ++map_epoch_;
}

void Store::MapErase(uint32_t member, int64_t id) {  // backward-shift deletion
  const uint64_t mask = map_.size() - 1;
  uint64_t i = Slot(member, id);
  while (map_[i] != kEmpty && (Record(map_[i])->id != id || MemberOf(Record(map_[i])) != member)) {
    i = (i + 1) & mask;
  }
  if (map_[i] == kEmpty) return;
  ++map_epoch_;
  uint64_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (map_[j] == kEmpty) break;
    const Header* hj = Record(map_[j]);
    const uint64_t k = Slot(MemberOf(hj), hj->id);
    const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    map_[i] = map_[j];
    i = j;
  }
  map_[i] = kEmpty;
}

ImplStatus Store::GrowMap(const ParallelFor& pf) {
  const uint64_t size = map_.size() * 2;
  if (size > (uint64_t{1} << 33)) {
    return ImplStatus::InvalidArgument(Quoted(config_) + " cannot hold more than " +
                                       std::to_string(kMaxRows) + " rows.");
  }
  map_.assign(size, kEmpty);
  ++map_epoch_;
  const int map_bits = __builtin_ctzll(size);
  const int part_bits = std::min(kInsertPartBits, map_bits);
  const int64_t parts = int64_t{1} << part_bits;
  const int64_t records = next_record_;
  constexpr int64_t kBlocks = kFlushBlocks;  // fixed: the grouping below does not depend on threads
  auto part = [](int64_t total, int64_t b) { return total * b / kBlocks; };
  constexpr uint64_t kNone = ~uint64_t{0};
  std::vector<uint64_t> home(static_cast<size_t>(records));
  std::vector<int64_t> counts(static_cast<size_t>(kBlocks * parts), 0);  // [block][part]
  pf(kBlocks, records / kBlocks * 20 + 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t r = part(records, b); r < part(records, b + 1); ++r) {
        const Header* h = Record(static_cast<uint32_t>(r));
        if (h->mark == kDead) {
          home[r] = kNone;
          continue;
        }
        home[r] = Slot(MemberOf(h), h->id);
        ++counts[b * parts + static_cast<int64_t>(home[r] >> (map_bits - part_bits))];
      }
    }
  });
  // The records grouped by part; within a part, in record order.
  std::vector<int64_t> start(static_cast<size_t>(kBlocks * parts));
  std::vector<int64_t> part_begin(static_cast<size_t>(parts + 1), 0);
  int64_t live = 0;
  for (int64_t p = 0; p < parts; ++p) {
    part_begin[p] = live;
    for (int64_t b = 0; b < kBlocks; ++b) {
      start[b * parts + p] = live;
      live += counts[b * parts + p];
    }
  }
  part_begin[parts] = live;
  std::vector<uint32_t> order(static_cast<size_t>(live));
  pf(kBlocks, records / kBlocks * 4 + 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* next = start.data() + b * parts;
      for (int64_t r = part(records, b); r < part(records, b + 1); ++r) {
        if (home[r] != kNone)
          order[next[home[r] >> (map_bits - part_bits)]++] = static_cast<uint32_t>(r);
      }
    }
  });
  uint32_t* map = map_.data();
  const uint64_t mask = size - 1;
  pf(parts, (live / parts + 1) * 40, [&](int64_t p0, int64_t p1) {
    constexpr int64_t kAhead = 16;
    for (int64_t k = part_begin[p0]; k < part_begin[p1]; ++k) {
      if (k + kAhead < part_begin[p1]) __builtin_prefetch(&map[home[order[k + kAhead]]], 1);
      const uint32_t r = order[k];
      for (uint64_t s = home[r];; s = (s + 1) & mask) {  // a probe may run into the next part
        uint32_t expected = kEmpty;
        if (__atomic_compare_exchange_n(&map[s], &expected, r, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
          break;
        }
      }
    }
  });
  return ImplStatus::Ok();
}

ImplStatus Store::AllocRecord(uint32_t* index) {
  if (!free_.empty()) {
    *index = free_.back();
    free_.pop_back();
    return ImplStatus::Ok();
  }
  if (int64_t{next_record_} >= kMaxRows) {
    return ImplStatus::InvalidArgument(Quoted(config_) + " is full: it holds " +
                                       std::to_string(kMaxRows) +
                                       " rows. Set a capacity to evict rare ids.");
  }
  if ((int64_t{next_record_} >> kChunkBits) >= static_cast<int64_t>(chunks_.size())) {
    int64_t bytes = 0;
    if (__builtin_mul_overflow(kChunkRows, record_bytes_, &bytes)) {
      return ImplStatus::InvalidArgument(Quoted(config_) + ": row size overflows.");
    }
    chunks_.emplace_back(static_cast<char*>(AllocLines(static_cast<size_t>(bytes))));
    if (!chunks_.back()) {
      chunks_.pop_back();
      return ImplStatus::Internal(Quoted(config_) + ": out of memory growing the row arena.");
    }
    if (tracking_) touched_.resize(chunks_.size() * (kChunkRows / 64), 0);
  }
  *index = next_record_++;
  return ImplStatus::Ok();
}

void Store::WriteRecord(Header* h, uint32_t member, int64_t id, const float* row) const {
  h->id = id;
  h->count = 0;
  h->hot = -1;
  h->last_step = step_;
  h->mark = 0;
  if (key_bytes_) *reinterpret_cast<uint64_t*>(h + 1) = member;
  float* f = ColdFloats(h);
  if (row) {
    std::memcpy(f, row, 4 * config_.dim);
  } else {
    InitialRowsWith(inits_[member], config_.dim, &id, 1, f);
  }
  for (int s = 0; s < num_slots_; ++s) {
    std::fill(f + (1 + s) * config_.dim, f + (2 + s) * config_.dim, slot_init_[s]);
  }
}

bool Store::GrowHotTier(int64_t entries) {
  entries = std::min(entries, config_.hot_rows);
  if (entries <= static_cast<int64_t>(hot_owner_.size())) return true;
  try {  // a failed allocation leaves the tier as it was (the rows stay cold)
    hot_owner_.reserve(static_cast<size_t>(entries));
    hot_count_.reserve(static_cast<size_t>(entries));
    hot_.reserve(static_cast<size_t>(entries * RowFloats()));
  } catch (const std::bad_alloc&) {
    return false;
  }
  hot_owner_.resize(static_cast<size_t>(entries), kEmpty);
  hot_count_.resize(static_cast<size_t>(entries), 0);
  hot_.resize(static_cast<size_t>(entries * RowFloats()));  // not zeroed (written before read)
  return true;
}

void Store::MakeHotIfRoom(uint32_t index) {
  if (!hot_phase_ || hot_used_ >= config_.hot_rows) return;
  // The tier grows with the table (doubling) up to hot_rows entries, so a large
  // hot_rows costs memory only once there are rows to fill it.
  if (hot_used_ >= static_cast<int64_t>(hot_owner_.size()) &&
      !GrowHotTier(std::max<int64_t>(2 * hot_used_, kMinHotEntries))) {
    return;
  }
  // Hot entries are only freed by a flush, which fills [0, hot_used_): the free ones follow.
  const int64_t e = hot_used_++;
  Header* h = Record(index);
  std::memcpy(hot_.data() + e * RowFloats(), ColdFloats(h), 4 * RowFloats());
  hot_owner_[e] = index;
  hot_count_[e] = h->count;
  h->hot = static_cast<int32_t>(e);
}

ImplStatus Store::Insert(uint32_t member, int64_t id, uint32_t* index, const float* row) {
  if (config_.capacity > 0 && size_ >= config_.capacity) {
    ImplStatus status = EvictFor(size_ - config_.capacity + 1);
    if (!status.ok()) return status;
  }
  if ((size_ + 1) * 10 > static_cast<int64_t>(map_.size()) * 7) {
    ImplStatus status = GrowMap();
    if (!status.ok()) return status;
  }
  ImplStatus status = AllocRecord(index);
  if (!status.ok()) return status;
  WriteRecord(Record(*index), member, id, row);
  MakeHotIfRoom(*index);
  MapInsert(member, id, *index);
  ++size_;
  inserts_.fetch_add(1, std::memory_order_relaxed);
  return ImplStatus::Ok();
}

ImplStatus Store::EvictFor(int64_t needed) {
  std::vector<uint32_t> candidates;
  for (uint32_t r = 0; r < next_record_; ++r) {
    const Header* h = Record(r);
    if (h->mark != kDead && h->hot < 0 && h->last_step != step_) candidates.push_back(r);
  }
  if (static_cast<int64_t>(candidates.size()) < needed) {
    return ImplStatus::InvalidArgument(
        Quoted(config_) + " is full (capacity " + std::to_string(config_.capacity) +
        ") and every row is hot or used in the current step. Raise capacity above the distinct "
        "ids of one step plus hot_rows (" +
        std::to_string(config_.hot_rows) + ").");
  }
  const int64_t k = std::min<int64_t>(std::max<int64_t>(needed, config_.capacity / 32),
                                      static_cast<int64_t>(candidates.size()));
  const bool lfu = config_.evict_policy == EvictPolicy::kLfu;
  auto colder = [&](uint32_t a, uint32_t b) {
    const Header* x = Record(a);
    const Header* y = Record(b);
    if (lfu && x->count != y->count) return x->count < y->count;
    if (x->last_step != y->last_step) return x->last_step < y->last_step;
    if (!lfu && x->count != y->count) return x->count < y->count;
    return x->id != y->id ? x->id < y->id : MemberOf(x) < MemberOf(y);
  };
  std::nth_element(candidates.begin(), candidates.begin() + (k - 1), candidates.end(), colder);
  candidates.resize(k);
  EvictIndices(candidates);
  return ImplStatus::Ok();
}

void Store::EvictIndices(const std::vector<uint32_t>& victims) {
  ++layout_epoch_;  // records are freed (and may be reused for other keys)
  for (uint32_t r : victims) {
    Header* h = Record(r);
    MapErase(MemberOf(h), h->id);
    h->mark = kDead;
    free_.push_back(r);
    --size_;
  }
  evictions_.fetch_add(static_cast<int64_t>(victims.size()), std::memory_order_relaxed);
}

void Store::RelayoutLocked(int num_slots, const float* slot_init) {
  ++layout_epoch_;  // every record moves to new chunks
  touch_complete_ = false;
  WriteBackLocked();
  const int64_t dim = config_.dim;
  const int64_t old_bytes = record_bytes_;
  std::vector<LineChunk> old = std::move(chunks_);
  chunks_.clear();
  num_slots_ = num_slots;
  slot_init_.assign(slot_init, slot_init + num_slots);
  record_bytes_ = RecordBytes();
  for (size_t c = 0; c < old.size(); ++c) {
    chunks_.emplace_back(static_cast<char*>(AllocLines(kChunkRows * record_bytes_)));
    if (!chunks_.back()) throw std::bad_alloc();  // as new char[] did
    for (int64_t i = 0; i < kChunkRows; ++i) {
      const char* src = old[c].get() + i * old_bytes;
      char* dst = chunks_[c].get() + i * record_bytes_;
      std::memcpy(dst, src, sizeof(Header) + key_bytes_ + 4 * dim);
      float* f = reinterpret_cast<float*>(dst + sizeof(Header) + key_bytes_);
      for (int s = 0; s < num_slots; ++s) {
        std::fill(f + (1 + s) * dim, f + (2 + s) * dim, slot_init[s]);
      }
    }
  }
  // Only owned entries are ever read: the others need no values.
  if (!hot_.empty()) hot_.resize(hot_owner_.size() * RowFloats());
  for (size_t e = 0; e < hot_owner_.size(); ++e) {
    if (hot_owner_[e] != kEmpty) {
      std::memcpy(hot_.data() + e * RowFloats(), ColdFloats(Record(hot_owner_[e])),
                  4 * RowFloats());
    }
  }
}

ImplStatus Store::EnsureSlots(int num_slots, const float* slot_init, bool* replaced) {
  if (replaced) *replaced = false;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (num_slots == num_slots_) {
      // The imported slots are this optimizer's: training now uses them.
      if (slots_imported_.load(std::memory_order_relaxed)) {
        slots_imported_.store(false, std::memory_order_relaxed);
      }
      return ImplStatus::Ok();
    }
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  const bool imported = slots_imported_.exchange(false, std::memory_order_relaxed);
  if (num_slots == num_slots_) return ImplStatus::Ok();
  if (num_slots_ != 0 && imported) {  // another optimizer's checkpoint: fresh slots
    RelayoutLocked(num_slots, slot_init);
    if (replaced) *replaced = true;
    return ImplStatus::Ok();
  }
  if (num_slots_ != 0) {
    return ImplStatus::InvalidArgument(
        Quoted(config_) + " holds " + std::to_string(num_slots_) +
        " optimizer slot(s) per row, but this update needs " + std::to_string(num_slots) +
        ". A table trains with one optimizer kind: keep the optimizer it was trained (or "
        "restored) with, or start a new table.");
  }
  RelayoutLocked(num_slots, slot_init);
  return ImplStatus::Ok();
}

Stats Store::GetStats() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  Stats s;
  s.size = size_;
  s.hot_used = hot_used_;
  s.hot_rows = config_.hot_rows;
  s.inserts = inserts_.load();
  s.evictions = evictions_.load();
  s.lookups = lookups_.load();
  s.hits = hits_.load();
  s.occurrences = occurrences_.load();
  s.occurrence_hits = occurrence_hits_.load();
  s.step = step_;
  s.flushes = flushes_.load();
  s.last_step_lookups = last_step_lookups_.load();
  s.last_step_hits = last_step_hits_.load();
  s.bytes = static_cast<int64_t>(chunks_.size()) * kChunkRows * record_bytes_ +
            static_cast<int64_t>(map_.capacity() + free_.capacity()) * 4 +
            static_cast<int64_t>(touched_.capacity()) * 8 +
            hinted_bytes_.load(std::memory_order_relaxed);
  s.hot_bytes = static_cast<int64_t>(hot_.capacity()) * 4 +
                static_cast<int64_t>(hot_owner_.capacity() + hot_count_.capacity()) * 4;
  s.num_slots = num_slots_;
  return s;
}

}  // namespace hybrid_hash
}  // namespace hybridtf
