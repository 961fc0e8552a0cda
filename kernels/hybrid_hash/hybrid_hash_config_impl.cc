// Configuration of a HybridHash store: initializer and eviction-policy names,
// validation, the members' deterministic initial rows (a function of seed, id
// and initializer only) and the statistics array. See hybrid_hash_impl.h.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/hybrid_hash/hybrid_hash_impl.h"

namespace hybridtf {
namespace hybrid_hash {

std::string Quoted(const Config& c) { return "HybridHash table '" + c.name + "'"; }

bool ParseInitializer(const std::string& name, Initializer* out) {
  if (name == "zeros")
    *out = Initializer::kZeros;
  else if (name == "constant")
    *out = Initializer::kConstant;
  else if (name == "uniform")
    *out = Initializer::kUniform;
  else if (name == "normal")
    *out = Initializer::kNormal;
  else
    return false;
  return true;
}

bool ParseEvictPolicy(const std::string& name, EvictPolicy* out) {
  if (name == "lfu")
    *out = EvictPolicy::kLfu;
  else if (name == "lru")
    *out = EvictPolicy::kLru;
  else
    return false;
  return true;
}

ImplStatus ValidateConfig(const Config& c) {
  const std::string t = Quoted(c);
  if (c.dim < 1 || c.dim > kMaxDim) {
    return ImplStatus::InvalidArgument(t + ": output_dim must be in [1, " +
                                       std::to_string(kMaxDim) + "], got " + std::to_string(c.dim) +
                                       ".");
  }
  if (c.hot_rows < 1 || c.hot_rows > kMaxRows) {
    return ImplStatus::InvalidArgument(
        t + ": hot_rows must be in [1, " + std::to_string(kMaxRows) + "], got " +
        std::to_string(c.hot_rows) +
        ". Pass the number of rows the hot tier holds (e.g. 10-20% of the distinct ids).");
  }
  if (c.capacity < 0 || c.capacity > kMaxRows) {
    return ImplStatus::InvalidArgument(
        t + ": capacity must be 0 (unbounded) or a row count in [1, " + std::to_string(kMaxRows) +
        "], got " + std::to_string(c.capacity) + ".");
  }
  if (c.warmup_steps < 0 || c.warmup_steps > 0xFFFFFFFFll) {
    return ImplStatus::InvalidArgument(t + ": warmup_steps must be in [0, 4294967295] (steps are " +
                                       "counted in 32 bits), got " +
                                       std::to_string(c.warmup_steps) + ".");
  }
  if (c.flush_every < 1 || c.flush_every > 0xFFFFFFFFll) {
    return ImplStatus::InvalidArgument(t + ": flush_every must be in [1, 4294967295] (steps are " +
                                       "counted in 32 bits), got " + std::to_string(c.flush_every) +
                                       ".");
  }
  if (!(c.count_decay > 0.f && c.count_decay <= 1.f)) {
    return ImplStatus::InvalidArgument(t + ": count_decay must be in (0, 1], got " +
                                       std::to_string(c.count_decay) + ".");
  }
  if (c.ttl_steps < 0) {
    return ImplStatus::InvalidArgument(t + ": ttl_steps must be >= 0 (0 = off), got " +
                                       std::to_string(c.ttl_steps) + ".");
  }
  if (static_cast<int64_t>(c.members.size()) > kMaxMembers) {
    return ImplStatus::InvalidArgument(t + ": a packed store holds at most " +
                                       std::to_string(kMaxMembers) + " tables, got " +
                                       std::to_string(c.members.size()) + ". Split the group.");
  }
  const std::vector<RowInit> inits = MemberInits(c);
  for (size_t m = 0; m < inits.size(); ++m) {
    const std::string who = c.members.empty() ? t : t + " member " + std::to_string(m);
    if (!std::isfinite(inits[m].init_a) || !std::isfinite(inits[m].init_b)) {
      return ImplStatus::InvalidArgument(
          who + ": the initializer's parameters must be finite (they would give rows of inf or " +
          "NaN); check the embeddings_initializer's mean, stddev, minval, maxval or value.");
    }
    if (inits[m].initializer == Initializer::kUniform && !(inits[m].init_a < inits[m].init_b)) {
      return ImplStatus::InvalidArgument(who + ": a uniform initializer needs minval < maxval.");
    }
    if (inits[m].initializer == Initializer::kNormal && !(inits[m].init_b > 0.f)) {
      return ImplStatus::InvalidArgument(who + ": a normal initializer needs stddev > 0.");
    }
  }
  return ImplStatus::Ok();
}

std::string ConfigDifference(const Config& a, const Config& b) {
  if (a.name != b.name) return "name";
  if (a.dim != b.dim) return "dim";
  if (a.hot_rows != b.hot_rows) return "hot_rows";
  if (a.capacity != b.capacity) return "capacity";
  if (a.warmup_steps != b.warmup_steps) return "warmup_steps";
  if (a.flush_every != b.flush_every) return "flush_every";
  if (a.count_decay != b.count_decay) return "count_decay";
  if (a.evict_policy != b.evict_policy) return "evict_policy";
  if (a.ttl_steps != b.ttl_steps) return "ttl_steps";
  if (a.members.size() != b.members.size()) return "number of packed tables";
  const std::vector<RowInit> x = MemberInits(a), y = MemberInits(b);
  for (size_t m = 0; m < x.size(); ++m) {
    if (x[m].seed != y[m].seed) return "seed";
    if (x[m].initializer != y[m].initializer || x[m].init_a != y[m].init_a ||
        x[m].init_b != y[m].init_b) {
      return "initializer";
    }
  }
  return "";
}

std::vector<RowInit> MemberInits(const Config& c) {
  if (!c.members.empty()) return c.members;
  RowInit init;
  init.seed = c.seed;
  init.initializer = c.initializer;
  init.init_a = c.init_a;
  init.init_b = c.init_b;
  return {init};
}

void InitialRows(const Config& config, const int64_t* ids, int64_t n, float* rows) {
  InitialRowsWith(MemberInits(config)[0], config.dim, ids, n, rows);
}

void InitialRowsWith(const RowInit& config, int64_t dim, const int64_t* ids, int64_t n,
                     float* rows) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = rows + i * dim;
    const uint64_t base = Mix(config.seed ^ Mix(static_cast<uint64_t>(ids[i])));
    for (int64_t c = 0; c < dim; ++c) {
      const uint64_t x = Mix(base + static_cast<uint64_t>(c));
      switch (config.initializer) {
        case Initializer::kZeros:
          row[c] = 0.f;
          break;
        case Initializer::kConstant:
          row[c] = config.init_a;
          break;
        case Initializer::kUniform: {
          const double u = static_cast<double>(x >> 40) * (1.0 / 16777216.0);
          row[c] = static_cast<float>(config.init_a + (double{config.init_b} - config.init_a) * u);
          break;
        }
        case Initializer::kNormal: {
          const double u1 = static_cast<double>((x >> 40) + 1) * (1.0 / 16777216.0);
          const double u2 = static_cast<double>((x >> 16) & 0xFFFFFF) * (1.0 / 16777216.0);
          const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
          row[c] = static_cast<float>(config.init_a + double{config.init_b} * z);
          break;
        }
      }
    }
  }
}

void StatsToArray(const Stats& s, int64_t* out) {
  const int64_t values[kNumStats] = {s.size,           s.hot_used,    s.hot_rows,
                                     s.inserts,        s.evictions,   s.lookups,
                                     s.hits,           s.occurrences, s.occurrence_hits,
                                     s.step,           s.flushes,     s.last_step_lookups,
                                     s.last_step_hits, s.bytes,       s.hot_bytes,
                                     s.num_slots};
  std::memcpy(out, values, sizeof(values));
}

}  // namespace hybrid_hash
}  // namespace hybridtf
