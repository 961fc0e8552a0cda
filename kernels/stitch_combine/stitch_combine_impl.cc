// CPU implementation of the fused Stitch&Combine algorithm and its gradient.
// See stitch_combine_impl.h for the contract.
#include "kernels/stitch_combine/stitch_combine_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <type_traits>
#include <utility>

#include "kernels/common/checked_math.h"
#include "kernels/common/dispatch_dim.h"
#include "kernels/stitch_combine/stitch_rows.h"

namespace hybridtf {
namespace stitch_combine {

using rows::AddRow;
using rows::WriteRow;

namespace {

std::string Str(int64_t v) { return std::to_string(v); }

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

ImplStatus OutputDims(const std::vector<int64_t>& id_shape, int64_t rows, int64_t dim, int field,
                      std::vector<int64_t>* dims) {
  const std::string what = "id_shapes[" + std::to_string(field) + "]";
  int unknown = -1;
  int64_t known = 1;
  for (size_t i = 0; i < id_shape.size(); ++i) {
    const int64_t d = id_shape[i];
    if (d < 0) {
      if (d != -1 || unknown >= 0) {
        return ImplStatus::InvalidArgument(what + " may leave at most one dimension unknown (-1).");
      }
      unknown = static_cast<int>(i);
    } else if (!CheckedMul(known, d, &known)) {
      return ImplStatus::InvalidArgument(what + ": the product of its dimensions overflows int64.");
    }
  }
  *dims = id_shape;
  if (unknown >= 0) {
    if (known == 0 ? rows != 0 : rows % known != 0) {
      return ImplStatus::InvalidArgument(what + " cannot hold the field's " + Str(rows) +
                                         " ids; pass the shape of the ids that were looked up.");
    }
    (*dims)[unknown] = known == 0 ? 0 : rows / known;
  } else if (known != rows) {
    return ImplStatus::InvalidArgument(what + " holds " + Str(known) + " ids but the field has " +
                                       Str(rows) +
                                       "; pass the shape of the ids that were looked up.");
  }
  dims->push_back(dim);
  return ImplStatus();
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
  single_id_bags_.assign(num, 0);
  int64_t cursor = 0;
  for (int f = 0; f < num; ++f) {
    const int64_t size = field_sizes[f];
    if (size < 0) {
      return ImplStatus::InvalidArgument("field_sizes[" + Str(f) + "] = " + Str(size) +
                                         " is negative.");
    }
    const int64_t pos = pos_offset_.back();
    // pos <= num_positions (checked here for every earlier field), so the
    // fields' positions end inside inverse unless size says otherwise.
    if (size > num_positions - pos) {
      int64_t total = pos;  // the sum of all sizes, for the message, unless it overflows
      bool fits = true;
      for (int g = f; g < num && fits; ++g) {
        fits = field_sizes[g] >= 0 && CheckedAdd(total, field_sizes[g], &total);
      }
      if (!fits) {
        return ImplStatus::InvalidArgument(
            "field_sizes[" + Str(f) + "] = " + Str(size) + " runs past the " + Str(num_positions) +
            " entries of inverse (the earlier fields take " + Str(pos) +
            ") and the field_sizes do not sum to a valid int64; they must sum to the length "
            "of inverse.");
      }
      return ImplStatus::InvalidArgument("field_sizes sum to " + Str(total) +
                                         " positions but inverse has " + Str(num_positions) +
                                         " entries; every id must belong to exactly one field.");
    }
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
      bool single = true;
      for (int64_t b = 0; b < rows; ++b) {
        const int64_t length = segment_lengths[cursor + b];
        if (length < 0) {
          return ImplStatus::InvalidArgument("segment_lengths[" + Str(cursor + b) +
                                             "] = " + Str(length) + " is negative.");
        }
        // Checked: the lengths of a field must not wrap around to its size.
        if (length > size - (at - pos)) {
          int64_t total = at - pos;  // the field's lengths, for the message, unless they overflow
          bool fits = true;
          for (int64_t k = b; k < rows && fits; ++k) {
            fits = segment_lengths[cursor + k] >= 0 &&
                   CheckedAdd(total, segment_lengths[cursor + k], &total);
          }
          if (!fits) {
            return ImplStatus::InvalidArgument(
                "the bag lengths of field " + Str(f) + " (segment_lengths[" + Str(cursor + b) +
                "] = " + Str(length) +
                " onwards) do not sum to a valid int64; they must sum to "
                "field_sizes[" +
                Str(f) + "] = " + Str(size) + ".");
          }
          return ImplStatus::InvalidArgument("the bag lengths of field " + Str(f) + " sum to " +
                                             Str(total) + " but field_sizes[" + Str(f) +
                                             "] = " + Str(size) + ".");
        }
        at += length;
        bag_begin_.push_back(at);
        single = single && length == 1;
      }
      single_id_bags_[f] = single;
      cursor += rows;
      if (at - pos != size) {
        return ImplStatus::InvalidArgument("the bag lengths of field " + Str(f) + " sum to " +
                                           Str(at - pos) + " but field_sizes[" + Str(f) +
                                           "] = " + Str(size) + ".");
      }
    }
    pos_offset_.push_back(pos + size);  // <= num_positions: checked above
    int64_t row_end = 0;
    if (!CheckedAdd(row_offset_.back(), rows, &row_end)) {
      return ImplStatus::InvalidArgument("the output rows of fields 0.." + Str(f) +
                                         " overflow int64.");
    }
    row_offset_.push_back(row_end);
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
  if (combiners_[f] == Combiner::kNone || single_id_bags_[f]) {
    *begin = pos_offset_[f] + local;
    *end = *begin + 1;
    return;
  }
  *begin = bag_begin_[bag_index_[f] + local];
  *end = bag_begin_[bag_index_[f] + local + 1];
}

template <typename Idx>
ImplStatus ValidateInverse(const Idx* inverse, int64_t n, int64_t num_unique,
                           const ParallelFor& parallel_for) {
  // Branch-free passes over fixed chunks in parallel (they vectorize); the
  // first bad position is searched for only on failure.
  const uint64_t limit = static_cast<uint64_t>(std::max<int64_t>(num_unique, 0));
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<char> bad(static_cast<size_t>(chunks), 0);
  parallel_for(chunks, kChunk, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      bool any = false;
      for (int64_t i = c * kChunk, end = std::min(n, (c + 1) * kChunk); i < end; ++i) {
        any |= static_cast<uint64_t>(static_cast<int64_t>(inverse[i])) >= limit;
      }
      bad[c] = any;
    }
  });
  if (std::find(bad.begin(), bad.end(), 1) == bad.end()) return ImplStatus::Ok();
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
  DispatchDim(dim, [&](auto width) {
    constexpr int D = decltype(width)::value;
    auto work = [&](int64_t begin, int64_t end) {
      ForRows(layout, begin, end, [&](int f, int64_t r) {
        int64_t pb = 0, pe = 0;
        layout.Positions(f, r, &pb, &pe);
        WriteRow<D>(layout.row_combiner(f, weights != nullptr), rows, dim, inverse, weights, pb, pe,
                    outputs[f] + (r - layout.FirstRow(f)) * dim);
      });
    };
    parallel_for(layout.total_rows(), 4 * dim, work);
  });
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
  DispatchDim(dim, [&](auto width) {
    constexpr int D = decltype(width)::value;
    parallel_for(shards, n * (dim + 1) / shards + 1, [&](int64_t first_shard, int64_t end_shard) {
      const int64_t lo = num_unique * first_shard / shards;
      const int64_t hi = num_unique * end_shard / shards;
      for (int f = 0; f < layout.num_fields(); ++f) {
        const T* g_field = grads[f];
        const Combiner combiner = layout.row_combiner(f, weights != nullptr);
        const int64_t rows = layout.output_rows(f);
        if (combiner == Combiner::kNone) {
          int64_t pb = 0, pe = 0;
          if (rows == 0) continue;
          layout.Positions(f, layout.FirstRow(f), &pb, &pe);  // one-hot: row r is position pb + r
          const Idx* inv = inverse + pb;
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t u = static_cast<int64_t>(inv[r]);
            if (u < lo || u >= hi) continue;
            AddRow<D>(d_rows + u * dim, g_field + r * dim, dim);
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
              AddRow<D>(acc, g, dim);
            } else {
              for (int64_t c = 0; c < dim; ++c) acc[c] += (g[c] / denom) * w;
            }
          }
        }
      }
    });
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

template ImplStatus ValidateInverse<int32_t>(const int32_t*, int64_t, int64_t, const ParallelFor&);
template ImplStatus ValidateInverse<int64_t>(const int64_t*, int64_t, int64_t, const ParallelFor&);

}  // namespace stitch_combine
}  // namespace hybridtf
