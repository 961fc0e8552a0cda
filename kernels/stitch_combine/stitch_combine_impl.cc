// CPU implementation of the fused Stitch&Combine algorithm and its gradient.
// See stitch_combine_impl.h for the contract.
#include "kernels/stitch_combine/stitch_combine_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace hybridtf {
namespace stitch_combine {

namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// Denominator of a bag's combiner over positions [begin, end); 0 means the
// bag's output (and gradient) is zero.
template <typename T>
T Denominator(Combiner combiner, const T* weights, int64_t begin, int64_t end) {
  if (combiner == Combiner::kNone || combiner == Combiner::kSum) return T(1);
  T total = T(0);
  for (int64_t i = begin; i < end; ++i) {
    const T w = weights ? weights[i] : T(1);
    total += combiner == Combiner::kMean ? w : w * w;
  }
  return combiner == Combiner::kSqrtn ? std::sqrt(total) : total;
}

// Visits the global output rows [begin, end) in order with their field.
template <typename Fn>
void ForRows(const Layout& layout, int64_t begin, int64_t end, Fn fn) {
  if (begin >= end) return;
  int f = layout.FieldOfRow(begin);
  for (int64_t r = begin; r < end; ++r) {
    while (r >= layout.FirstRow(f + 1)) ++f;
    fn(f, r);
  }
}

}  // namespace

bool ParseCombiner(const std::string& name, Combiner* combiner) {
  static const struct {
    const char* name;
    Combiner value;
  } kNames[] = {{"none", Combiner::kNone},
                {"sum", Combiner::kSum},
                {"mean", Combiner::kMean},
                {"sqrtn", Combiner::kSqrtn}};
  for (const auto& entry : kNames) {
    if (name == entry.name) {
      *combiner = entry.value;
      return true;
    }
  }
  return false;
}

ImplStatus Layout::Build(const std::vector<Combiner>& combiners, const int64_t* field_sizes,
                         const int64_t* field_segments, const int64_t* segment_lengths,
                         int64_t num_segment_lengths, int64_t num_positions) {
  const int num = static_cast<int>(combiners.size());
  combiners_ = combiners;
  num_positions_ = num_positions;
  row_offset_.assign(1, 0);
  pos_offset_.assign(1, 0);
  bag_index_.assign(num, -1);
  bag_begin_.clear();
  int64_t cursor = 0;
  for (int f = 0; f < num; ++f) {
    const int64_t size = field_sizes[f];
    if (size < 0) {
      return ImplStatus::InvalidArgument("field_sizes[" + Str(f) + "] = " + Str(size) +
                                         " is negative.");
    }
    const int64_t pos = pos_offset_.back();
    int64_t rows = size;
    if (combiners[f] != Combiner::kNone) {
      rows = field_segments[f];
      if (rows < 0 || rows > num_segment_lengths - cursor) {
        return ImplStatus::InvalidArgument(
            "field " + Str(f) + " has " + Str(rows) + " bags (field_segments[" + Str(f) +
            "]) but only " + Str(num_segment_lengths - cursor) +
            " segment_lengths are left; pass one length per bag of every bag field.");
      }
      bag_index_[f] = static_cast<int64_t>(bag_begin_.size());
      int64_t at = pos;
      bag_begin_.push_back(at);
      for (int64_t b = 0; b < rows; ++b) {
        const int64_t length = segment_lengths[cursor + b];
        if (length < 0) {
          return ImplStatus::InvalidArgument("segment_lengths[" + Str(cursor + b) +
                                             "] = " + Str(length) + " is negative.");
        }
        at += length;
        bag_begin_.push_back(at);
      }
      cursor += rows;
      if (at - pos != size) {
        return ImplStatus::InvalidArgument("the bag lengths of field " + Str(f) + " sum to " +
                                           Str(at - pos) + " but field_sizes[" + Str(f) +
                                           "] = " + Str(size) + ".");
      }
    }
    pos_offset_.push_back(pos + size);
    row_offset_.push_back(row_offset_.back() + rows);
  }
  if (pos_offset_.back() != num_positions) {
    return ImplStatus::InvalidArgument("field_sizes sum to " + Str(pos_offset_.back()) +
                                       " positions but inverse has " + Str(num_positions) +
                                       " entries; every id must belong to exactly one field.");
  }
  if (cursor != num_segment_lengths) {
    return ImplStatus::InvalidArgument("segment_lengths has " + Str(num_segment_lengths) +
                                       " entries but the bag fields use " + Str(cursor) + ".");
  }
  return ImplStatus::Ok();
}

int Layout::FieldOfRow(int64_t r) const {
  const auto it = std::upper_bound(row_offset_.begin() + 1, row_offset_.end(), r);
  return static_cast<int>(it - (row_offset_.begin() + 1));
}

void Layout::Positions(int f, int64_t r, int64_t* begin, int64_t* end) const {
  const int64_t local = r - row_offset_[f];
  if (combiners_[f] == Combiner::kNone) {
    *begin = pos_offset_[f] + local;
    *end = *begin + 1;
    return;
  }
  *begin = bag_begin_[bag_index_[f] + local];
  *end = bag_begin_[bag_index_[f] + local + 1];
}

