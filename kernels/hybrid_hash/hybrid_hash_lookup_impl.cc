// HybridHash find-or-insert lookup (Store::Lookup). See hybrid_hash_impl.h for
// the store and its locking.
//
// A training lookup has three passes:
//   1. shared lock, parallel over blocks of ids: probe, copy present rows
//      (under their stripe's sequence lock), count them (atomics);
//   2. no lock, parallel: the initial rows of the ids not found, straight
//      into the output (they depend only on (member seed, id, initializer));
//   3. exclusive lock: insert the ids not found. In a store without a
//      capacity (no eviction) the candidates are split into 2^kInsertPartBits
//      parts by their home map slot and each part is inserted by one worker
//      (InsertParallel); with a capacity one by one (InsertSerial).
// InsertParallel is lock-free linear probing without deletions: a key's home
// slot decides its part, so one worker handles every copy of a key (a
// repeated id or one another chain inserted meanwhile is found, not inserted
// twice); a worker writes the record before it claims a map slot with a
// compare-and-swap (release) and probes with acquire loads, so a slot another
// part's key took (its probe ran past its part) is skipped or compared with a
// complete record. Records are allocated for every candidate before the
// workers start (part p takes a contiguous range); a candidate that turns out
// present leaves its record unused, which is marked dead and freed. Parts and
// record ranges depend on the batch only, not on the thread count, and the
// free hot entries (everything fits) are handed out afterwards in batch order
// as one by one, so the store's content is the same however many threads run.
// The shared pass keeps each missing id's probe end (the empty map slot where
// its probe stopped); if no other writer changed the map in between (map_epoch_
// unchanged), InsertParallel resumes each probe there instead of walking the
// occupied slots from the home slot again (each one a record read).
#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernels/hybrid_hash/hybrid_hash_impl.h"

