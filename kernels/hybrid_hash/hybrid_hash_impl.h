// TF-free implementation layer of HybridHash: a dynamic embedding table with
// a cold tier (hash map + row arena) and a hot tier (dense rows), driven by
// PICASSO's Algorithm 1.
//
// Storage
//   cold tier: an open-addressing (linear probing, backward-shift deletion)
//     hash map from any int64 id to a uint32 record index, and an arena of
//     fixed-size records allocated in chunks of kChunkRows records (no per-row
//     heap allocation). A record is contiguous:
//       [id int64][count uint32][hot int32][last_step uint32][mark uint32]
//       [row: dim floats][slot 0: dim floats]...[slot S-1: dim floats]
//   hot tier: a dense array of hot_rows entries of (1 + S) * dim floats, the
//     row and its optimizer slots together. A record with hot >= 0 lives in
//     hot entry `hot`: that copy is the authoritative one until the next
//     flush writes it back.
//
// Algorithm 1 (itr = the store's step, advanced by EndStep after each update)
//   * every training lookup adds the id's occurrences to its count
//     (FCounter); during warm-up (itr < warmup_steps) nothing is hot;
//   * EndStep(): if itr >= warmup_steps and itr % flush_every == 0, flush:
//     the top-k records by count (k = hot_rows, ties by smaller id, then
//     smaller member) become the hot tier, each row with its slots, so a
//     flush never changes a value. Rows that stay hot stay in their entries;
//     only the rows leaving are written back and only the ones entering are
//     copied in. The candidates are every record (an arena pass), or, with
//     count_decay 1 and no TTL, only the tier's rows and the records touched
//     since the last flush (touched_: no other record can outrank the tier)
//     when those are few; a count histogram finds the k-th count, and only
//     the candidates tied at it are ordered (a radix selection on the id). If
//     every row fits, every row becomes hot, and ids inserted later go to
//     free hot entries.
//   * after a flush counts are multiplied by count_decay (1 = never decay,
//     Algorithm 1 as published; < 1 lets the hot set follow drift).
//
// Initial rows depend only on (seed, id, initializer, element index): a
// counter-based hash (splitmix64) gives uniform bits, so a row is the same
// whatever the arrival order, batch or rank.
//
// Packed stores (PICASSO's packed HybridHash): a store may hold the rows of
// several tables ("members", Config::members), keyed by the pair (member, id)
// so that every int64 id of every member stays distinct (no bit packing).
// Each member keeps its own seed and initializer, so its rows are those of
// an unpacked table with that config. Members share the hot tier (top-k over
// all members), the step, the optimizer slots and the statistics. A packed
// record stores its member in 8 bytes after the header; unpacked stores keep
// the 24-byte header. Every API taking ids takes an optional members array
// (nullptr: member 0).
//
// Capacity (optional, 0 = unbounded): an insert into a full table first
// evicts max(needed, capacity / 32) records that are neither hot nor touched
// in the current step, least-frequent first ("lfu": count, then oldest) or
// least-recently-seen first ("lru"). With ttl_steps > 0, each flush also
// evicts rows not seen for more than ttl_steps steps. Every eviction is
// counted in Stats::evictions.
//
// Locking: one std::shared_mutex. Shared: lookups of present ids, sparse
// row updates (SGD, Adagrad, LazyAdam), stats. Exclusive: inserts,
// evictions, flushes, EndStep, dense Adam, slot layout changes, export
// (which writes the hot tier back first) and import. Under the shared lock
// the location of every row is fixed; the floats of one record are guarded
// by one of kStripes striped sequence locks (record index % kStripes, one
// cache line each): an update makes the stripe's sequence odd (a
// compare-and-swap from even: writers exclude each other), writes the row
// and makes it even again; a lookup copies the row between two reads of the
// sequence and copies again if it was odd or changed, so it never returns a
// row an update is half-way through, and it writes nothing shared to read
// (no lock line moves between readers). Counts and last steps, written
// under the shared lock by lookups only, are atomic (a saturating
// compare-and-swap, a relaxed store); statistics are atomic. The inserts of one training
// lookup run in parallel under the exclusive lock (lock-free linear probing
// within it, see hybrid_hash_lookup_impl.cc).
//
// Record hints: a training lookup may return each id's record (and hot entry)
// for the step's fused update. layout_epoch_ counts every exclusive change
// that can move a row or free a record (flush re-selection, relayout,
// eviction, import); the lookup keeps its exact (ids, members, hints) with the
// epoch they were taken in, and an update given exactly those, in the same
// epoch, uses them without reading any header (HintsProven); any other hint is
// checked on its record's header or probed (hybrid_hash_apply_impl.cc).
#ifndef HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_IMPL_H_
#define HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_IMPL_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"