template <typename Idx>
ImplStatus ValidateInverse(const Idx* inverse, int64_t n, int64_t num_unique) {
  for (int64_t i = 0; i < n; ++i) {
    if (inverse[i] < 0 || static_cast<int64_t>(inverse[i]) >= num_unique) {
      return ImplStatus::InvalidArgument(
          "inverse[" + Str(i) + "] = " + Str(static_cast<int64_t>(inverse[i])) +
          " is out of range [0, " + Str(num_unique) +
          ") of the gathered rows; pass the inverse index that unique_partition returned "
          "for these rows.");
    }
  }
  return ImplStatus::Ok();
}

template <typename T, typename Idx>
void Forward(const Layout& layout, const T* rows, int64_t dim, const Idx* inverse, const T* weights,
             T* const* outputs, const ParallelFor& parallel_for) {
  auto work = [&](int64_t begin, int64_t end) {
    ForRows(layout, begin, end, [&](int f, int64_t r) {
      int64_t pb = 0, pe = 0;
      layout.Positions(f, r, &pb, &pe);
      T* out = outputs[f] + (r - layout.FirstRow(f)) * dim;
      const Combiner combiner = layout.combiner(f);
      if (combiner == Combiner::kNone) {
        std::memcpy(out, rows + static_cast<int64_t>(inverse[pb]) * dim, dim * sizeof(T));
        return;
      }
      std::fill(out, out + dim, T(0));
      const T denom = Denominator(combiner, weights, pb, pe);
      if (pe == pb || denom == T(0)) return;
      for (int64_t i = pb; i < pe; ++i) {
        const T* src = rows + static_cast<int64_t>(inverse[i]) * dim;
        if (weights) {
          const T w = weights[i];
          for (int64_t c = 0; c < dim; ++c) out[c] += w * src[c];
        } else {
          for (int64_t c = 0; c < dim; ++c) out[c] += src[c];
        }
      }
      if (combiner != Combiner::kSum) {
        for (int64_t c = 0; c < dim; ++c) out[c] /= denom;
      }
    });
  };
  parallel_for(layout.total_rows(), 4 * dim, work);
}

template <typename T, typename Idx>
void Backward(const Layout& layout, const T* const* grads, int64_t dim, const Idx* inverse,
              const T* weights, int64_t num_unique, T* d_rows, const ParallelFor& parallel_for) {
  // Shard the unique rows into contiguous ranges; every shard walks all
  // positions in ascending order (field by field, row by row) and adds the
  // contributions that land in its range. Each d_rows[u] is therefore summed
  // in ascending position order whatever the number of shards, with no
  // per-position temporaries.
  std::fill(d_rows, d_rows + num_unique * dim, T(0));
  const int64_t n = layout.num_positions();
  const int64_t shards = std::max<int64_t>(1, std::min<int64_t>(num_unique, n / 65536 + 1));
  parallel_for(shards, n * (dim + 1) / shards + 1, [&](int64_t first_shard, int64_t end_shard) {
    const int64_t lo = num_unique * first_shard / shards;
    const int64_t hi = num_unique * end_shard / shards;
    for (int f = 0; f < layout.num_fields(); ++f) {
      const Combiner combiner = layout.combiner(f);
      const int64_t rows = layout.output_rows(f);
      const T* g_field = grads[f];
      if (combiner == Combiner::kNone) {
        int64_t pb = 0, pe = 0;
        if (rows == 0) continue;
        layout.Positions(f, layout.FirstRow(f), &pb, &pe);  // one-hot: row r is position pb + r
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t u = static_cast<int64_t>(inverse[pb + r]);
          if (u < lo || u >= hi) continue;
          const T* g = g_field + r * dim;
          T* acc = d_rows + u * dim;
          for (int64_t c = 0; c < dim; ++c) acc[c] += g[c];
        }
        continue;
      }
      const int64_t row0 = layout.FirstRow(f);
      for (int64_t r = 0; r < rows; ++r) {
        int64_t pb = 0, pe = 0;
        layout.Positions(f, row0 + r, &pb, &pe);
        const T denom = Denominator(combiner, weights, pb, pe);
        if (denom == T(0)) continue;
        const T* g = g_field + r * dim;
        for (int64_t i = pb; i < pe; ++i) {
          const int64_t u = static_cast<int64_t>(inverse[i]);
          if (u < lo || u >= hi) continue;
          T* acc = d_rows + u * dim;
          const T w = weights ? weights[i] : T(1);
          if (denom == T(1) && w == T(1)) {
            for (int64_t c = 0; c < dim; ++c) acc[c] += g[c];
          } else {
            for (int64_t c = 0; c < dim; ++c) acc[c] += (g[c] / denom) * w;
          }
        }
      }
    }
  });
}

#define HYBRIDTF_INSTANTIATE(T, Idx)                                                               \
  template void Forward<T, Idx>(const Layout&, const T*, int64_t, const Idx*, const T*, T* const*, \
                                const ParallelFor&);                                               \
  template void Backward<T, Idx>(const Layout&, const T* const*, int64_t, const Idx*, const T*,    \
                                 int64_t, T*, const ParallelFor&);

HYBRIDTF_INSTANTIATE(float, int32_t)
HYBRIDTF_INSTANTIATE(float, int64_t)
HYBRIDTF_INSTANTIATE(double, int32_t)
HYBRIDTF_INSTANTIATE(double, int64_t)
#undef HYBRIDTF_INSTANTIATE

template ImplStatus ValidateInverse<int32_t>(const int32_t*, int64_t, int64_t);
template ImplStatus ValidateInverse<int64_t>(const int64_t*, int64_t, int64_t);

}  // namespace stitch_combine
}  // namespace hybridtf
