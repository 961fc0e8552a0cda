// pybind11 bindings of the TF-free pack_ids, stitch_combine and unique_subset
// layers (part of module hybridtf._native, registered by native_module.cc).
// Dtype rules match the TF ops: ids int32/int64, rows float32/float64, the
// layout vectors integers (cast to int64); anything else raises TypeError.
// Bad values raise ValueError with the kernels' messages.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/checked_math.h"
#include "kernels/pack_ids/pack_ids_impl.h"
#include "kernels/python/native_common.h"
#include "kernels/stitch_combine/stitch_combine_impl.h"
#include "kernels/unique_partition/unique_subset_impl.h"

namespace py = pybind11;

namespace hybridtf {
namespace {

// An integer array (any integer dtype, any rank) as a flat int64 vector.
std::vector<int64_t> Int64Vector(const py::handle& obj, const char* what) {
  py::array arr = py::array::ensure(obj);
  if (!arr) throw py::type_error(std::string(what) + " must be an integer array.");
  if (arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u') {
    throw py::type_error(std::string(what) + " must be integers, got dtype " +
                         std::string(py::str(arr.dtype())) + ".");
  }
  if (arr.ndim() > 1) {
    throw py::value_error(std::string(what) + " must be a vector, got " +
                          std::to_string(arr.ndim()) + " dimensions.");
  }
  if (arr.dtype().kind() == 'u' && arr.itemsize() == 8) {
    auto u = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    for (py::ssize_t i = 0; i < u.size(); ++i) {
      if (u.data()[i] > static_cast<uint64_t>(kInt64Max)) {
        throw py::value_error(std::string(what) + "[" + std::to_string(i) +
                              "] = " + std::to_string(u.data()[i]) + " does not fit int64.");
      }
    }
  }
  auto a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
  return std::vector<int64_t>(a.data(), a.data() + a.size());
}

// ---- pack_ids --------------------------------------------------------------

template <typename Id>
ImplStatus PackOne(const py::array& ids, int64_t offset, int64_t rows, const std::string& table,
                   bool count, int64_t* out, int64_t* invalid) {
  auto a = py::array_t<Id, py::array::c_style>::ensure(ids);
  if (!a) throw py::type_error("ids of table '" + table + "' must be a native-endian array.");
  const int64_t n = a.size();
  py::gil_scoped_release release;  // the GIL is back before `a` is destroyed
  if (count) {
    *invalid = pack_ids::PackFieldCounting(a.data(), n, offset, rows, out);
    return ImplStatus::Ok();
  }
  *invalid = 0;
  return pack_ids::PackField(a.data(), n, offset, rows, table, out);
}

py::tuple PackIdsPy(const py::list& ids, const std::vector<int64_t>& row_offsets,
                    const std::vector<int64_t>& num_rows,
                    const std::vector<std::string>& table_names, const std::string& on_invalid) {
  const size_t n = ids.size();
  if (n == 0) throw py::value_error("pack_ids needs at least one field.");
  if (row_offsets.size() != n || num_rows.size() != n || table_names.size() != n) {
    throw py::value_error("pack_ids got " + std::to_string(n) + " id arrays but " +
                          std::to_string(row_offsets.size()) + " row_offsets, " +
                          std::to_string(num_rows.size()) + " num_rows and " +
                          std::to_string(table_names.size()) +
                          " table_names; give one of each per field.");
  }
  if (on_invalid != "error" && on_invalid != "count") {
    throw py::value_error("on_invalid must be 'error' or 'count', got '" + on_invalid + "'.");
  }
  std::vector<py::array> arrays;
  int64_t total = 0;
  for (size_t f = 0; f < n; ++f) {
    ThrowIfError(pack_ids::ValidateTable(row_offsets[f], num_rows[f], table_names[f]));
    py::array a = py::array::ensure(ids[f]);
    if (!a) throw py::type_error("ids of table '" + table_names[f] + "' must be an array.");
    CheckIdDtype(a, ("ids of table '" + table_names[f] + "'").c_str());
    arrays.push_back(a);
    total += a.size();
  }
  py::array_t<int64_t> packed(total), sizes(n), invalid(n);
  int64_t at = 0;
  for (size_t f = 0; f < n; ++f) {
    const bool narrow = arrays[f].itemsize() == 4;
    int64_t* out = packed.mutable_data() + at;
    int64_t* inv = invalid.mutable_data() + f;
    const bool count = on_invalid == "count";
    ThrowIfError(narrow ? PackOne<int32_t>(arrays[f], row_offsets[f], num_rows[f], table_names[f],
                                           count, out, inv)
                        : PackOne<int64_t>(arrays[f], row_offsets[f], num_rows[f], table_names[f],
                                           count, out, inv));
    sizes.mutable_data()[f] = arrays[f].size();
    at += arrays[f].size();
  }
  return py::make_tuple(packed, sizes, invalid);
}

// ---- stitch_combine ----------------------------------------------------------

struct StitchArgs {
  std::vector<stitch_combine::Combiner> combiners;
  std::vector<int64_t> sizes, segments, lengths;
  stitch_combine::Layout layout;
};

StitchArgs ReadLayout(const std::vector<std::string>& combiners, const py::handle& field_sizes,
                      const py::handle& field_segments, const py::handle& segment_lengths,
                      int64_t num_positions) {
  StitchArgs args;
  if (combiners.empty()) throw py::value_error("stitch_combine needs at least one combiner.");
  for (const std::string& name : combiners) {
    stitch_combine::Combiner c;
    if (!stitch_combine::ParseCombiner(name, &c)) {
      throw py::value_error("combiner must be one of 'none', 'sum', 'mean', 'sqrtn', got '" + name +
                            "'.");
    }
    args.combiners.push_back(c);
  }
  args.sizes = Int64Vector(field_sizes, "field_sizes");
  args.segments = Int64Vector(field_segments, "field_segments");
  args.lengths = Int64Vector(segment_lengths, "segment_lengths");
  if (args.sizes.size() != combiners.size() || args.segments.size() != combiners.size()) {
    throw py::value_error(
        "field_sizes and field_segments need num_fields = " + std::to_string(combiners.size()) +
        " entries, got " + std::to_string(args.sizes.size()) + " and " +
        std::to_string(args.segments.size()) + ".");
  }
  ThrowIfError(args.layout.Build(args.combiners, args.sizes.data(), args.segments.data(),
                                 args.lengths.data(), static_cast<int64_t>(args.lengths.size()),
                                 num_positions));
  return args;
}

template <typename T, typename Idx>
py::list StitchForward(const py::array& rows_any, const py::array& inverse_any,
                       const StitchArgs& args, const py::array& weights_any) {
  auto rows = py::array_t<T, py::array::c_style>::ensure(rows_any);
  auto inverse = py::array_t<Idx, py::array::c_style>::ensure(inverse_any);
  auto weights = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(weights_any);
  const int64_t num_unique = rows.shape(0), dim = rows.shape(1), n = inverse.size();
  if (weights.size() != 0 && weights.size() != n) {
    throw py::value_error("weights must be empty or have one entry per id (" + std::to_string(n) +
                          "), got " + std::to_string(weights.size()) + ".");
  }
  ThrowIfError(stitch_combine::ValidateInverse(inverse.data(), n, num_unique, SequentialFor));
  py::list outs;
  std::vector<T*> ptrs;
  for (int f = 0; f < args.layout.num_fields(); ++f) {
    if (!FitsBytes(args.layout.output_rows(f), dim, sizeof(T))) {
      throw py::value_error("outputs[" + std::to_string(f) + "] would not fit int64 bytes.");
    }
    py::array_t<T> out({args.layout.output_rows(f), dim});
    ptrs.push_back(out.mutable_data());
    outs.append(out);
  }
  const T* w = weights.size() ? weights.data() : nullptr;
  {
    py::gil_scoped_release release;  // no Python object is touched inside
    stitch_combine::Forward<T, Idx>(args.layout, rows.data(), dim, inverse.data(), w, ptrs.data(),
                                    SequentialFor);
  }
  return outs;
}

py::list StitchCombinePy(const py::array& rows, const py::array& inverse,
                         const py::handle& field_sizes, const std::vector<std::string>& combiners,
                         const py::handle& field_segments, const py::handle& segment_lengths,
                         const py::object& weights_obj) {
  const bool wide = CheckFloatDtype(rows, "rows") == 8;
  if (rows.ndim() != 2) throw py::value_error("rows must be a matrix [num_unique, dim].");
  const bool idx64 = CheckIdDtype(inverse, "inverse") == 8;
  if (inverse.ndim() != 1) throw py::value_error("inverse must be a vector.");
  StitchArgs args = ReadLayout(combiners, field_sizes, field_segments, segment_lengths,
                               static_cast<int64_t>(inverse.size()));
  py::array weights =
      weights_obj.is_none() ? py::array(rows.dtype(), 0) : py::array::ensure(weights_obj);
  if (!weights || (weights.dtype().kind() != 'f' && weights.size() != 0)) {
    throw py::type_error("weights must be a float array.");
  }
  if (wide) {
    return idx64 ? StitchForward<double, int64_t>(rows, inverse, args, weights)
                 : StitchForward<double, int32_t>(rows, inverse, args, weights);
  }
  return idx64 ? StitchForward<float, int64_t>(rows, inverse, args, weights)
               : StitchForward<float, int32_t>(rows, inverse, args, weights);
}

template <typename T, typename Idx>
py::array StitchBackward(const py::list& grads_any, const py::array& inverse_any,
                         const StitchArgs& args, const py::array& weights_any, int64_t num_unique) {
  auto inverse = py::array_t<Idx, py::array::c_style>::ensure(inverse_any);
  auto weights = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(weights_any);
  const int64_t n = inverse.size();
  if (weights.size() != 0 && weights.size() != n) {
    throw py::value_error("weights must be empty or have one entry per id.");
  }
  if (num_unique < 0) throw py::value_error("num_unique must be >= 0.");
  ThrowIfError(stitch_combine::ValidateInverse(inverse.data(), n, num_unique, SequentialFor));
  const int nf = args.layout.num_fields();
  if (static_cast<int>(grads_any.size()) != nf) {
    throw py::value_error("grads needs one matrix per field (" + std::to_string(nf) + ").");
  }
  std::vector<py::array_t<T, py::array::c_style>> grads;
  std::vector<const T*> ptrs;
  int64_t dim = -1;
  for (int f = 0; f < nf; ++f) {
    py::array g_any = py::array::ensure(grads_any[f]);
    if (!g_any || g_any.dtype().kind() != 'f' || g_any.itemsize() != sizeof(T)) {
      throw py::type_error("grads must have the dtype of the rows.");
    }
    auto g = py::array_t<T, py::array::c_style>::ensure(g_any);
    if (g.ndim() != 2 || g.shape(0) != args.layout.output_rows(f) ||
        (dim >= 0 && g.shape(1) != dim)) {
      throw py::value_error("grads[" + std::to_string(f) + "] must have shape [" +
                            std::to_string(args.layout.output_rows(f)) + ", dim].");
    }
    dim = g.shape(1);
    ptrs.push_back(g.data());
    grads.push_back(g);
  }
  if (!FitsBytes(num_unique, dim, sizeof(T))) {
    throw py::value_error("d_rows would have shape [" + std::to_string(num_unique) + ", " +
                          std::to_string(dim) + "], which does not fit int64 bytes.");
  }
  py::array_t<T> d_rows({num_unique, dim});
  T* out = d_rows.mutable_data();
  const T* w = weights.size() ? weights.data() : nullptr;
  {
    py::gil_scoped_release release;  // no Python object is touched inside
    stitch_combine::Backward<T, Idx>(args.layout, ptrs.data(), dim, inverse.data(), w, num_unique,
                                     out, SequentialFor);
  }
  return d_rows;
}

py::array StitchCombineGradPy(const py::list& grads, const py::array& inverse,
                              const py::handle& field_sizes,
                              const std::vector<std::string>& combiners,
                              const py::handle& field_segments, const py::handle& segment_lengths,
                              const py::object& weights_obj, int64_t num_unique) {
  if (grads.size() == 0) throw py::value_error("grads needs one matrix per field.");
  py::array first = py::array::ensure(grads[0]);
  if (!first) throw py::type_error("grads must be float arrays.");
  const bool wide = CheckFloatDtype(first, "grads") == 8;
  const bool idx64 = CheckIdDtype(inverse, "inverse") == 8;
  if (inverse.ndim() != 1) throw py::value_error("inverse must be a vector.");
  StitchArgs args = ReadLayout(combiners, field_sizes, field_segments, segment_lengths,
                               static_cast<int64_t>(inverse.size()));
  py::array weights =
      weights_obj.is_none() ? py::array(first.dtype(), 0) : py::array::ensure(weights_obj);
  if (!weights || (weights.dtype().kind() != 'f' && weights.size() != 0)) {
    throw py::type_error("weights must be a float array.");
  }
  if (wide) {
    return idx64 ? StitchBackward<double, int64_t>(grads, inverse, args, weights, num_unique)
                 : StitchBackward<double, int32_t>(grads, inverse, args, weights, num_unique);
  }
  return idx64 ? StitchBackward<float, int64_t>(grads, inverse, args, weights, num_unique)
               : StitchBackward<float, int32_t>(grads, inverse, args, weights, num_unique);
}

// ---- unique_subset ---------------------------------------------------------

template <typename Id, typename Idx>
py::tuple SubsetRun(const py::array& ids_any, const py::array& inverse_any,
                    const std::vector<int64_t>& sizes, const unique_subset::FieldMap& map) {
  auto ids = py::array_t<Id, py::array::c_style>::ensure(ids_any);
  auto inverse = py::array_t<Idx, py::array::c_style>::ensure(inverse_any);
  unique_subset::SourceResult<Id, Idx> source;
  source.unique_ids = ids.data();
  source.num_unique = ids.size();
  source.inverse = inverse.data();
  source.num_positions = inverse.size();
  source.field_sizes = sizes.data();
  source.num_fields = static_cast<int64_t>(sizes.size());
  unique_subset::UniqueSubsetCpu<Id, Idx> impl;
  ImplStatus status;
  {
    py::gil_scoped_release release;
    status = impl.Prepare(source, map);
  }
  ThrowIfError(status);
  py::array_t<Id> u(impl.num_unique());
  py::array_t<int32_t> p(1);
  py::array_t<Idx> inv(impl.num_positions());
  py::array_t<int64_t> f(impl.num_fields());
  impl.Finish(u.mutable_data(), p.mutable_data(), inv.mutable_data(), f.mutable_data());
  return py::make_tuple(u, p, inv, f);
}

py::tuple UniqueSubsetPy(const py::array& unique_ids, const py::array& inverse,
                         const py::handle& field_sizes, const std::vector<int64_t>& source_fields,
                         const std::vector<int64_t>& source_offsets,
                         const std::vector<int64_t>& target_offsets,
                         const std::vector<int64_t>& num_rows) {
  const bool id64 = CheckIdDtype(unique_ids, "unique_ids") == 8;
  const bool idx64 = CheckIdDtype(inverse, "inverse") == 8;
  if (unique_ids.ndim() != 1 || inverse.ndim() != 1) {
    throw py::value_error("UniqueSubset: unique_ids and inverse must be vectors (rank 1).");
  }
  const std::vector<int64_t> sizes = Int64Vector(field_sizes, "field_sizes");
  unique_subset::FieldMap map{source_fields, source_offsets, target_offsets, num_rows};
  if (id64) {
    return idx64 ? SubsetRun<int64_t, int64_t>(unique_ids, inverse, sizes, map)
                 : SubsetRun<int64_t, int32_t>(unique_ids, inverse, sizes, map);
  }
  return idx64 ? SubsetRun<int32_t, int64_t>(unique_ids, inverse, sizes, map)
               : SubsetRun<int32_t, int32_t>(unique_ids, inverse, sizes, map);
}

}  // namespace

void RegisterLayerBindings(py::module_& m) {
  m.def("pack_ids", &PackIdsPy, py::arg("ids"), py::arg("row_offsets"), py::arg("num_rows"),
        py::arg("table_names"), py::arg("on_invalid") = "error",
        "K-packing of int32/int64 id arrays; returns (packed, field_sizes, invalid_counts).");
  m.def("stitch_combine", &StitchCombinePy, py::arg("rows"), py::arg("inverse"),
        py::arg("field_sizes"), py::arg("combiners"), py::arg("field_segments"),
        py::arg("segment_lengths"), py::arg("weights") = py::none(),
        "Stitch&Combine forward; returns one [rows_f, dim] array per field.");
  m.def("stitch_combine_grad", &StitchCombineGradPy, py::arg("grads"), py::arg("inverse"),
        py::arg("field_sizes"), py::arg("combiners"), py::arg("field_segments"),
        py::arg("segment_lengths"), py::arg("weights"), py::arg("num_unique"),
        "Stitch&Combine gradient with respect to the rows: d_rows[num_unique, dim].");
  m.def("unique_subset", &UniqueSubsetPy, py::arg("unique_ids"), py::arg("inverse"),
        py::arg("field_sizes"), py::arg("source_fields"), py::arg("source_offsets"),
        py::arg("target_offsets"), py::arg("num_rows"),
        "Packed table B's sorted unique_partition result from A's; returns "
        "(unique_ids, partition_sizes, inverse, field_sizes).");
}

}  // namespace hybridtf