namespace hybridtf {
namespace hybrid_hash {

// Cache-line (64-byte) aligned memory: the row arena's chunks and the hot
// tier start on a line, so a record header (24-32 bytes at a multiple of 8)
// and a hot entry of 64 bytes (dim 8 + one slot) span one line, not two.
constexpr size_t kLineBytes = 64;
inline void* AllocLines(size_t bytes) {
  return std::aligned_alloc(kLineBytes, (bytes + kLineBytes - 1) / kLineBytes * kLineBytes);
}
struct FreeLines {
  void operator()(char* p) const { std::free(p); }
};
using LineChunk = std::unique_ptr<char[], FreeLines>;
template <typename T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <typename U>
  LineAllocator(const LineAllocator<U>&) {}  // NOLINT: rebinding is implicit
  T* allocate(size_t n) {
    void* p = n ? AllocLines(n * sizeof(T)) : nullptr;
    if (n && p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  // resize() default-initializes (floats: not written), so a hot tier can be
  // sized without zeroing and faulting in entries that are written before
  // they are ever read (a flush's or a new row's copy).
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <typename U>
  bool operator==(const LineAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const LineAllocator<U>&) const {
    return false;
  }
};

enum class Initializer { kZeros, kConstant, kUniform, kNormal };
enum class EvictPolicy { kLfu, kLru };

bool ParseInitializer(const std::string& name, Initializer* out);
bool ParseEvictPolicy(const std::string& name, EvictPolicy* out);

constexpr int kMaxSlots = 2;
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxRows = (int64_t{1} << 31) - 1;

// How a member's new rows are initialized.
struct RowInit {
  uint64_t seed = 0;
  Initializer initializer = Initializer::kUniform;
  float init_a = -0.05f;
  float init_b = 0.05f;
};

constexpr int64_t kMaxMembers = int64_t{1} << 20;

struct Config {
  std::string name = "hybrid_hash";  // the table's name, used in every message
  int64_t dim = 0;
  int64_t hot_rows = 0;      // > 0
  int64_t capacity = 0;      // 0 = unbounded, else > 0
  int64_t warmup_steps = 0;  // >= 0
  int64_t flush_every = 1;   // > 0
  uint64_t seed = 0;
  Initializer initializer = Initializer::kUniform;
  float init_a = -0.05f;    // minval (uniform), mean (normal), value (constant)
  float init_b = 0.05f;     // maxval (uniform), stddev (normal)
  float count_decay = 1.f;  // in (0, 1]
  EvictPolicy evict_policy = EvictPolicy::kLfu;
  int64_t ttl_steps = 0;  // 0 = off
  // Packed store: one entry per member (the seed/initializer fields above are
  // then unused). Empty: one member, initialized by the fields above.
  std::vector<RowInit> members;
};

// The members' row initializers of a config (one entry when not packed).
std::vector<RowInit> MemberInits(const Config& config);

ImplStatus ValidateConfig(const Config& config);
// The first setting in which two configs differ ("hot_rows", "seed", ...); "" when equal.
std::string ConfigDifference(const Config& a, const Config& b);
// "HybridHash table '<name>'": how every error message names its table.
std::string Quoted(const Config& config);
// The splitmix64 finalizer: the map's slot hash and the initial rows' generator.
inline uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Fills rows[i * dim + c] with the initial row of ids[i] (no table needed).
void InitialRows(const Config& config, const int64_t* ids, int64_t n, float* rows);
void InitialRowsWith(const RowInit& init, int64_t dim, const int64_t* ids, int64_t n, float* rows);

// A record hint (Store::Lookup's records output, the fused updates' input):
// the record index in bits 0-31 and, for a row in the hot tier at lookup
// time, its hot entry + 1 in bits 32-62 (0: cold). The update trusts neither
// part: the record is used only if its header holds the expected key, and
// the hot entry only lets it prefetch the row together with the header (the
// row it updates is the one the header names).
inline int64_t RecordHint(uint32_t record, int32_t hot) {
  return static_cast<int64_t>(record) |
         (hot >= 0 ? static_cast<int64_t>(hot + int64_t{1}) << 32 : int64_t{0});
}

struct Stats {
  int64_t size = 0;         // rows stored
  int64_t hot_used = 0;     // rows in the hot tier
  int64_t hot_rows = 0;     // hot tier capacity
  int64_t inserts = 0;      // rows ever inserted
  int64_t evictions = 0;    // rows ever evicted
  int64_t lookups = 0;      // training lookups, distinct ids per call
  int64_t hits = 0;         // ... of them served by the hot tier
  int64_t occurrences = 0;  // training lookups weighted by counts
  int64_t occurrence_hits = 0;
  int64_t step = 0;
  int64_t flushes = 0;
  int64_t last_step_lookups = 0;  // distinct ids of the last completed step
  int64_t last_step_hits = 0;
  int64_t bytes = 0;      // cold tier: arena chunks + hash map + free list + kept hinted batch
  int64_t hot_bytes = 0;  // hot tier array + owners
  int64_t num_slots = 0;
};
constexpr int kNumStats = 16;
void StatsToArray(const Stats& stats, int64_t* out);  // kNumStats values, field order above

// An export: ids ascending, rows [n, dim], slots [n, num_slots, dim], counts.
struct Snapshot {
  std::vector<int64_t> ids;
  std::vector<int64_t> members;  // sorted by (member, id)
  std::vector<float> rows;
  std::vector<float> slots;
  std::vector<int64_t> counts;
  std::vector<float> slot_init;
  int64_t num_slots = 0;
  int64_t step = 0;
};

// Where an export writes, allocated by the caller once the row count is known:
// ids, members, counts [n]; rows [n, dim]; slots [n, num_slots, dim]; slot_init
// [num_slots]; step a scalar. A TF kernel points them at its output tensors, so
// an export holds no second copy of the table.
struct ExportBuffers {
  int64_t* ids = nullptr;
  int64_t* members = nullptr;
  float* rows = nullptr;
  float* slots = nullptr;
  int64_t* counts = nullptr;
  float* slot_init = nullptr;
  int64_t* step = nullptr;
};
// Called once, under the store's lock, with (n, num_slots); returns false to
// abandon the export (its allocation failed; nothing is written).
using ExportAllocator = std::function<bool(int64_t n, int64_t num_slots, ExportBuffers* out)>;

class Store {
 public:
  static ImplStatus Create(const Config& config, std::unique_ptr<Store>* out);
  ~Store();

  const Config& config() const { return config_; }
  int64_t dim() const { return config_.dim; }
  int num_slots() const { return num_slots_; }

  // Rows of ids (distinct or not) into out[n * dim]. insert: find-or-insert,
  // count frequencies (counts[i] occurrences, 1 each if counts is null) and
  // hit statistics (training); else a pure read that returns the initial row
  // of an absent id without inserting it.
  // records (optional, training only): each id's record hint (RecordHint),
  // which a fused update may take (it still checks the record's key, see below).
  ImplStatus Lookup(const int64_t* ids, const int64_t* counts, int64_t n, bool insert, float* out,
                    const ParallelFor& pf, const int64_t* members = nullptr,
                    int64_t* records = nullptr);
  int64_t num_members() const { return static_cast<int64_t>(inits_.size()); }
  // InvalidArgument unless every members[i] (if any) is a member index.
  ImplStatus CheckMembers(const int64_t* members, int64_t n) const;

  // Sets the optimizer slot layout (num_slots values of slot_init). A table
  // without slots gets them (existing rows are given slot_init). Slots that
  // came from an Import and were not updated since (a checkpoint of another
  // optimizer: fine-tuning with a new one) are replaced by fresh ones (rows
  // kept); *replaced (if given) tells.
  // Asking for a different layout than the one training used is an error.
  ImplStatus EnsureSlots(int num_slots, const float* slot_init, bool* replaced = nullptr);

  // Fused updates of distinct present ids with gradient rows grad[n * dim],
  // the same float operations as kernels/sparse_apply (Keras 2.15 exact).
  // records (optional): the record hint of each id, as Lookup returned it;
  // a hint that saves the hash-map probe and lets the header and row misses
  // overlap. A hint is used only if it names a
  // live record whose key is (members[i], ids[i]) (checked on the header the
  // update reads anyway); otherwise (a flush/eviction/import since the lookup,
  // or any bad value) the id is probed as without hints, so hints can never
  // change a result.
  ImplStatus ApplySgd(const int64_t* ids, const float* grad, int64_t n, float lr,
                      const ParallelFor& pf, const int64_t* members = nullptr,
                      const int64_t* records = nullptr);
  ImplStatus ApplyAdagrad(const int64_t* ids, const float* grad, int64_t n, float lr, float eps,
                          const ParallelFor& pf, const int64_t* members = nullptr,
                          const int64_t* records = nullptr);
  ImplStatus ApplyAdam(const int64_t* ids, const float* grad, int64_t n, float alpha, float c1,
                       float c2, float eps, bool lazy, const ParallelFor& pf,
                       const int64_t* members = nullptr, const int64_t* records = nullptr);
  // The data-free start of Keras Adam's sparse update alone, m += -m * c1 and
  // v += -v * c2 on every stored row (rows and counts unchanged): what the
  // plain model's step that finds the end of the data still runs. A table
  // without slots (no Adam update yet: zero moments) is left as it is.
  ImplStatus DecayAdamMoments(float c1, float c2, const ParallelFor& pf);

  // Ends a training step: Algorithm 1's flush check (L23-26), then step + 1.
  // (pf: the flush's workers.)
  void EndStep(const ParallelFor& pf = SequentialFor);
  // Forced flush: write back and re-select the top-k (also the warm-up's).
  void Flush(const ParallelFor& pf = SequentialFor);

  Stats GetStats() const;
  // The (member, id) keys of the rows in the hot tier, in entry order.
  void HotKeys(std::vector<int64_t>* ids, std::vector<int64_t>* members) const;
  // How many records the last re-selecting flush compared: every live record
  // (an arena pass), or the tier's rows and the records touched since the
  // flush before (see touched_).
  int64_t LastFlushCandidates() const;
  void Export(Snapshot* out);
  // The same export written straight into the allocator's buffers; false if it
  // abandoned the export.
  bool Export(const ExportAllocator& allocate);
  // Replaces the content. ids distinct; rows [n, dim]; slots [n, num_slots, dim].
  // members (nullptr: member 0) give each row's member. only_member >= 0
  // replaces that member's rows only (every members[i] must equal it) and
  // keeps the other members' rows.
  ImplStatus Import(const int64_t* ids, const float* rows, const float* slots,
                    const int64_t* counts, int64_t n, int64_t num_slots, const float* slot_init,
                    int64_t step, const int64_t* members = nullptr, int64_t only_member = -1);

 private:
  struct Header {
    int64_t id;
    uint32_t count;
    int32_t hot;
    uint32_t last_step;
    uint32_t mark;
  };
  static constexpr int64_t kChunkBits = 10;
  static constexpr int64_t kChunkRows = int64_t{1} << kChunkBits;
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
  static constexpr uint32_t kDead = 0xFFFFFFFFu;  // mark of a free record
  static constexpr int kStripes = 64;
  static constexpr int64_t kMinHotEntries = 1024;  // a growing hot tier's first size
  static constexpr int64_t kBlock = 32;            // ids probed together (FindBlock)
  static constexpr uint64_t kProbeAhead = 3;       // records prefetched per probe (FindBlock)

  explicit Store(const Config& config);
  int64_t RowFloats() const { return (1 + num_slots_) * config_.dim; }
  Header* Record(uint32_t index) const;
  int64_t RecordBytes() const {
    return (static_cast<int64_t>(sizeof(Header)) + key_bytes_ + 4 * RowFloats() + 7) / 8 * 8;
  }
  float* ColdFloats(Header* h) const {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(h + 1) + key_bytes_);
  }
  uint32_t MemberOf(const Header* h) const {
    return key_bytes_ ? *reinterpret_cast<const uint32_t*>(h + 1) : 0u;
  }
  float* Floats(Header* h) const;  // the authoritative copy (hot or cold)
  uint64_t Slot(uint32_t member, int64_t id) const;
  uint32_t Find(uint32_t member, int64_t id) const;  // record index or kEmpty
  // Find from the map slot Slot(member, id) already computed; *end (if not
  // null) gets the map slot where the probe stopped (for a miss: the first
  // empty slot of the key's probe sequence).
  uint32_t FindFrom(uint64_t slot, uint32_t member, int64_t id, uint64_t* end = nullptr) const;
  // Find of ids[begin, end) (at most kBlock) into out[0, end - begin): the map
  // slots, then the records they name, are prefetched for the whole block
  // before any is probed, so the block's cache misses overlap.
  // ends (optional): each id's FindFrom end slot, at ends[0, end - begin).
  void FindBlock(const int64_t* ids, const int64_t* members, int64_t begin, int64_t end,
                 uint32_t* out, uint64_t* ends = nullptr) const;
  // FindBlock guided by record hints (see ApplySgd): a hint naming a live
  // record with the key (member, id) is taken as is, the others are probed.
  void FindBlockHinted(const int64_t* ids, const int64_t* members, const int64_t* hints,
                       int64_t begin, int64_t end, uint32_t* out) const;
  // Prefetches the row floats (hot or cold) of record index.
  void PrefetchFloats(uint32_t index) const;
  // Inserts (member, id) (exclusive lock held) with the initial row `row`
  // (nullptr: computed here).
  ImplStatus Insert(uint32_t member, int64_t id, uint32_t* index, const float* row = nullptr);
  // A new record's header, key, row (row, or the initial row if nullptr) and slot_init.
  void WriteRecord(Header* h, uint32_t member, int64_t id, const float* row) const;
  // Gives a new record a free hot entry after a flush (everything fits).
  void MakeHotIfRoom(uint32_t index);
  // Grows the hot tier's arrays to min(entries, hot_rows) entries (exclusive
  // lock held); false (tier unchanged) if the memory cannot be had.
  bool GrowHotTier(int64_t entries);
  // Marks record index as counted since the last flush (see touched_).
  void Touch(uint32_t index) const {
    if (!tracking_) return;
    uint64_t* word = const_cast<uint64_t*>(touched_.data()) + (index >> 6);
    const uint64_t bit = uint64_t{1} << (index & 63);
    if ((__atomic_load_n(word, __ATOMIC_RELAXED) & bit) == 0) {
      __atomic_fetch_or(word, bit, __ATOMIC_RELAXED);
    }
  }
  bool Touched(uint32_t index) const { return touched_[index >> 6] >> (index & 63) & 1; }
  // The ids of one training lookup (hybrid_hash_lookup_impl.cc).
  struct LookupBatch {
    const int64_t* ids;
    const int64_t* counts;   // nullptr: 1 each
    const int64_t* members;  // nullptr: member 0
    float* out;              // the missing ids' rows hold their initial rows on entry
    int64_t* records;        // nullptr: not wanted
    // The shared pass's probe end of each missing id (by batch position), valid
    // while map_epoch_ == epoch (see InsertParallel); nullptr: none.
    const uint64_t* probe_ends;
    uint64_t epoch;
  };
  // The exclusive pass of a training lookup over batch positions `todo` (the
  // ids the shared pass did not find, ascending): InsertSerial one by one
  // (stores with a capacity: an insert may evict), InsertParallel in
  // kInsertParts parts by home map slot, each part inserted by one worker.
  ImplStatus InsertSerial(const std::vector<int64_t>& todo, const LookupBatch& b);
  ImplStatus InsertParallel(const std::vector<int64_t>& todo, const LookupBatch& b,
                            const ParallelFor& pf);
  static constexpr int kInsertPartBits = 6;
  void MapInsert(uint32_t member, int64_t id, uint32_t index);
  void MapErase(uint32_t member, int64_t id);
  static uint32_t M(const int64_t* members, int64_t i) {
    return members ? static_cast<uint32_t>(members[i]) : 0u;
  }
  // Doubles the map and re-inserts every record (exclusive lock held). pf's
  // workers: home slots from an arena pass, then the records grouped into
  // 2^kInsertPartBits parts by home slot, each part inserted by one worker
  // (claiming the first free slot with a compare-and-swap: keys are distinct,
  // so no key is compared and no header read).
  ImplStatus GrowMap(const ParallelFor& pf = SequentialFor);
  ImplStatus AllocRecord(uint32_t* index);
  ImplStatus EvictFor(int64_t needed);
  void EvictIndices(const std::vector<uint32_t>& victims);
  void WriteBackLocked();
  // The flush (exclusive lock held). Incremental when the tier has its size and no
  // TTL applies: rows staying hot stay in their entries; only the rows leaving
  // are written back and only the ones entering are copied in.
  // decay < 1: also multiplies every kept record's count by it once the
  // selection has read it (EndStep's count decay); returns whether it did.
  bool FlushLocked(const ParallelFor& pf = SequentialFor, float decay = 1.f);
  // The end of every flush: clears the touched bits; the tier is the top-k.
  void SelectionDone();
  // A flush's candidate: a record with its count and, if it is in the tier,
  // its entry (else -1). id: kUnknownId for a tier row the flush did not read
  // (its count is hot_count_), fetched only if the row's count is tied.
  struct Candidate {
    uint32_t count;
    uint32_t record;
    int64_t id;
    int32_t entry;
    bool id_known;
  };
  // The wanted-th (1-based) of tied[0, n) in the flush's order (count desc,
  // id asc, member asc); tied: candidates of one count bucket (one_count: of
  // one count) with known ids.
  Candidate CutoffOfTied(const Candidate* tied, int64_t n, int64_t wanted, bool one_count) const;
  // A flush reads only the tier and the touched records when they are fewer
  // than 1/kTouchedOnlyRatio of the records (random reads against a scan).
  static constexpr int64_t kTouchedOnlyRatio = 4;
  static constexpr int64_t kFlushBlocks = 16;  // the arena scan's blocks (fixed: deterministic)
  void RelayoutLocked(int num_slots, const float* slot_init);
  void ClearLocked();
  // The stripe sequence lock of record index (see Locking).
  struct alignas(64) StripeSeq {
    std::atomic<uint32_t> seq{0};
  };
  // Writer side: spins until the stripe is even, makes it odd; returns the even value.
  uint32_t LockStripe(uint32_t index) const {
    std::atomic<uint32_t>& seq = stripes_[index % kStripes].seq;
    for (int spins = 0;; ++spins) {
      uint32_t s = seq.load(std::memory_order_relaxed);
      if ((s & 1u) == 0 && seq.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                                     std::memory_order_relaxed)) {
        std::atomic_thread_fence(std::memory_order_release);  // the odd value before any row write
        return s;
      }
      if (spins > 64) std::this_thread::yield();
    }
  }
  void UnlockStripe(uint32_t index, uint32_t even) const {
    stripes_[index % kStripes].seq.store(even + 2, std::memory_order_release);
  }
  // Reader side: runs copy() until it ran while no writer held the stripe.
  template <typename Copy>
  void ReadStripe(uint32_t index, Copy&& copy) const {
    const std::atomic<uint32_t>& seq = stripes_[index % kStripes].seq;
    for (int spins = 0;; ++spins) {
      const uint32_t before = seq.load(std::memory_order_acquire);
      if ((before & 1u) == 0) {
        copy();
        std::atomic_thread_fence(std::memory_order_acquire);
        if (seq.load(std::memory_order_relaxed) == before) return;
      }
      if (spins > 64) std::this_thread::yield();
    }
  }
  // True if (ids, members, hints)[0, n) are exactly the last kept training
  // lookup's (hinted_) and no record moved or was freed since (layout_epoch_
  // unchanged): then every hint names its key's present record and the row
  // the lookup read. Shared lock held. False while a lookup is keeping its
  // batch (never waits for hinted_mu_).
  bool HintsProven(const int64_t* ids, const int64_t* members, const int64_t* hints,
                   int64_t n) const;
  template <typename RowFn>
  ImplStatus ApplyRows(const int64_t* ids, const int64_t* members, const int64_t* hints, int64_t n,
                       const char* what, const ParallelFor& pf, RowFn&& fn);

