// Op definitions of HybridHash, the dynamic embedding table (resource).
#include "kernels/common/op_prefix.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

Status NoOutputs(InferenceContext*) { return Status(); }

Status RowsShape(InferenceContext* c) {
  ::tensorflow::int64 dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  ShapeHandle ids;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &ids));
  c->set_output(0, c->Matrix(c->Dim(ids, 0), dim));
  return Status();
}

}  // namespace

REGISTER_OP(HYBRIDTF_OP("HybridHashTable"))
    .Output("table: resource")
    .Attr("table_name: string")
    .Attr("dim: int")
    .Attr("hot_rows: int")
    .Attr("capacity: int = 0")
    .Attr("warmup_steps: int = 0")
    .Attr("flush_every: int = 1")
    .Attr("seed: int = 0")
    .Attr("initializer: string = 'uniform'")
    .Attr("init_a: float = -0.05")
    .Attr("init_b: float = 0.05")
    .Attr("count_decay: float = 1.0")
    .Attr("evict_policy: string = 'lfu'")
    .Attr("ttl_steps: int = 0")
    .Attr("member_seeds: list(int) = []")
    .Attr("member_initializers: list(string) = []")
    .Attr("member_init_a: list(float) = []")
    .Attr("member_init_b: list(float) = []")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return Status();
    })
    .Doc(R"doc(
Creates (or finds, by shared_name) a HybridHash table and returns its handle.
member_*: a packed store of len(member_seeds) tables keyed by (member, id),
each member with its own seed and initializer (then seed/initializer/init_*
are unused); empty: one table.
)doc");

REGISTER_OP(HYBRIDTF_OP("HybridHashLookup"))
    .Input("table: resource")
    .Input("ids: int64")
    .Input("counts: int64")
    .Input("members: int64")
    .Output("rows: float")
    .Attr("dim: int")
    .Attr("insert: bool = true")
    .SetIsStateful()
    .SetShapeFn(RowsShape)
    .Doc(R"doc(
Rows of ids. insert=true (training): find-or-insert, counts[i] occurrences of
ids[i] are added to its frequency (counts empty: 1 each), hit statistics.
insert=false: a pure read; absent ids get their initial rows, not inserted.
members: each id's table in a packed store (empty: member 0).
)doc");

REGISTER_OP(HYBRIDTF_OP("HybridHashUniqueFields"))
    .Input("ids: N * int64")
    .Input("field_members: int64")
    .Output("unique_ids: int64")
    .Output("unique_members: int64")
    .Output("inverse: int32")
    .Output("counts: int64")
    .Attr("N: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle members;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(c->num_inputs() - 1), 1, &members));
      DimensionHandle total = c->MakeDim(0);
      for (int f = 0; f + 1 < c->num_inputs(); ++f) {
        DimensionHandle size = c->NumElements(c->input(f));
        if (!c->RankKnown(c->input(f))) size = c->UnknownDim();
        TF_RETURN_IF_ERROR(c->Add(total, size, &total));
      }
      const auto unique = c->Vector(c->UnknownDim());
      c->set_output(0, unique);
      c->set_output(1, unique);
      c->set_output(2, c->Vector(total));
      c->set_output(3, unique);
      return Status();
    })
    .Doc(R"doc(
The distinct (member, id) pairs of a packed store's batch, first-occurrence
order, in one pass: ids[f] (any shape, read flat) are field f's ids, of member
field_members[f]; the fields are not concatenated first. inverse[i]: the pair
of position i (over the fields' ids in order); counts: occurrences.
)doc");

REGISTER_OP(HYBRIDTF_OP("HybridHashApplySgd"))
    .Input("table: resource")
    .Input("ids: int64")
    .Input("grad: float")
    .Input("lr: float")
    .Input("members: int64")
    .Attr("end_step: bool = true")
    .SetShapeFn(NoOutputs)
    .Doc("Keras SGD (no momentum) on the rows of distinct ids; then Algorithm 1's step end.");

REGISTER_OP(HYBRIDTF_OP("HybridHashApplyAdagrad"))
    .Input("table: resource")
    .Input("ids: int64")
    .Input("grad: float")
    .Input("lr: float")
    .Input("epsilon: float")
    .Input("members: int64")
    .Attr("initial_accumulator_value: float = 0.1")
    .Attr("end_step: bool = true")
    .SetShapeFn(NoOutputs)
    .Doc("Keras Adagrad on the rows (and accumulators) of distinct ids.");

REGISTER_OP(HYBRIDTF_OP("HybridHashApplyAdam"))
    .Input("table: resource")
    .Input("ids: int64")
    .Input("grad: float")
    .Input("alpha: float")
    .Input("one_minus_beta1: float")
    .Input("one_minus_beta2: float")
    .Input("epsilon: float")
    .Input("members: int64")
    .Attr("lazy: bool = false")
    .Attr("end_step: bool = true")
    .SetShapeFn(NoOutputs)
    .Doc("Keras Adam (every stored row's moments decay) or LazyAdam (lazy=true).");

// The packed chain's pair: the lookup also returns each id's record hint
// (record index, and hot entry + 1 in the high bits: RecordHint), which the
// update takes instead of probing the hash map again.
REGISTER_OP(HYBRIDTF_OP("HybridHashLookupRecords"))
    .Input("table: resource")
    .Input("ids: int64")
    .Input("counts: int64")
    .Input("members: int64")
    .Output("rows: float")
    .Output("records: int64")
    .Attr("dim: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RowsShape(c));
      c->set_output(1, c->Vector(c->Dim(c->input(1), 0)));
      return Status();
    })
    .Doc(R"doc(
HybridHashLookup with insert=true that also returns records[i], a hint for the
*Records updates: the store's record index of ids[i] in the low 32 bits and its
hot entry + 1 (0: cold) above.
)doc");

