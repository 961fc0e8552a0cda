// pybind11 module hybridtf._native: the TF-free implementation layer on NumPy
// arrays. The planner's warm-up statistics, data-side tools and reference
// tests call it without building a TensorFlow graph. Bad input raises
// ValueError / TypeError with the same wording as the TF kernels.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/python/native_common.h"
#include "kernels/unique_partition/unique_partition_impl.h"

namespace py = pybind11;

namespace hybridtf {
void BindHybridHash(py::module_& m);  // kernels/python/hybrid_hash_binding.cc
}  // namespace hybridtf

namespace hybridtf {
namespace {

using unique_partition::PartitionSpec;
using unique_partition::Strategy;
using unique_partition::UniquePartitionCpu;

int IdWidth(const py::array& array, const char* what) { return CheckIdDtype(array, what); }

template <typename Id>
py::tuple Run(const py::array& ids_any, int32_t num_partitions, Strategy strategy,
              const py::object& bounds_obj, bool inverse64, bool sort_ids) {
  auto ids = py::array_t<Id, py::array::c_style>::ensure(ids_any);
  if (!ids) throw py::type_error("ids must be a native-endian int32 or int64 array.");
  std::vector<Id> bounds;
  if (!bounds_obj.is_none()) {
    auto b = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(bounds_obj);
    if (!b || b.ndim() != 1) throw py::value_error("range_bounds must be a 1-D integer array.");
    for (py::ssize_t i = 0; i < b.shape(0); ++i) {
      const int64_t v = b.data()[i];
      // The TF op takes bounds of the ids' dtype: a bound that does not fit is
      // rejected (never truncated), with the TF wrapper's message.
      if (v < static_cast<int64_t>(std::numeric_limits<Id>::min()) ||
          v > static_cast<int64_t>(std::numeric_limits<Id>::max())) {
        throw py::value_error("range_bounds[" + std::to_string(i) + "] = " + std::to_string(v) +
                              " does not fit int" + std::to_string(8 * sizeof(Id)) +
                              " ids; use int64 ids.");
      }
      bounds.push_back(static_cast<Id>(v));
    }
  }
  PartitionSpec<Id> spec;
  spec.num_partitions = num_partitions;
  spec.strategy = strategy;
  spec.sorted = sort_ids;
  spec.bounds = bounds.empty() ? nullptr : bounds.data();
  spec.num_bounds = static_cast<int64_t>(bounds.size());

  const int64_t n = ids.shape(0);
  UniquePartitionCpu<Id> impl;
  ImplStatus status;
  {
    py::gil_scoped_release release;
    status = impl.Prepare(ids.data(), n, spec);
  }
  ThrowIfError(status);
  py::array_t<Id> unique_ids(impl.num_unique());
  py::array_t<int32_t> sizes(num_partitions);
  auto finish = [&](auto inverse) {
    Id* u = unique_ids.mutable_data();
    int32_t* s = sizes.mutable_data();
    auto* inv = inverse.mutable_data();
    {
      py::gil_scoped_release release;
      impl.Finish(u, s, inv);
    }
    return py::make_tuple(unique_ids, sizes, inverse);
  };
  if (inverse64) return finish(py::array_t<int64_t>(n));
  return finish(py::array_t<int32_t>(n));
}

py::tuple UniquePartitionPy(const py::array& ids, int64_t num_partitions,
                            const std::string& strategy_name, const py::object& range_bounds,
                            bool inverse64, bool sort_ids) {
  const int width = IdWidth(ids, "ids");
  if (ids.ndim() != 1) {
    throw py::value_error("ids must be a vector (rank 1), got " + std::to_string(ids.ndim()) +
                          " dimensions. Flatten packed ids first, e.g. ids.reshape(-1).");
  }
  if (num_partitions < 1 || num_partitions > unique_partition::kMaxPartitions) {
    throw py::value_error("num_partitions must be in [1, " +
                          std::to_string(unique_partition::kMaxPartitions) + "], got " +
                          std::to_string(num_partitions) + ".");
  }
  Strategy strategy;
  if (!unique_partition::ParseStrategy(strategy_name, &strategy)) {
    throw py::value_error("strategy must be 'mod' or 'range', got '" + strategy_name + "'.");
  }
  const auto p = static_cast<int32_t>(num_partitions);
  if (width == 4) return Run<int32_t>(ids, p, strategy, range_bounds, inverse64, sort_ids);
  return Run<int64_t>(ids, p, strategy, range_bounds, inverse64, sort_ids);
}

}  // namespace
}  // namespace hybridtf

PYBIND11_MODULE(_native, m) {
  m.doc() = "hybridtf's TF-free algorithms on NumPy arrays (see hybridtf.native).";
  m.def("unique_partition", &hybridtf::UniquePartitionPy, py::arg("ids"), py::arg("num_partitions"),
        py::arg("strategy") = "mod", py::arg("range_bounds") = py::none(),
        py::arg("inverse64") = false, py::arg("sort_ids") = false,
        "Fused unique + partition of a 1-D int32/int64 array; returns "
        "(unique_ids, partition_sizes, inverse). Same contract as the TF op.");
  hybridtf::RegisterLayerBindings(m);
  hybridtf::BindHybridHash(m);  // HybridHash (kernels/hybrid_hash)
}
