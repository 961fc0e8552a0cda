// HybridHash's flush (Algorithm 1, L23-26): Store::EndStep, Store::Flush and
// the incremental top-k re-selection of the hot tier (Store::FlushLocked). See
// hybrid_hash_impl.h for the store, its tiers and its locking.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/hybrid_hash/hybrid_hash_impl.h"

namespace hybridtf {
namespace hybrid_hash {

namespace {

// A flush's scratch array, uninitialized: a freshly mapped array's pages are
// first touched by the workers that fill it, in parallel. (Transparent huge
// pages made first touching it cheaper on an idle machine, but a page fault
// that has to compact memory stalled a flush by tens of ms: not used.)
template <typename T>
class TransientArray {
 public:
  explicit TransientArray(int64_t n)
      : data_(n > 0 ? new T[static_cast<size_t>(n)] : nullptr), size_(n) {}
  T* data() { return data_.get(); }
  int64_t size() const { return size_; }
  void reset() {
    data_.reset();
    size_ = 0;
  }

 private:
  std::unique_ptr<T[]> data_;
  int64_t size_;
};

}  // namespace

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
    SelectionDone();
    return false;
  }
  ++layout_epoch_;  // rows move between the tiers
  const int64_t hot_rows = config_.hot_rows;
  const int64_t row_floats = RowFloats();
  // The tier is reused: the rows that stay hot stay in their entries; only the
  // rows that leave are written back and only the ones that enter are copied in.
  // (A TTL may evict hot rows, and the first flush or one after an import or a
  // relayout has no tier of the right size yet: those start from an empty tier.)
  const bool reuse = config_.ttl_steps == 0 &&
                     static_cast<int64_t>(hot_owner_.size()) == hot_rows &&
                     static_cast<int64_t>(hot_.size()) == hot_rows * row_floats;
  if (!reuse) {
    WriteBackLocked();
    for (size_t e = 0; e < hot_owner_.size(); ++e) {
      if (hot_owner_[e] != kEmpty) Record(hot_owner_[e])->hot = -1;
    }
    // As many entries as rows can be selected (k <= size_), not hot_rows up
    // front: a tier larger than the table grows with it (MakeHotIfRoom).
    const int64_t entries =
        std::min(hot_rows, std::max<int64_t>(size_ + size_ / 2, kMinHotEntries));
    hot_owner_.assign(static_cast<size_t>(entries), kEmpty);
    hot_count_.assign(static_cast<size_t>(entries), 0);
    hot_used_ = 0;
    // Entries are written before they are read (below or by MakeHotIfRoom), so
    // the tier is not zeroed: a free entry's pages are first touched when a
    // row takes it.
    hot_.resize(static_cast<size_t>(entries * row_floats));
  }
  const int64_t entries = static_cast<int64_t>(hot_owner_.size());  // >= min(hot_rows, size_)
  if (!reuse && config_.ttl_steps == 0 && size_ <= hot_rows) {
    // Every row fits (and none expires): the top-k is every live record, in
    // record order as below, so one pass over the arena copies them.
    int64_t e = 0;
    for (uint32_t r = 0; r < next_record_; ++r) {
      Header* h = Record(r);
      if (h->mark == kDead) continue;
      std::memcpy(hot_.data() + e * row_floats, ColdFloats(h), 4 * row_floats);
      h->hot = static_cast<int32_t>(e);
      hot_count_[e] = h->count;
      hot_owner_[e++] = r;
    }
    hot_used_ = e;
    hot_phase_ = true;
    SelectionDone();
    return false;
  }
  // The candidates: every live record (an arena pass in record order), or,
  // when the touched bits are complete (touched_only), the tier's rows and the
  // touched cold records: a record neither hot nor touched since the last
  // flush kept its count, and every row of the tier outranked it then and has
  // only gained since. That reads O(tier + touched) records instead of the
  // arena, at random: taken when they are few (kTouchedOnlyRatio).
  // The candidates go into fixed blocks (record, entry or bitmap ranges) of one
  // transient buffer with per-block histograms; every later list is built per
  // block and concatenated in block order, so the result, entry assignment
  // included, does not depend on the thread count.
  constexpr uint32_t kBuckets = 1u << 12;  // the last bucket holds every larger count
  auto bucket = [](uint32_t count) { return std::min(count, kBuckets - 1); };
  const int64_t records = next_record_;
  const int64_t blocks = kFlushBlocks;
  auto part = [blocks](int64_t total, int64_t b) { return total * b / blocks; };  // block b's start
  const int64_t words = (records + 63) / 64;
  // Block b's candidates go to [offset[b], offset[b + 1]) of one array.
  std::vector<int64_t> offset(static_cast<size_t>(2 * blocks + 1), 0);
  bool touched_only = false;
  if (reuse && touch_complete_ && decay == 1.f) {
    // Blocks [0, blocks): tier entries; [blocks, 2 * blocks): bitmap words.
    for (int64_t b = 0; b < blocks; ++b) {
      offset[b + 1] = offset[b] + part(entries, b + 1) - part(entries, b);
    }
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t bits = 0;
      for (int64_t w = part(words, b); w < part(words, b + 1); ++w) {
        bits += __builtin_popcountll(touched_[w]);
      }
      offset[blocks + b + 1] = offset[blocks + b] + bits;
    }
    touched_only = offset[2 * blocks] * kTouchedOnlyRatio <= records;
  }
  std::vector<int64_t> histograms(static_cast<size_t>(2 * blocks * kBuckets), 0);
  std::vector<std::vector<uint32_t>> stale(static_cast<size_t>(blocks));
  const bool ttl = config_.ttl_steps > 0;
  auto is_stale = [&](const Header* h) {
    return ttl && int64_t{step_} - h->last_step > config_.ttl_steps;
  };
  // Top-k by count, ties by smaller id, then smaller member: a strict total
  // order, so the set is unique. The k-th largest count's bucket t comes from
  // the histogram: every candidate above it is in, every one below it out,
  // and only t's are ordered (CutoffOfTied).
  int64_t n = 0, k = 0, above = 0;  // above: candidates in the buckets above t
  uint32_t t = 0;
  auto threshold = [&] {
    for (int64_t b = 0; b < blocks; ++b) {
      if (!stale[b].empty()) EvictIndices(stale[b]);  // never hot (the tier was emptied above)
      stale[b].clear();
    }
    std::vector<int64_t> histogram(kBuckets, 0);
    for (int64_t b = 0; b < 2 * blocks; ++b) {
      for (uint32_t i = 0; i < kBuckets; ++i) histogram[i] += histograms[b * kBuckets + i];
    }
    n = 0;
    for (uint32_t i = 0; i < kBuckets; ++i) n += histogram[i];
    k = std::min<int64_t>(hot_rows, n);
    if (k < n) {
      t = kBuckets - 1;
      while (above + histogram[t] < k) above += histogram[t--];
    }
  };
  // A small tier of a large arena: a first pass only counts (histograms), so
  // that the second keeps only the records that may be in (bucket >= t) and
  // the tier's rows, not every record.
  const bool two_pass = !touched_only && hot_rows * kTouchedOnlyRatio < records;
  if (two_pass) {
    std::vector<int64_t> tier(static_cast<size_t>(blocks), 0);
    pf(blocks, records / blocks * 10 + 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t* histogram = histograms.data() + b * kBuckets;
        for (int64_t r = part(records, b); r < part(records, b + 1); ++r) {
          const Header* h = Record(static_cast<uint32_t>(r));
          if (h->mark == kDead) continue;
          if (is_stale(h)) {
            stale[b].push_back(static_cast<uint32_t>(r));
            continue;
          }
          ++histogram[bucket(h->count)];
          if (h->hot >= 0) ++tier[b];
        }
      }
    });
    threshold();
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t kept = tier[b];
      for (uint32_t i = k < n ? t : 0; i < kBuckets; ++i) kept += histograms[b * kBuckets + i];
      offset[b + 1] = offset[b] + kept;
    }
    for (int64_t b = blocks; b < 2 * blocks; ++b) offset[b + 1] = offset[b];
  } else if (!touched_only) {
    for (int64_t b = 0; b < 2 * blocks; ++b) {
      offset[b + 1] = offset[b] + (b < blocks ? part(records, b + 1) - part(records, b) : 0);
    }
  }
  // The workers' tasks: the arena blocks, or the entry and bitmap blocks
  // interleaved (a worker taking a range of tasks gets some of each).
  const int64_t tasks = touched_only ? 2 * blocks : blocks;
  auto block_of = [&](int64_t task) { return touched_only ? task % 2 * blocks + task / 2 : task; };
  TransientArray<Candidate> cand(offset[2 * blocks]);
  last_flush_candidates_ = touched_only ? offset[2 * blocks] : size_;
  std::vector<int64_t> filled(static_cast<size_t>(2 * blocks), 0);
  constexpr int64_t kAhead = 8;  // records prefetched ahead of random reads
  pf(tasks, std::max<int64_t>(records, hot_rows) / blocks * 20 + 1, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = block_of(task);
      int64_t* histogram = histograms.data() + b * kBuckets;
      Candidate* out = cand.data() + offset[b];
      int64_t m = 0;
      auto add = [&](uint32_t count, uint32_t r, int64_t id, int32_t entry, bool id_known) {
        out[m++] = {count, r, id, entry, id_known};
        ++histogram[bucket(count)];
      };
      if (two_pass) {  // counted already; stale records were evicted
        for (int64_t r = part(records, b); r < part(records, b + 1); ++r) {
          Header* h = Record(static_cast<uint32_t>(r));
          if (h->mark == kDead) continue;
          if (k == n || bucket(h->count) >= t || h->hot >= 0) {
            out[m++] = {h->count, static_cast<uint32_t>(r), h->id, h->hot, true};
          }
          if (decay < 1.f) h->count = static_cast<uint32_t>(h->count * decay);
        }
      } else if (!touched_only) {
        for (int64_t r = part(records, b); r < part(records, b + 1); ++r) {
          Header* h = Record(static_cast<uint32_t>(r));
          if (h->mark == kDead) continue;
          if (is_stale(h)) {
            stale[b].push_back(static_cast<uint32_t>(r));
            continue;
          }
          add(h->count, static_cast<uint32_t>(r), h->id, h->hot, true);
          // EndStep's decay after the flush, done here: the selection has the count already
          if (decay < 1.f) h->count = static_cast<uint32_t>(h->count * decay);
        }
      } else if (b < blocks) {  // tier entries: only a touched owner's count changed
        const int64_t e0 = part(entries, b), e1 = part(entries, b + 1);
        for (int64_t e = e0; e < e1; ++e) {
          if (e + kAhead < e1) {
            const uint32_t ahead = hot_owner_[e + kAhead];
            if (ahead != kEmpty && Touched(ahead)) __builtin_prefetch(Record(ahead));
          }
          const uint32_t r = hot_owner_[e];
          if (r == kEmpty) continue;
          if (Touched(r)) {
            const Header* h = Record(r);
            add(h->count, r, h->id, static_cast<int32_t>(e), true);
          } else {
            add(hot_count_[e], r, 0, static_cast<int32_t>(e), false);
          }
        }
      } else {  // touched records outside the tier, in record order
        for (int64_t w = part(words, b - blocks); w < part(words, b - blocks + 1); ++w) {
          for (uint64_t bits = touched_[w]; bits != 0; bits &= bits - 1) {
            const uint32_t r = static_cast<uint32_t>(w * 64 + __builtin_ctzll(bits));
            const Header* h = Record(r);
            if (h->mark == kDead || h->hot >= 0) continue;  // freed, or a tier row (above)
            add(h->count, r, h->id, -1, true);
          }
        }
      }
      filled[b] = m;
    }
  });
  if (!two_pass) threshold();
  // Per block: the tier entries leaving and the cold candidates entering;
  // the tied ones move to the front of the block's range (in place), then
  // to the front of the buffer, in block order.
  std::vector<std::vector<std::pair<int64_t, uint32_t>>> leaving(
      static_cast<size_t>(2 * blocks + 1));
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> entering(
      static_cast<size_t>(2 * blocks + 1));
  std::vector<int64_t> tied(static_cast<size_t>(2 * blocks), 0);
  pf(tasks, offset[2 * blocks] / blocks * 4 + 1, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = block_of(task);
      Candidate* c = cand.data() + offset[b];
      int64_t m = 0;
      for (int64_t i = 0; i < filled[b]; ++i) {
        const uint32_t x = bucket(c[i].count);
        if (k < n && x == t) {
          if (i + kAhead < filled[b] && !c[i + kAhead].id_known) {
            __builtin_prefetch(Record(c[i + kAhead].record));
          }
          if (!c[i].id_known) c[i].id = Record(c[i].record)->id;
          c[m++] = c[i];  // m <= i
        } else if (k == n || x > t) {
          if (c[i].entry < 0) {
            entering[b].emplace_back(c[i].count, c[i].record);
          } else {
            hot_count_[c[i].entry] = c[i].count;  // stays
          }
        } else if (c[i].entry >= 0) {
          leaving[b].emplace_back(c[i].entry, c[i].record);
        }
      }
      tied[b] = m;
    }
  });
  int64_t num_tied = 0;
  for (int64_t b = 0; b < 2 * blocks; ++b) {  // offset[b] >= num_tied: moves down
    if (tied[b] > 0) {
      std::memmove(cand.data() + num_tied, cand.data() + offset[b], sizeof(Candidate) * tied[b]);
    }
    num_tied += tied[b];
  }
  const int64_t wanted = k - above;
  Candidate* ties = cand.data();
  if (num_tied > 0) {
    // The tied candidates up to the wanted-th in order are in: the rows of
    // the tier stay, the cold ones enter; the tier's others leave. Fixed
    // ranges, listed last.
    const Candidate cutoff = CutoffOfTied(ties, num_tied, wanted, t < kBuckets - 1);
    const uint32_t cutoff_member = MemberOf(Record(cutoff.record));
    auto is_in = [&](const Candidate& c) {
      if (c.count != cutoff.count) return c.count > cutoff.count;
      if (c.id != cutoff.id) return c.id < cutoff.id;
      return MemberOf(Record(c.record)) <= cutoff_member;
    };
    auto& leave_tied = leaving[2 * blocks];
    auto& enter_tied = entering[2 * blocks];
    std::vector<std::vector<std::pair<int64_t, uint32_t>>> leave_part(static_cast<size_t>(blocks));
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> enter_part(static_cast<size_t>(blocks));
    pf(blocks, num_tied / blocks * 4 + 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        for (int64_t j = part(num_tied, b); j < part(num_tied, b + 1); ++j) {
          const bool in = is_in(ties[j]);
          if (ties[j].entry < 0) {
            if (in) enter_part[b].emplace_back(ties[j].count, ties[j].record);
          } else if (in) {
            hot_count_[ties[j].entry] = ties[j].count;  // stays
          } else {
            leave_part[b].emplace_back(ties[j].entry, ties[j].record);
          }
        }
      }
    });
    for (const auto& v : leave_part) leave_tied.insert(leave_tied.end(), v.begin(), v.end());
    for (const auto& v : enter_part) enter_tied.insert(enter_tied.end(), v.begin(), v.end());
  }
  cand.reset();
  // Moves between the tiers, (hot entry, record) pairs: the entries and the
  // records of one list are distinct, so the workers copy them in parallel
  // (each prefetching its rows a few pairs ahead: the records are scattered).
  // Entering rows take the entries of the leaving ones, then the free ones,
  // lowest first.
  std::vector<std::pair<int64_t, uint32_t>> leave, enter;
  std::vector<uint32_t> enter_counts;
  for (const auto& v : leaving) leave.insert(leave.end(), v.begin(), v.end());
  size_t entering_rows = 0;
  for (const auto& v : entering) entering_rows += v.size();
  std::vector<int64_t> free_entries;
  free_entries.reserve(std::max(leave.size(), entering_rows));
  for (const auto& move : leave) free_entries.push_back(move.first);
  for (int64_t e = 0; e < entries && free_entries.size() < entering_rows; ++e) {
    if (hot_owner_[e] == kEmpty) free_entries.push_back(e);
  }
  enter.reserve(entering_rows);
  enter_counts.reserve(entering_rows);
  for (const auto& v : entering) {
    for (const auto& c : v) {
      enter.emplace_back(free_entries[enter.size()], c.second);
      enter_counts.push_back(c.first);
    }
  }
  auto move_rows = [&](const std::vector<std::pair<int64_t, uint32_t>>& moves, bool to_hot) {
    pf(static_cast<int64_t>(moves.size()), 40 * row_floats, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (i + kAhead < end) {
          const char* ahead = reinterpret_cast<const char*>(Record(moves[i + kAhead].second));
          __builtin_prefetch(ahead, 1);
          __builtin_prefetch(ahead + record_bytes_ - 1, 1);
        }
        const int64_t e = moves[i].first;
        Header* h = Record(moves[i].second);
        float* hot = hot_.data() + e * row_floats;
        if (to_hot) {
          std::memcpy(hot, ColdFloats(h), 4 * row_floats);
          h->hot = static_cast<int32_t>(e);
          hot_owner_[e] = moves[i].second;
          hot_count_[e] = enter_counts[i];
        } else {
          std::memcpy(ColdFloats(h), hot, 4 * row_floats);
          h->hot = -1;
          hot_owner_[e] = kEmpty;
        }
      }
    });
  };
  move_rows(leave, false);  // before any entry is overwritten
  move_rows(enter, true);
  // Occupied entries must be [0, k) (MakeHotIfRoom hands out the ones after):
  // rows above k move down into the free entries below it.
  int64_t low = 0, high = entries - 1;
  for (;;) {
    while (low < k && hot_owner_[low] != kEmpty) ++low;
    while (high >= k && hot_owner_[high] == kEmpty) --high;
    if (low >= k || high < k) break;
    std::memcpy(hot_.data() + low * row_floats, hot_.data() + high * row_floats, 4 * row_floats);
    hot_owner_[low] = hot_owner_[high];
    hot_count_[low] = hot_count_[high];
    hot_owner_[high] = kEmpty;
    Record(hot_owner_[low])->hot = static_cast<int32_t>(low);
  }
  hot_used_ = k;
  hot_phase_ = true;
  SelectionDone();
  return decay < 1.f;
}