namespace hybridtf {
namespace hybrid_hash {

namespace {

// count + add, saturating at 2^32 - 1 (add is in [0, 2^32 - 1]: Lookup checks the counts, so the
// int64 sum cannot overflow; it is clamped again for any other caller).
inline uint32_t SaturatedSum(uint32_t count, int64_t add) {
  const int64_t bounded = std::min<int64_t>(std::max<int64_t>(add, 0), 0xFFFFFFFFll);
  return static_cast<uint32_t>(std::min<int64_t>(int64_t{count} + bounded, 0xFFFFFFFFll));
}

// counter += add, saturating (the caller excludes other writers).
inline void AddSaturating(uint32_t* counter, int64_t add) {
  *counter = SaturatedSum(*counter, add);
}

// The same for a counter other threads may add to at the same time.
inline void AddSaturatingAtomic(uint32_t* counter, int64_t add) {
  uint32_t cur = __atomic_load_n(counter, __ATOMIC_RELAXED);
  for (;;) {
    const uint32_t sum = SaturatedSum(cur, add);
    if (__atomic_compare_exchange_n(counter, &cur, sum, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      return;
    }
  }
}

// Batch position i read record r (header h) at `step`: its record index (when the
// batch wants them), its count and its last step; returns the occurrences added.
// (Templated so that it takes Store's private batch and header types.)
template <typename Batch, typename Header>
inline int64_t NoteRead(const Batch& b, int64_t i, int64_t r, Header* h, uint32_t step) {
  if (b.records) b.records[i] = RecordHint(static_cast<uint32_t>(r), h->hot);
  const int64_t c = b.counts ? b.counts[i] : 1;
  AddSaturating(&h->count, c);
  h->last_step = step;
  return c;
}

}  // namespace

ImplStatus Store::Lookup(const int64_t* ids, const int64_t* counts, int64_t n, bool insert,
                         float* out, const ParallelFor& pf, const int64_t* members,
                         int64_t* records) {
  ImplStatus valid = CheckMembers(members, n);
  if (!valid.ok()) return valid;
  for (int64_t i = 0; counts != nullptr && i < n; ++i) {
    if (counts[i] < 0 || counts[i] > 0xFFFFFFFFll) {
      return ImplStatus::InvalidArgument(
          Quoted(config_) + ": counts[" + std::to_string(i) + "] = " + std::to_string(counts[i]) +
          " is outside [0, 4294967295]: counts are how often each id occurs in the batch "
          "(tf.unique_with_counts), added to the row's 32-bit count.");
    }
  }
  const int64_t dim = config_.dim;
  std::vector<char> missing(static_cast<size_t>(n), 0);
  std::vector<uint64_t> ends(insert ? static_cast<size_t>(n) : 0);
  std::atomic<int64_t> num_missing{0};
  uint64_t epoch = 0;
  uint64_t layout = 0;  // the layout epoch every hint of this lookup is taken in
  // A training lookup that returns hints keeps (ids, members, hints) for the
  // update's HintsProven, copied by the shared pass's workers while the ids
  // are in cache. Another lookup keeping its own: this one is not kept.
  std::unique_lock<std::mutex> keep(hinted_mu_, std::defer_lock);
  if (insert && records != nullptr && keep.try_lock()) {
    hinted_.valid = false;
    hinted_.ids.resize(static_cast<size_t>(n));
    hinted_.packed = members != nullptr;
    hinted_.members.resize(members ? static_cast<size_t>(n) : 0);
    hinted_.hints.resize(static_cast<size_t>(n));
    hinted_bytes_.store(static_cast<int64_t>(hinted_.ids.capacity() + hinted_.members.capacity() +
                                             hinted_.hints.capacity()) *
                            8,
                        std::memory_order_relaxed);
  }
  const bool saving = keep.owns_lock();
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    const uint32_t step = step_;
    epoch = map_epoch_;
    layout = layout_epoch_;
    pf(n, 200 + 2 * dim, [&](int64_t begin, int64_t end) {
      int64_t hits = 0, occ = 0, occ_hits = 0, miss = 0;
      uint32_t block[kBlock];
      for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t e = std::min(end, b + kBlock);
        FindBlock(ids, members, b, e, block, insert ? ends.data() + b : nullptr);
        for (int64_t i = b; i < e; ++i) {
          if (block[i - b] != kEmpty) PrefetchFloats(block[i - b]);
        }
        for (int64_t i = b; i < e; ++i) {
          const uint32_t r = block[i - b];
          if (r == kEmpty) {
            if (records) records[i] = r;
            missing[i] = 1;
            ++miss;
            continue;
          }
          Header* h = Record(r);
          if (records) records[i] = RecordHint(r, h->hot);
          const int64_t c = counts ? counts[i] : 1;
          // Under the shared lock no row moves and only updates write one
          // (under its stripe's sequence lock); counts and last steps only
          // lookups, which may run concurrently: atomics.
          float* row = Floats(h);
          ReadStripe(r, [&] { std::memcpy(out + i * dim, row, 4 * dim); });
          if (insert) {
            AddSaturatingAtomic(&h->count, c);
            __atomic_store_n(&h->last_step, step, __ATOMIC_RELAXED);
            Touch(r);
            occ += c;
            if (h->hot >= 0) {
              ++hits;
              occ_hits += c;
            }
          }
        }
      }
      if (saving) {
        const size_t bytes = sizeof(int64_t) * static_cast<size_t>(end - begin);
        std::memcpy(hinted_.ids.data() + begin, ids + begin, bytes);
        if (members) std::memcpy(hinted_.members.data() + begin, members + begin, bytes);
        std::memcpy(hinted_.hints.data() + begin, records + begin, bytes);
      }
      num_missing.fetch_add(miss, std::memory_order_relaxed);
      if (insert) {
        hits_.fetch_add(hits, std::memory_order_relaxed);
        step_hits_.fetch_add(hits, std::memory_order_relaxed);
        occurrences_.fetch_add(occ, std::memory_order_relaxed);
        occurrence_hits_.fetch_add(occ_hits, std::memory_order_relaxed);
      }
    });
  }
  if (insert) {
    lookups_.fetch_add(n, std::memory_order_relaxed);
    step_lookups_.fetch_add(n, std::memory_order_relaxed);
  }
  if (num_missing.load() == 0) {
    if (saving) {
      hinted_.epoch = layout;
      hinted_.valid = true;
    }
    return ImplStatus::Ok();
  }
  // The initial rows of the ids not found, outside any lock. A pure read
  // returns them; an insert stores them (or, for an id another chain inserted
  // meanwhile, replaces them with the stored row).
  pf(n, 20 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (missing[i]) InitialRowsWith(inits_[M(members, i)], dim, ids + i, 1, out + i * dim);
    }
  });
  if (!insert) return ImplStatus::Ok();
  std::vector<int64_t> todo;
  todo.reserve(static_cast<size_t>(num_missing.load()));
  for (int64_t i = 0; i < n; ++i) {
    if (missing[i]) todo.push_back(i);
  }
  const LookupBatch batch{ids, counts, members, out, records, ends.data(), epoch};
  std::unique_lock<std::shared_mutex> lock(mu_);
  // A flush, eviction or import between the passes may have moved rows the
  // shared pass hinted: then the hints stay hints (checked by the update).
  const bool same_layout = layout_epoch_ == layout;
  ImplStatus status =
      config_.capacity > 0 ? InsertSerial(todo, batch) : InsertParallel(todo, batch, pf);
  if (status.ok() && saving && same_layout && layout_epoch_ == layout) {
    for (int64_t i : todo) hinted_.hints[i] = records[i];  // the inserted ids' hints
    hinted_.epoch = layout;
    hinted_.valid = true;
  }
  return status;
}