REGISTER_OP(HYBRIDTF_OP("HybridHashApplySgdRecords"))
    .Input("table: resource")
    .Input("ids: int64")
    .Input("grad: float")
    .Input("lr: float")
    .Input("members: int64")
    .Input("records: int64")
    .Attr("end_step: bool = true")
    .SetShapeFn(NoOutputs)
    .Doc("HybridHashApplySgd with the lookup's records as hints (empty: probe every id).");

REGISTER_OP(HYBRIDTF_OP("HybridHashApplyAdagradRecords"))
    .Input("table: resource")
    .Input("ids: int64")
    .Input("grad: float")
    .Input("lr: float")
    .Input("epsilon: float")
    .Input("members: int64")
    .Input("records: int64")
    .Attr("initial_accumulator_value: float = 0.1")
    .Attr("end_step: bool = true")
    .SetShapeFn(NoOutputs)
    .Doc("HybridHashApplyAdagrad with the lookup's records as hints (empty: probe every id).");

REGISTER_OP(HYBRIDTF_OP("HybridHashApplyAdamRecords"))
    .Input("table: resource")
    .Input("ids: int64")
    .Input("grad: float")
    .Input("alpha: float")
    .Input("one_minus_beta1: float")
    .Input("one_minus_beta2: float")
    .Input("epsilon: float")
    .Input("members: int64")
    .Input("records: int64")
    .Attr("lazy: bool = false")
    .Attr("end_step: bool = true")
    .SetShapeFn(NoOutputs)
    .Doc("HybridHashApplyAdam with the lookup's records as hints (empty: probe every id).");

REGISTER_OP(HYBRIDTF_OP("HybridHashDecayAdamMoments"))
    .Input("table: resource")
    .Input("one_minus_beta1: float")
    .Input("one_minus_beta2: float")
    .SetShapeFn(NoOutputs)
    .Doc("Keras Adam's data-free moment decay alone, on every stored row (the end-of-data step).");

REGISTER_OP(HYBRIDTF_OP("HybridHashEndStep"))
    .Input("table: resource")
    .SetShapeFn(NoOutputs)
    .Doc("Ends a training step without an update: Algorithm 1's flush check, step + 1.");

REGISTER_OP(HYBRIDTF_OP("HybridHashFlush"))
    .Input("table: resource")
    .SetShapeFn(NoOutputs)
    .Doc("Writes the hot tier back and refills it with the top-k rows by frequency.");

REGISTER_OP(HYBRIDTF_OP("HybridHashStats"))
    .Input("table: resource")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(16));
      return Status();
    })
    .Doc(
        "size, hot_used, hot_rows, inserts, evictions, lookups, hits, occurrences, "
        "occurrence_hits, step, flushes, last_step_lookups, last_step_hits, bytes, hot_bytes, "
        "num_slots.");

REGISTER_OP(HYBRIDTF_OP("HybridHashExport"))
    .Input("table: resource")
    .Output("ids: int64")
    .Output("rows: float")
    .Output("slots: float")
    .Output("counts: int64")
    .Output("slot_init: float")
    .Output("step: int64")
    .Output("members: int64")
    .Attr("dim: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ::tensorflow::int64 dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      auto n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, dim));
      c->set_output(2, c->MakeShape({n, c->UnknownDim(), c->MakeDim(dim)}));
      c->set_output(3, c->Vector(n));
      c->set_output(4, c->Vector(c->UnknownDim()));
      c->set_output(5, c->Scalar());
      c->set_output(6, c->Vector(n));
      return Status();
    })
    .Doc("All rows, sorted by (member, id), hot tier written back first.");

REGISTER_OP(HYBRIDTF_OP("HybridHashImport"))
    .Input("table: resource")
    .Input("ids: int64")
    .Input("rows: float")
    .Input("slots: float")
    .Input("counts: int64")
    .Input("slot_init: float")
    .Input("step: int64")
    .Input("members: int64")
    .Attr("member: int = -1")
    .SetShapeFn(NoOutputs)
    .Doc(R"doc(
Replaces the table's content with an export (members empty: member 0).
member >= 0: replaces that member's rows only (a packed store's table).
)doc");

}  // namespace hybridtf
