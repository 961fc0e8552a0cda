// Op definition of HybridTF>PackIds.
#include <string>
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_status.h"
#include "kernels/pack_ids/pack_ids_impl.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;

REGISTER_OP(HYBRIDTF_OP("PackIds"))
    .Input("ids: Tlist")
    .Output("packed: int64")
    .Output("field_sizes: int64")
    .Output("invalid_counts: int64")
    .Attr("Tlist: list({int32, int64}) >= 1")
    .Attr("row_offsets: list(int)")
    .Attr("num_rows: list(int)")
    .Attr("table_names: list(string)")
    .Attr("on_invalid: {'error', 'count'} = 'error'")
    .SetShapeFn([](InferenceContext* c) -> Status {
      std::vector<int64_t> row_offsets, num_rows;
      std::vector<std::string> table_names;
      TF_RETURN_IF_ERROR(c->GetAttr("row_offsets", &row_offsets));
      TF_RETURN_IF_ERROR(c->GetAttr("num_rows", &num_rows));
      TF_RETURN_IF_ERROR(c->GetAttr("table_names", &table_names));
      const size_t n = static_cast<size_t>(c->num_inputs());
      if (row_offsets.size() != n || num_rows.size() != n || table_names.size() != n) {
        return ::tensorflow::errors::InvalidArgument(
            "PackIds has ", n, " id inputs but ", row_offsets.size(), " row_offsets, ",
            num_rows.size(), " num_rows and ", table_names.size(),
            " table_names; give one of each per input.");
      }
      for (size_t f = 0; f < n; ++f) {
        TF_RETURN_IF_ERROR(
            ToTfStatus(pack_ids::ValidateTable(row_offsets[f], num_rows[f], table_names[f])));
      }
      DimensionHandle total = c->MakeDim(0);
      for (int i = 0; i < c->num_inputs(); ++i) {
        DimensionHandle n = c->NumElements(c->input(i));
        TF_RETURN_IF_ERROR(c->Add(total, n, &total));
      }
      c->set_output(0, c->Vector(total));
      c->set_output(1, c->Vector(c->num_inputs()));
      c->set_output(2, c->Vector(c->num_inputs()));
      return Status();
    })
    .Doc(R"doc(
Packs the ids of several fields into one int64 vector in the row space of a
packed table. The ids of field f (any shape, flattened) must lie in
[0, num_rows[f]) and are shifted by row_offsets[f]; field_sizes[f] is the
number of ids of field f. With on_invalid = "error" an id outside its table's
vocabulary fails the op with an error naming the table; with "count" it is
replaced by the table's first row and counted in invalid_counts[f] (so that a
distributed step can agree on the failure across ranks before exchanging ids).
)doc");

}  // namespace hybridtf