  Config config_;
  std::vector<RowInit> inits_;  // one per member
  int64_t key_bytes_ = 0;       // 8 in a packed store (the record's member), else 0
  int num_slots_ = 0;
  std::vector<float> slot_init_;
  // The slots came from an Import and no update has used them yet (EnsureSlots).
  std::atomic<bool> slots_imported_{false};
  int64_t record_bytes_ = 0;
  std::vector<LineChunk> chunks_;
  uint32_t next_record_ = 0;    // records [0, next_record_) were handed out
  std::vector<uint32_t> free_;  // dead records to reuse
  std::vector<uint32_t> map_;   // open addressing, kEmpty or record index
  // Bumped (exclusive lock held) by every change of map_: an insert, erase,
  // growth or clear. Equal epochs: no slot was filled or emptied in between.
  uint64_t map_epoch_ = 0;
  int64_t size_ = 0;
  std::vector<float, LineAllocator<float>> hot_;  // hot_rows * RowFloats()
  std::vector<uint32_t> hot_owner_;
  // Each hot entry's count as its last flush or MakeHotIfRoom read it: equal
  // to the owner's count while the owner is untouched (see touched_).
  std::vector<uint32_t> hot_count_;
  // Touched-only flushes (count_decay 1, no TTL: tracking_). One bit per
  // record slot of the arena, set by every training lookup that counts the
  // record (Touch: atomic, under the shared or the exclusive lock) and cleared
  // by each flush. touch_complete_: the bits hold every record counted since
  // a flush that left the hot tier the exact top-k (or every row), and no
  // count changed otherwise since (an import, relayout or clear resets it).
  // Then no untouched cold record can outrank a row of the tier, so the next
  // top-k is among the tier's rows and the touched records
  // (hybrid_hash_flush_impl.cc).
  std::vector<uint64_t> touched_;
  bool tracking_ = false;
  bool touch_complete_ = false;
  int64_t last_flush_candidates_ = 0;
  int64_t hot_used_ = 0;
  bool hot_phase_ = false;  // a flush happened: free hot entries take new rows
  uint32_t step_ = 0;
  uint32_t update_serial_ = 0;