Store::Candidate Store::CutoffOfTied(const Candidate* tied, int64_t n, int64_t wanted,
                                     bool one_count) const {
  auto first = [&](const Candidate& x, const Candidate& y) {
    if (x.count != y.count) return x.count > y.count;
    if (x.id != y.id) return x.id < y.id;
    return MemberOf(Record(x.record)) < MemberOf(Record(y.record));  // a packed store's same id
  };
  std::vector<Candidate> rest;  // the candidates still in question (after the first narrowing)
  const Candidate* from = tied;
  int64_t size = n;
  if (one_count) {
    // One count: the smallest ids are in. A radix selection, 16 bits at a
    // time from the top: the ids below the wanted one's digit are in, the
    // ones above it out, and only those sharing its digits go on.
    std::vector<int64_t> digits(1 << 16);
    for (int shift = 48; shift >= 0 && size > 1; shift -= 16) {
      auto digit = [shift](const Candidate& c) {
        return static_cast<uint32_t>(
            ((static_cast<uint64_t>(c.id) ^ (uint64_t{1} << 63)) >> shift) & 0xFFFF);
      };
      std::fill(digits.begin(), digits.end(), 0);
      for (int64_t j = 0; j < size; ++j) ++digits[digit(from[j])];
      uint32_t d = 0;
      int64_t below = 0;
      while (below + digits[d] < wanted) below += digits[d++];
      std::vector<Candidate> same;
      same.reserve(static_cast<size_t>(digits[d]));
      for (int64_t j = 0; j < size; ++j) {
        if (digit(from[j]) == d) same.push_back(from[j]);
      }
      rest.swap(same);
      from = rest.data();
      size = static_cast<int64_t>(rest.size());
      wanted -= below;
    }
  }
  if (from != rest.data()) rest.assign(from, from + size);
  // What is left: counts above the last bucket, or one id in several members.
  std::nth_element(rest.begin(), rest.begin() + (wanted - 1), rest.end(), first);
  return rest[wanted - 1];
}

void Store::HotKeys(std::vector<int64_t>* ids, std::vector<int64_t>* members) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  ids->clear();
  members->clear();
  for (const uint32_t r : hot_owner_) {
    if (r == kEmpty) continue;
    ids->push_back(Record(r)->id);
    members->push_back(MemberOf(Record(r)));
  }
}

int64_t Store::LastFlushCandidates() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return last_flush_candidates_;
}

void Store::SelectionDone() {
  std::fill(touched_.begin(), touched_.end(), 0);
  touch_complete_ = tracking_;
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
