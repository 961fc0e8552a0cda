// Op definition and shape function of HybridTF>UniquePartition.
#include "kernels/common/op_prefix.h"
#include "kernels/unique_partition/unique_partition_impl.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP(HYBRIDTF_OP("UniquePartition"))
    .Input("ids: T")
    .Input("range_bounds: T")
    .Output("unique_ids: T")
    .Output("partition_sizes: int32")
    .Output("inverse: out_idx")
    .Attr("T: {int32, int64}")
    .Attr("out_idx: {int32, int64} = DT_INT32")
    .Attr("num_partitions: int >= 1")
    .Attr("strategy: {'mod', 'range'} = 'mod'")
    .Attr("sorted: bool = false")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      ShapeHandle bounds;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &bounds));
      int64_t num_partitions = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_partitions", &num_partitions));
      if (num_partitions < 1 || num_partitions > unique_partition::kMaxPartitions) {
        return ::tensorflow::errors::InvalidArgument("num_partitions must be in [1, ",
                                                     unique_partition::kMaxPartitions, "], got ",
                                                     num_partitions, ".");
      }
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(num_partitions));
      c->set_output(2, ids);
      return Status();
    })
    .Doc(R"doc(
Fused unique + partition-by-owner of a packed id vector, in one pass.

unique_ids: every distinct id once, grouped by partition (ascending); inside a
  partition in order of first occurrence in `ids`, or ascending if `sorted`.
partition_sizes: number of distinct ids per partition (alltoall splits).
inverse: for every position i, the index of ids[i] in unique_ids.
num_partitions: number of partitions (owning ranks), 1..4096.
strategy: 'mod' (id mod num_partitions, non-negative remainder) or 'range'
  (contiguous ranges [range_bounds[p], range_bounds[p+1]); ids in
  [0, range_bounds[-1])).
range_bounds: empty for 'mod'; num_partitions + 1 non-decreasing values
  starting at 0 for 'range'.
)doc");

}  // namespace hybridtf
