// Op definition and shape function of HybridTF>UniqueSubset: one packed
// table's sorted UniquePartition result derived from another's (same id
// tensors, different packed row space) without touching the ids.
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_status.h"
#include "kernels/unique_partition/unique_subset_impl.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP(HYBRIDTF_OP("UniqueSubset"))
    .Input("unique_ids: Id")
    .Input("inverse: Idx")
    .Input("field_sizes: int64")
    .Output("unique_ids_out: Id")
    .Output("partition_sizes: int32")
    .Output("inverse_out: Idx")
    .Output("field_sizes_out: int64")
    .Attr("source_fields: list(int)")
    .Attr("source_offsets: list(int)")
    .Attr("target_offsets: list(int)")
    .Attr("num_rows: list(int)")
    .Attr("Id: {int32, int64}")
    .Attr("Idx: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle unused;
      for (int i = 0; i < 3; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      // The attributes, checked as the kernel checks them (lengths, signs, int64
      // overflow, B's rows fitting the id dtype, disjoint target ranges).
      unique_subset::FieldMap map;
      TF_RETURN_IF_ERROR(c->GetAttr("source_fields", &map.source_fields));
      TF_RETURN_IF_ERROR(c->GetAttr("source_offsets", &map.source_offsets));
      TF_RETURN_IF_ERROR(c->GetAttr("target_offsets", &map.target_offsets));
      TF_RETURN_IF_ERROR(c->GetAttr("num_rows", &map.num_rows));
      ::tensorflow::DataType id_dtype;
      TF_RETURN_IF_ERROR(c->GetAttr("Id", &id_dtype));
      TF_RETURN_IF_ERROR(ToTfStatus(id_dtype == ::tensorflow::DT_INT32
                                        ? unique_subset::ValidateFieldMap<int32_t>(map)
                                        : unique_subset::ValidateFieldMap<int64_t>(map)));
      const std::vector<int64_t>& source_fields = map.source_fields;
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(1));
      c->set_output(2, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(3, c->Vector(static_cast<int64_t>(source_fields.size())));
      return Status();
    })
    .Doc(R"doc(
Packed table B's UniquePartition(num_partitions=1, sorted) result derived from
packed table A's, when B's fields look up the same id tensors as some of A's.

A's packed ids are its fields' ids, field by field, each plus the packed row
offset of the field's member table; (unique_ids, inverse) is A's
UniquePartition(packed_ids_A, num_partitions=1, sorted=true) and field_sizes
the positions per field of A. B field k reads the ids of A field
source_fields[k], whose member table starts at source_offsets[k] in A; in B it
starts at target_offsets[k]; both have num_rows[k] rows. B's target ranges must
be pairwise disjoint. The outputs equal UniquePartition(packed_ids_B,
num_partitions=1, sorted=true) bit for bit, plus B's field sizes.

The kernel checks that unique_ids are strictly ascending, that field_sizes
sum to the length of inverse, that every inverse value of A field
source_fields[k] is among A's unique ids of that field's member rows, and that
no other A field looks up ids there (one does when two A fields share a member
table B reads, or the offsets / num_rows do not match A's packing), and
returns InvalidArgument otherwise.

unique_ids_out: B's distinct packed ids, ascending.
partition_sizes: [number of unique_ids_out].
inverse_out: for every position of B (B's fields in B order), the index into
  unique_ids_out.
field_sizes_out: positions per field of B.

CPU only: there is no GPU kernel (the op is O(positions) integer relabelling;
place it on the CPU).
)doc");

}  // namespace hybridtf