  // Bumped (exclusive lock held) whenever a record's row may move or a record
  // may be freed: a flush that changes the hot tier, a relayout, an
  // eviction, an import. Equal epochs: a record hint taken in between still
  // names its key's record, and its hot part still says where the row is.
  uint64_t layout_epoch_ = 0;
  // The last training lookup that returned record hints: its ids, members and
  // hints, written by that lookup while it holds hinted_mu_ (taken with
  // try_lock on both sides: a lookup waiting for the exclusive lock must not
  // hold up an update holding the shared one).
  struct HintedBatch {
    std::vector<int64_t> ids, members, hints;
    bool packed = false;  // members given
    uint64_t epoch = 0;
    bool valid = false;
  };
  mutable std::mutex hinted_mu_;
  HintedBatch hinted_;
  std::atomic<int64_t> hinted_bytes_{0};  // hinted_'s vectors' capacity, for Stats::bytes

  mutable std::shared_mutex mu_;
  mutable StripeSeq stripes_[kStripes];
  std::atomic<int64_t> inserts_{0}, evictions_{0}, lookups_{0}, hits_{0}, occurrences_{0},
      occurrence_hits_{0}, flushes_{0}, step_lookups_{0}, step_hits_{0}, last_step_lookups_{0},
      last_step_hits_{0};
};

}  // namespace hybrid_hash
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_IMPL_H_
