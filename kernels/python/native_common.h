// Shared helpers of the pybind11 module hybridtf._native: the dtype rules of
// the TF ops (ids int32/int64, rows float32/float64; anything else TypeError)
// and ImplStatus -> Python exception (InvalidArgument -> ValueError).
#ifndef HYBRIDTF_KERNELS_PYTHON_NATIVE_COMMON_H_
#define HYBRIDTF_KERNELS_PYTHON_NATIVE_COMMON_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "kernels/common/status.h"

namespace hybridtf {

inline void ThrowIfError(const ImplStatus& status) {
  if (status.ok()) return;
  if (status.code() == ImplStatus::Code::kInvalidArgument) {
    throw pybind11::value_error(status.message());
  }
  throw std::runtime_error(status.message());
}

// Item size (4 or 8) of an int32/int64 array; TypeError otherwise.
inline int CheckIdDtype(const pybind11::array& array, const char* what) {
  const pybind11::dtype dtype = array.dtype();
  if (dtype.kind() != 'i' || (dtype.itemsize() != 4 && dtype.itemsize() != 8)) {
    throw pybind11::type_error(
        std::string(what) + " must be an int32 or int64 array, got dtype " +
        std::string(pybind11::str(dtype)) +
        ". Cast integral ids with astype, or hash other features into ids first.");
  }
  return static_cast<int>(dtype.itemsize());
}

// Item size (4 or 8) of a float32/float64 array; TypeError otherwise.
inline int CheckFloatDtype(const pybind11::array& array, const char* what) {
  const pybind11::dtype dtype = array.dtype();
  if (dtype.kind() != 'f' || (dtype.itemsize() != 4 && dtype.itemsize() != 8)) {
    throw pybind11::type_error(std::string(what) + " must be a float32 or float64 array, got " +
                               std::string(pybind11::str(dtype)) + ".");
  }
  return static_cast<int>(dtype.itemsize());
}

// Registers pack_ids, stitch_combine(_grad) and unique_subset (native_layers.cc).
void RegisterLayerBindings(pybind11::module_& m);

}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_PYTHON_NATIVE_COMMON_H_