ImplStatus Store::InsertSerial(const std::vector<int64_t>& todo, const LookupBatch& b) {
  const int64_t dim = config_.dim;
  const int64_t m = static_cast<int64_t>(todo.size());
  int64_t occ = 0;
  for (int64_t j = 0; j < m; ++j) {
    const int64_t i = todo[j];
    if (j + kBlock < m) {  // prefetched: overlaps the map misses of the inserts
      const int64_t next = todo[j + kBlock];
      __builtin_prefetch(&map_[Slot(M(b.members, next), b.ids[next])]);
    }
    uint32_t r = Find(M(b.members, i), b.ids[i]);
    if (r == kEmpty) {  // else inserted meanwhile (another chain, or a repeated id)
      ImplStatus status = Insert(M(b.members, i), b.ids[i], &r, b.out + i * dim);
      if (!status.ok()) {
        occurrences_.fetch_add(occ, std::memory_order_relaxed);
        return status;
      }
    } else {
      std::memcpy(b.out + i * dim, Floats(Record(r)), 4 * dim);
    }
    occ += NoteRead(b, i, r, Record(r), step_);
    Touch(r);
  }
  occurrences_.fetch_add(occ, std::memory_order_relaxed);
  return ImplStatus::Ok();
}

ImplStatus Store::InsertParallel(const std::vector<int64_t>& todo, const LookupBatch& b,
                                 const ParallelFor& pf) {
  const int64_t dim = config_.dim;
  const int64_t m = static_cast<int64_t>(todo.size());
  // Room for every candidate (an upper bound: some may be present by now).
  int64_t needed = 0;
  if (__builtin_add_overflow(size_, m, &needed) || needed > kMaxRows) {
    return ImplStatus::InvalidArgument(Quoted(config_) + " cannot hold more than " +
                                       std::to_string(kMaxRows) + " rows.");
  }
  while (needed * 10 > static_cast<int64_t>(map_.size()) * 7) {
    ImplStatus status = GrowMap(pf);
    if (!status.ok()) return status;
  }
  // Home slots, then the candidates ordered by part (stable: batch order within a part).
  const int map_bits = __builtin_ctzll(map_.size());
  const int part_bits = std::min(kInsertPartBits, map_bits);
  const int64_t parts = int64_t{1} << part_bits;
  std::vector<uint64_t> slot(static_cast<size_t>(m));
  std::vector<int64_t> start(static_cast<size_t>(parts + 1), 0);
  for (int64_t j = 0; j < m; ++j) {
    slot[j] = Slot(M(b.members, todo[j]), b.ids[todo[j]]);
    ++start[(slot[j] >> (map_bits - part_bits)) + 1];
  }
  for (int64_t p = 0; p < parts; ++p) start[p + 1] += start[p];
  std::vector<int64_t> order(static_cast<size_t>(m));
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t j = 0; j < m; ++j) order[fill[slot[j] >> (map_bits - part_bits)]++] = j;
  }
  // One record per candidate, position k of `order` takes rec[k].
  std::vector<uint32_t> rec(static_cast<size_t>(m));
  for (int64_t k = 0; k < m; ++k) {
    ImplStatus status = AllocRecord(&rec[k]);
    if (!status.ok()) {
      for (int64_t q = 0; q < k; ++q) {
        Record(rec[q])->mark = kDead;
        free_.push_back(rec[q]);
      }
      return status;
    }
  }
  // The map unchanged since the shared pass (no other insert, erase or growth
  // in between): a missing key's probe resumes at the empty slot where the
  // shared pass stopped. The slots before it were occupied by other keys and
  // stay so (nothing is erased here); the ones from it on are empty or were
  // filled by this batch (compared as usual). Else from the home slot.
  const uint64_t* resume =
      b.probe_ends != nullptr && map_epoch_ == b.epoch ? b.probe_ends : nullptr;
  auto first_slot = [&](int64_t j) { return resume ? resume[todo[j]] : slot[j]; };
  std::vector<uint32_t> inserted(static_cast<size_t>(m), kEmpty);  // by j: the new record
  std::atomic<int64_t> total_new{0}, total_occ{0};
  const uint64_t mask = map_.size() - 1;
  const uint32_t step = step_;
  pf(parts, (m / parts + 1) * (400 + 8 * dim), [&](int64_t p0, int64_t p1) {
    int64_t news = 0, occ = 0;
    for (int64_t k = start[p0]; k < start[p1]; ++k) {
      if (k + kBlock < start[p1]) __builtin_prefetch(&map_[first_slot(order[k + kBlock])]);
      const int64_t j = order[k];
      const int64_t i = todo[j];
      const uint32_t member = M(b.members, i);
      const int64_t id = b.ids[i];
      uint32_t r = kEmpty;
      uint64_t s = first_slot(j);
      for (;; s = (s + 1) & mask) {
        const uint32_t index = __atomic_load_n(&map_[s], __ATOMIC_ACQUIRE);
        if (index == kEmpty) break;
        const Header* h = Record(index);
        if (h->id == id && MemberOf(h) == member) {
          r = index;
          break;
        }
      }
      if (r == kEmpty) {
        r = rec[k];
        WriteRecord(Record(r), member, id, b.out + i * dim);
        for (;; s = (s + 1) & mask) {  // claim the first free slot from s
          uint32_t expected = kEmpty;
          if (__atomic_compare_exchange_n(&map_[s], &expected, r, false, __ATOMIC_RELEASE,
                                          __ATOMIC_RELAXED)) {
            break;
          }
        }
        inserted[j] = r;
        ++news;
      } else {  // inserted meanwhile (another chain) or a repeated id of this part
        std::memcpy(b.out + i * dim, Floats(Record(r)), 4 * dim);
      }
      occ += NoteRead(b, i, r, Record(r), step);
      Touch(r);
    }
    total_new.fetch_add(news, std::memory_order_relaxed);
    total_occ.fetch_add(occ, std::memory_order_relaxed);
  });
  for (int64_t k = 0; k < m; ++k) {  // unused records (ids found present) are freed
    if (inserted[order[k]] != rec[k]) {
      Record(rec[k])->mark = kDead;
      free_.push_back(rec[k]);
    }
  }
  if (hot_phase_) {  // free hot entries go to new rows in batch order, as one by one
    const int64_t hot_before = hot_used_;
    for (int64_t j = 0; j < m && hot_used_ < config_.hot_rows; ++j) {
      if (inserted[j] != kEmpty) MakeHotIfRoom(inserted[j]);
    }
    // The hints of this pass (new rows, repeats of them) with their hot entries,
    // if a new row took one (the workers' hints are right otherwise).
    if (b.records && hot_used_ != hot_before) {
      for (int64_t j = 0; j < m; ++j) {
        const uint32_t r = static_cast<uint32_t>(b.records[todo[j]]);
        b.records[todo[j]] = RecordHint(r, Record(r)->hot);
      }
    }
  }
  if (total_new.load() > 0) ++map_epoch_;
  size_ += total_new.load();
  inserts_.fetch_add(total_new.load(), std::memory_order_relaxed);
  occurrences_.fetch_add(total_occ.load(), std::memory_order_relaxed);
  return ImplStatus::Ok();
}

}  // namespace hybrid_hash
}  // namespace hybridtf
