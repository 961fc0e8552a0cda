// HybridHash's flush (Algorithm 1, L23-26): Store::EndStep, Store::Flush and
// the incremental top-k re-selection of the hot tier (Store::FlushLocked). See
// hybrid_hash_impl.h for the store, its tiers and its locking.
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/hybrid_hash/hybrid_hash_impl.h"

namespace hybridtf {
namespace hybrid_hash {

void Store::WriteBackLocked() {
  for (size_t e = 0; e < hot_owner_.size(); ++e) {
    if (hot_owner_[e] == kEmpty) continue;
    std::memcpy(ColdFloats(Record(hot_owner_[e])), hot_.data() + e * RowFloats(), 4 * RowFloats());
  }
}

bool Store::FlushLocked(const ParallelFor& pf, float decay) {
  // Every row already hot and no TTL: the top-k is every row, which is where it
  // is, so the re-selection would only copy every row out and back.
  // (A member's import may leave free entries among [0, hot_used_): then re-select.)
  if (hot_phase_ && config_.ttl_steps == 0 && hot_used_ == size_ && size_ <= config_.hot_rows &&
      std::find(hot_owner_.begin(), hot_owner_.begin() + hot_used_, kEmpty) ==
          hot_owner_.begin() + hot_used_) {
    return false;
  }
  ++layout_epoch_;  // rows move between the tiers
  const int64_t hot_rows = config_.hot_rows;
  const int64_t row_floats = RowFloats();
  // Incremental: the tier keeps the rows that stay hot where they are; only the
  // rows that leave are written back and only the ones that enter are copied in.
  // (A TTL may evict hot rows, and the first flush or one after an import or a
  // relayout has no tier of the right size yet: those start from an empty tier.)
  const bool incremental = config_.ttl_steps == 0 &&
                           static_cast<int64_t>(hot_owner_.size()) == hot_rows &&
                           static_cast<int64_t>(hot_.size()) == hot_rows * row_floats;
  if (!incremental) {
    WriteBackLocked();
    for (size_t e = 0; e < hot_owner_.size(); ++e) {
      if (hot_owner_[e] != kEmpty) Record(hot_owner_[e])->hot = -1;
    }
    hot_owner_.assign(static_cast<size_t>(hot_rows), kEmpty);
    hot_used_ = 0;
    // Entries are written before they are read (below or by MakeHotIfRoom), so
    // the tier is not zeroed: a free entry's pages are first touched when a
    // row takes it.
    hot_.resize(static_cast<size_t>(hot_rows * row_floats));
  }
  if (!incremental && config_.ttl_steps == 0 && size_ <= hot_rows) {
    // Every row fits (and none expires): the top-k is every live record, in
    // record order as below, so one pass over the arena copies them.
    int64_t e = 0;
    for (uint32_t r = 0; r < next_record_; ++r) {
      Header* h = Record(r);
      if (h->mark == kDead) continue;
      std::memcpy(hot_.data() + e * row_floats, ColdFloats(h), 4 * row_floats);
      h->hot = static_cast<int32_t>(e);
      hot_owner_[e++] = r;
    }
    hot_used_ = e;
    hot_phase_ = true;
    return false;
  }
  // One pass over the arena (record order: sequential reads, in fixed blocks
  // that the workers share) copies what the selection compares into a compact
  // array and counts the counts, so that choosing the top-k rarely goes back to
  // the records. Block b fills live[begin_b, begin_b + filled[b]).
  struct Candidate {
    uint32_t count;
    uint32_t record;
    int64_t id;
  };
  constexpr uint32_t kBuckets = 1u << 12;  // the last bucket holds every larger count
  auto bucket = [](uint32_t count) { return std::min(count, kBuckets - 1); };
  const int64_t records = next_record_;
  const int64_t blocks =
      std::max<int64_t>(1, std::min<int64_t>(kFlushBlocks, records / kChunkRows));
  const int64_t per_block = (records + blocks - 1) / blocks;
  // Not value-initialized: every slot a block reads was written by its scan.
  std::unique_ptr<Candidate[]> live(new Candidate[static_cast<size_t>(records)]);
  std::vector<int64_t> filled(static_cast<size_t>(blocks), 0);
  std::vector<int64_t> histograms(static_cast<size_t>(blocks * kBuckets), 0);
  std::vector<std::vector<uint32_t>> stale(static_cast<size_t>(blocks));
  const bool ttl = config_.ttl_steps > 0;
  pf(blocks, per_block * 40, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* histogram = histograms.data() + b * kBuckets;
      Candidate* out = live.get() + b * per_block;
      int64_t m = 0;
      const int64_t end = std::min(records, (b + 1) * per_block);
      for (int64_t r = b * per_block; r < end; ++r) {
        Header* h = Record(static_cast<uint32_t>(r));
        if (h->mark == kDead) continue;
        if (ttl && int64_t{step_} - h->last_step > config_.ttl_steps) {
          stale[b].push_back(static_cast<uint32_t>(r));
          continue;
        }
        out[m++] = {h->count, static_cast<uint32_t>(r), h->id};
        ++histogram[bucket(h->count)];
        // EndStep's decay after the flush, done here: the selection has the count already
        if (decay < 1.f) h->count = static_cast<uint32_t>(h->count * decay);
      }
      filled[b] = m;
    }
  });
  std::vector<int64_t> histogram(kBuckets, 0);
  int64_t n = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    n += filled[b];
    for (uint32_t i = 0; i < kBuckets; ++i) histogram[i] += histograms[b * kBuckets + i];
    if (!stale[b].empty()) EvictIndices(stale[b]);  // never hot here (the tier was emptied above)
  }
  auto for_live = [&](auto&& fn) {
    for (int64_t b = 0; b < blocks; ++b) {
      const Candidate* c = live.get() + b * per_block;
      for (int64_t i = 0; i < filled[b]; ++i) fn(c[i]);
    }
  };
  // Top-k by count, ties by smaller id, then smaller member: a strict total
  // order, so the set is unique. The k-th largest count's bucket t comes from
  // the histogram: every record above it is in, and only t's records are
  // ordered (nth_element).
  const int64_t k = std::min<int64_t>(hot_rows, n);
  std::vector<uint32_t> chosen;  // the top-k's records
  chosen.reserve(static_cast<size_t>(k));
  if (k < n) {
    uint32_t t = kBuckets - 1;
    int64_t above = 0;  // records in the buckets above t
    while (above + histogram[t] < k) above += histogram[t--];
    std::vector<Candidate> tied;
    tied.reserve(static_cast<size_t>(histogram[t]));
    for_live([&](const Candidate& c) {
      const uint32_t b = bucket(c.count);
      if (b > t) {
        chosen.push_back(c.record);
      } else if (b == t) {
        tied.push_back(c);
      }
    });
    int64_t wanted = k - above;
    if (t < kBuckets - 1) {
      // One count: the smallest ids are in. A radix selection, 16 bits at a
      // time from the top: the ids below the wanted one's digit are in, the
      // ones above it out, and only those sharing its digits go on.
      for (int shift = 48; shift >= 0 && wanted < static_cast<int64_t>(tied.size()); shift -= 16) {
        std::vector<int64_t> digits(1 << 16, 0);
        auto digit = [shift](const Candidate& c) {
          return static_cast<uint32_t>(
              ((static_cast<uint64_t>(c.id) ^ (uint64_t{1} << 63)) >> shift) & 0xFFFF);
        };
        for (const Candidate& c : tied) ++digits[digit(c)];
        uint32_t d = 0;
        int64_t below = 0;
        while (below + digits[d] < wanted) below += digits[d++];
        std::vector<Candidate> same;
        same.reserve(static_cast<size_t>(digits[d]));
        for (const Candidate& c : tied) {
          const uint32_t x = digit(c);
          if (x < d) {
            chosen.push_back(c.record);
          } else if (x == d) {
            same.push_back(c);
          }
        }
        tied.swap(same);
        wanted -= below;
      }
    }
    // What is left: counts above the last bucket, or one id in several members.
    auto first = [&](const Candidate& x, const Candidate& y) {
      if (x.count != y.count) return x.count > y.count;
      if (x.id != y.id) return x.id < y.id;
      return MemberOf(Record(x.record)) < MemberOf(Record(y.record));  // a packed store's same id
    };
    if (wanted < static_cast<int64_t>(tied.size())) {
      std::nth_element(tied.begin(), tied.begin() + wanted, tied.end(), first);
    }
    for (int64_t j = 0; j < wanted; ++j) chosen.push_back(tied[j].record);
  } else {
    for_live([&](const Candidate& c) { chosen.push_back(c.record); });
  }
  live.reset();
  // Moves between the tiers, (hot entry, record) pairs: the entries and the
  // records of one list are distinct, so the workers copy them in parallel
  // (each prefetching its rows a few pairs ahead: the records are scattered).
  std::vector<std::pair<int64_t, uint32_t>> leave, enter;
  auto move_rows = [&](const std::vector<std::pair<int64_t, uint32_t>>& moves, bool to_hot) {
    constexpr int64_t kAhead = 8;
    pf(static_cast<int64_t>(moves.size()), 40 * row_floats, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (i + kAhead < end) {
          const char* ahead = reinterpret_cast<const char*>(Record(moves[i + kAhead].second));
          __builtin_prefetch(ahead, 1);
          __builtin_prefetch(ahead + record_bytes_ - 1, 1);
        }
        Header* h = Record(moves[i].second);
        float* hot = hot_.data() + moves[i].first * row_floats;
        if (to_hot) {
          std::memcpy(hot, ColdFloats(h), 4 * row_floats);
          h->hot = static_cast<int32_t>(moves[i].first);
        } else {
          std::memcpy(ColdFloats(h), hot, 4 * row_floats);
          h->hot = -1;
        }
      }
    });
  };
  if (incremental) {
    // Rows leaving the tier are written back; their entries, and any free
    // one, take the rows entering it, lowest entry first.
    std::vector<uint64_t> in((static_cast<size_t>(records) + 63) / 64, 0);
    for (const uint32_t r : chosen) in[r >> 6] |= uint64_t{1} << (r & 63);
    std::vector<int64_t> free_entries;
    for (int64_t e = 0; e < hot_rows; ++e) {
      const uint32_t r = hot_owner_[e];
      if (r != kEmpty) {
        if (in[r >> 6] >> (r & 63) & 1) {
          in[r >> 6] &= ~(uint64_t{1} << (r & 63));  // stays: nothing to copy in
          continue;
        }
        leave.emplace_back(e, r);
        hot_owner_[e] = kEmpty;
      }
      free_entries.push_back(e);
    }
    size_t next_free = 0;
    for (const uint32_t r : chosen) {
      if (!(in[r >> 6] >> (r & 63) & 1)) continue;  // already hot
      const int64_t e = free_entries[next_free++];
      hot_owner_[e] = r;
      enter.emplace_back(e, r);
    }
    move_rows(leave, false);  // before any entry is overwritten
    move_rows(enter, true);
    // Occupied entries must be [0, k) (MakeHotIfRoom hands out the ones after):
    // rows above k move down into the free entries below it.
    int64_t low = 0, high = hot_rows - 1;
    for (;;) {
      while (low < k && hot_owner_[low] != kEmpty) ++low;
      while (high >= k && hot_owner_[high] == kEmpty) --high;
      if (low >= k || high < k) break;
      std::memcpy(hot_.data() + low * row_floats, hot_.data() + high * row_floats, 4 * row_floats);
      hot_owner_[low] = hot_owner_[high];
      hot_owner_[high] = kEmpty;
      Record(hot_owner_[low])->hot = static_cast<int32_t>(low);
    }
  } else {
    for (int64_t e = 0; e < k; ++e) {
      hot_owner_[e] = chosen[e];
      enter.emplace_back(e, chosen[e]);
    }
    move_rows(enter, true);
  }
  hot_used_ = k;
  hot_phase_ = true;
  return decay < 1.f;
}

void Store::EndStep(const ParallelFor& pf) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  last_step_lookups_.store(step_lookups_.exchange(0));
  last_step_hits_.store(step_hits_.exchange(0));
  if (step_ >= config_.warmup_steps && step_ % config_.flush_every == 0) {
    const bool decayed = FlushLocked(pf, config_.count_decay);
    flushes_.fetch_add(1, std::memory_order_relaxed);
    if (config_.count_decay < 1.f && !decayed) {
      for (uint32_t r = 0; r < next_record_; ++r) {
        Header* h = Record(r);
        if (h->mark != kDead) h->count = static_cast<uint32_t>(h->count * config_.count_decay);
      }
    }
  }
  ++step_;
}

void Store::Flush(const ParallelFor& pf) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  FlushLocked(pf);
  flushes_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace hybrid_hash
}  // namespace hybridtf
