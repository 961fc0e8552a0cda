// Shape-function helpers shared by the StitchConcat ops (kernels/stitch_concat/)
// and the StitchConcatMatMul ops (kernels/stitch_matmul/): the layout
// attributes checked as the kernels check them, and the [batch, width] of the
// concatenation.
#ifndef HYBRIDTF_KERNELS_STITCH_CONCAT_STITCH_CONCAT_SHAPE_H_
#define HYBRIDTF_KERNELS_STITCH_CONCAT_STITCH_CONCAT_SHAPE_H_

#include <cstdint>

#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {
namespace stitch_concat_shape {

// The layout attributes every StitchConcat-family op takes: group_fields
// (num_groups entries, each >= 1) summing to the number of combiners, known
// combiner names, equal-length non-empty piece lists naming existing fields /
// dense inputs once each.
::tensorflow::Status CheckLayoutAttrs(::tensorflow::shape_inference::InferenceContext* c);

// The list(int) attribute `name` has `count` entries, each in [1, kMaxWidth].
::tensorflow::Status CheckWidths(::tensorflow::shape_inference::InferenceContext* c,
                                 const char* name, int64_t count);

// batch and width of the concatenation the op's inputs and attributes describe.
::tensorflow::Status ConcatShape(::tensorflow::shape_inference::InferenceContext* c,
                                 ::tensorflow::shape_inference::DimensionHandle* batch,
                                 ::tensorflow::shape_inference::DimensionHandle* width);

}  // namespace stitch_concat_shape
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_STITCH_CONCAT_STITCH_CONCAT_SHAPE_H_
