// CPU kernels of HybridHash: thin OpKernels over the TF-free store. The store
// does its own locking (hybrid_hash_impl.h), so kernels run concurrently.
#include "kernels/hybrid_hash/hybrid_hash_kernels.h"

#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/hybrid_hash/hybrid_hash_unique_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace hybridtf {
namespace hybrid_hash {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

namespace {

Status GetTable(OpKernelContext* ctx, ::tensorflow::core::RefCountPtr<HybridHashResource>* out) {
  Status s = ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), out);
  if (!s.ok()) {
    return errors::FailedPrecondition(
        "the HybridHash table of this op does not exist (", s.message(),
        "). Create it first (build the DynamicEmbedding layer / HybridHashTable).");
  }
  return Status();
}

Status Scalar(OpKernelContext* ctx, int i, float* out) {
  const Tensor& t = ctx->input(i);
  if (t.dims() != 0) {
    return errors::InvalidArgument("input ", i, " must be a scalar, got shape ",
                                   t.shape().DebugString(), ".");
  }
  *out = t.scalar<float>()();
  return Status();
}

std::string Name(const Store& store) { return "HybridHash table '" + store.config().name + "'"; }

// The members input (index i): empty (member 0 for all) or one per id.
Status Members(OpKernelContext* ctx, int i, const Store& store, int64_t n, const int64_t** out) {
  const Tensor& t = ctx->input(i);
  *out = nullptr;
  if (t.NumElements() == 0 && t.dims() == 1) return Status();
  if (t.dims() != 1 || t.dim_size(0) != n) {
    return errors::InvalidArgument(Name(store), ": members must be empty or one per id [", n,
                                   "], got shape ", t.shape().DebugString(), ".");
  }
  *out = t.flat<int64_t>().data();
  return Status();
}

// Small batches run on the op's own thread: a model has one lookup and one
// update per table per step, and TensorFlow already runs the tables' ops in
// parallel (inter-op); sharding a few thousand rows costs more than it saves.
ParallelFor ChoosePf(OpKernelContext* ctx, int64_t n, int64_t dim) {
  constexpr int64_t kSequentialFloats = 1 << 16;
  if (n * dim < kSequentialFloats) return SequentialFor;
  return CpuParallelFor(ctx);
}

}  // namespace

class TableOp : public OpKernel {
 public:
  explicit TableOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    ::tensorflow::int64 seed;
    std::string init, policy;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &config_.name));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &config_.dim));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hot_rows", &config_.hot_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("capacity", &config_.capacity));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("warmup_steps", &config_.warmup_steps));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("flush_every", &config_.flush_every));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer", &init));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_a", &config_.init_a));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_b", &config_.init_b));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("count_decay", &config_.count_decay));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("evict_policy", &policy));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ttl_steps", &config_.ttl_steps));
    std::vector<::tensorflow::int64> member_seeds;
    std::vector<std::string> member_inits;
    std::vector<float> member_a, member_b;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("member_seeds", &member_seeds));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("member_initializers", &member_inits));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("member_init_a", &member_a));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("member_init_b", &member_b));
    const size_t num_members = member_seeds.size();
    OP_REQUIRES(ctx,
                member_inits.size() == num_members && member_a.size() == num_members &&
                    member_b.size() == num_members,
                errors::InvalidArgument("HybridHash table '", config_.name,
                                        "': member_seeds, member_initializers, member_init_a "
                                        "and member_init_b must have the same length, got ",
                                        num_members, ", ", member_inits.size(), ", ",
                                        member_a.size(), ", ", member_b.size(), "."));
    for (size_t m = 0; m < num_members; ++m) {
      RowInit init;
      init.seed = static_cast<uint64_t>(member_seeds[m]);
      init.init_a = member_a[m];
      init.init_b = member_b[m];
      OP_REQUIRES(ctx, ParseInitializer(member_inits[m], &init.initializer),
                  errors::InvalidArgument("HybridHash table '", config_.name, "' member ", m,
                                          ": initializer must be zeros, constant, uniform or "
                                          "normal, got '",
                                          member_inits[m], "'."));
      config_.members.push_back(init);
    }
    OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
    config_.seed = static_cast<uint64_t>(seed);
    OP_REQUIRES(ctx, ParseInitializer(init, &config_.initializer),
                errors::InvalidArgument("HybridHash table '", config_.name,
                                        "': initializer must be zeros, constant, uniform or "
                                        "normal, got '",
                                        init, "'."));
    OP_REQUIRES(
        ctx, ParseEvictPolicy(policy, &config_.evict_policy),
        errors::InvalidArgument("HybridHash table '", config_.name,
                                "': evict_policy must be 'lfu' or 'lru', got '", policy, "'."));
    OP_REQUIRES_OK(ctx, ToTfStatus(ValidateConfig(config_)));
    if (shared_name_.empty()) shared_name_ = name();
  }

  void Compute(OpKernelContext* ctx) override {
    HybridHashResource* resource = nullptr;
    const std::string container =
        container_.empty() ? ctx->resource_manager()->default_container() : container_;
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<HybridHashResource>(
                            container, shared_name_, &resource, [this](HybridHashResource** out) {
                              std::unique_ptr<Store> store;
                              ImplStatus s = Store::Create(config_, &store);
                              if (!s.ok()) return ToTfStatus(s);
                              *out = new HybridHashResource(std::move(store));
                              return Status();
                            }));
    ::tensorflow::core::ScopedUnref unref(resource);
    const Config& held = resource->store()->config();
    const std::string differs = ConfigDifference(held, config_);
    OP_REQUIRES(
        ctx, differs.empty(),
        errors::InvalidArgument("shared_name '", shared_name_, "' already names ",
                                Name(*resource->store()), " with another ", differs,
                                ": a second table of another configuration would share "
                                "its rows and silently run with the first one's. Give table '",
                                config_.name, "' its own shared_name, or the same settings."));
    Tensor* handle;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    handle->scalar<::tensorflow::ResourceHandle>()() =
        ::tensorflow::MakeResourceHandle<HybridHashResource>(ctx, container, shared_name_);
  }

 private:
  Config config_;
  std::string container_, shared_name_;
};

class LookupOp : public OpKernel {
 public:
  explicit LookupOp(OpKernelConstruction* ctx, bool with_records = false)
      : OpKernel(ctx), with_records_(with_records) {
    if (!with_records_) OP_REQUIRES_OK(ctx, ctx->GetAttr("insert", &insert_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<HybridHashResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    Store* store = table->store();
    const Tensor& ids = ctx->input(1);
    const Tensor& counts = ctx->input(2);
    OP_REQUIRES(ctx, ids.dims() == 1,
                errors::InvalidArgument(Name(*store), ": ids must be a vector, got shape ",
                                        ids.shape().DebugString(), ". Flatten them first."));
    OP_REQUIRES(ctx, counts.NumElements() == 0 || counts.shape() == ids.shape(),
                errors::InvalidArgument(Name(*store), ": counts must be empty or match ids ",
                                        ids.shape().DebugString(), ", got ",
                                        counts.shape().DebugString(), "."));
    OP_REQUIRES(ctx, dim_ == store->dim(),
                errors::InvalidArgument(Name(*store), " has dim ", store->dim(),
                                        ", the lookup asks for ", dim_, "."));
    const int64_t n = ids.NumElements();
    const int64_t* members;
    OP_REQUIRES_OK(ctx, Members(ctx, 3, *store, n, &members));
    Tensor* rows;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &rows));
    int64_t* records = nullptr;
    if (with_records_) {
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &out));
      records = out->flat<int64_t>().data();
    }
    if (n == 0) return;
    OP_REQUIRES_OK(ctx,
                   ToTfStatus(store->Lookup(
                       ids.flat<int64_t>().data(),
                       counts.NumElements() ? counts.flat<int64_t>().data() : nullptr, n, insert_,
                       rows->flat<float>().data(), ChoosePf(ctx, n, dim_), members, records)));
  }

 private:
  bool with_records_ = false;
  bool insert_ = true;
  ::tensorflow::int64 dim_ = 0;
};

class ApplyOp : public OpKernel {
 public:
  enum class Kind { kSgd, kAdagrad, kAdam };
  ApplyOp(OpKernelConstruction* ctx, Kind kind, bool with_records = false)
      : OpKernel(ctx), kind_(kind), with_records_(with_records) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("end_step", &end_step_));
    if (kind_ == Kind::kAdam) OP_REQUIRES_OK(ctx, ctx->GetAttr("lazy", &lazy_));
    if (kind_ == Kind::kAdagrad) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("initial_accumulator_value", &acc_init_));
    }
  }
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<HybridHashResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    Store* store = table->store();
    const Tensor& ids = ctx->input(1);
    const Tensor& grad = ctx->input(2);
    OP_REQUIRES(ctx,
                ids.dims() == 1 && grad.dims() == 2 && grad.dim_size(0) == ids.dim_size(0) &&
                    grad.dim_size(1) == store->dim(),
                errors::InvalidArgument(Name(*store), ": the update needs ids [n] and grad [n, ",
                                        store->dim(), "], got ", ids.shape().DebugString(), " and ",
                                        grad.shape().DebugString(), "."));
    const int num_scalars = kind_ == Kind::kSgd ? 1 : (kind_ == Kind::kAdagrad ? 2 : 4);
    float s[4];
    for (int i = 0; i < num_scalars; ++i) OP_REQUIRES_OK(ctx, Scalar(ctx, 3 + i, &s[i]));
    const int64_t* id = ids.flat<int64_t>().data();
    const float* g = grad.flat<float>().data();
    const int64_t n = ids.NumElements();
    const int64_t* mem;
    OP_REQUIRES_OK(ctx, Members(ctx, 3 + num_scalars, *store, n, &mem));
    const int64_t* rec = nullptr;  // hints only: a stale or bad value falls back to a probe
    if (with_records_) {
      const Tensor& records = ctx->input(4 + num_scalars);
      OP_REQUIRES(ctx,
                  records.dims() == 1 && (records.NumElements() == 0 || records.NumElements() == n),
                  errors::InvalidArgument(
                      Name(*store), ": records must be empty or one per id (", n, "), got shape ",
                      records.shape().DebugString(),
                      ". Pass the records output of the HybridHashLookupRecords that looked "
                      "these ids up, or an empty vector."));
      if (records.NumElements()) rec = records.flat<int64_t>().data();
    }
    const ParallelFor pf = ChoosePf(ctx, n, store->dim());
    ImplStatus status;
    bool replaced = false;
    switch (kind_) {
      case Kind::kSgd:
        status = store->ApplySgd(id, g, n, s[0], pf, mem, rec);
        break;
      case Kind::kAdagrad:
        status = store->EnsureSlots(1, &acc_init_, &replaced);
        if (status.ok()) status = store->ApplyAdagrad(id, g, n, s[0], s[1], pf, mem, rec);
        break;
      case Kind::kAdam: {
        const float zeros[2] = {0.f, 0.f};
        status = store->EnsureSlots(2, zeros, &replaced);
        if (status.ok()) {
          status = store->ApplyAdam(id, g, n, s[0], s[1], s[2], s[3], lazy_, pf, mem, rec);
        }
        break;
      }
    }
    if (replaced) {
      LOG(WARNING)
          << Name(*store)
          << ": the restored checkpoint holds another optimizer's slots (another number "
             "per row); its rows are kept and this optimizer's slots start fresh. To resume "
             "the checkpoint's optimizer state, compile with the optimizer that wrote it.";
    }
    OP_REQUIRES_OK(ctx, ToTfStatus(status));
    if (end_step_) store->EndStep(CpuParallelFor(ctx));
  }

 private:
  Kind kind_;
  bool with_records_ = false;
  bool end_step_ = true;
  bool lazy_ = false;
  float acc_init_ = 0.1f;
};

class SgdOp : public ApplyOp {
 public:
  explicit SgdOp(OpKernelConstruction* ctx) : ApplyOp(ctx, Kind::kSgd) {}
};
class AdagradOp : public ApplyOp {
 public:
  explicit AdagradOp(OpKernelConstruction* ctx) : ApplyOp(ctx, Kind::kAdagrad) {}
};
class AdamOp : public ApplyOp {
 public:
  explicit AdamOp(OpKernelConstruction* ctx) : ApplyOp(ctx, Kind::kAdam) {}
};
class LookupRecordsOp : public LookupOp {
 public:
  explicit LookupRecordsOp(OpKernelConstruction* ctx) : LookupOp(ctx, true) {}
};
class SgdRecordsOp : public ApplyOp {
 public:
  explicit SgdRecordsOp(OpKernelConstruction* ctx) : ApplyOp(ctx, Kind::kSgd, true) {}
};
class AdagradRecordsOp : public ApplyOp {
 public:
  explicit AdagradRecordsOp(OpKernelConstruction* ctx) : ApplyOp(ctx, Kind::kAdagrad, true) {}
};
class AdamRecordsOp : public ApplyOp {
 public:
  explicit AdamRecordsOp(OpKernelConstruction* ctx) : ApplyOp(ctx, Kind::kAdam, true) {}
};

class DecayAdamMomentsOp : public OpKernel {
 public:
  explicit DecayAdamMomentsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<HybridHashResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    float c[2];
    for (int i = 0; i < 2; ++i) OP_REQUIRES_OK(ctx, Scalar(ctx, 1 + i, &c[i]));
    OP_REQUIRES_OK(ctx,
                   ToTfStatus(table->store()->DecayAdamMoments(c[0], c[1], CpuParallelFor(ctx))));
  }
};

class EndStepOp : public OpKernel {
 public:
  explicit EndStepOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<HybridHashResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    table->store()->EndStep(CpuParallelFor(ctx));
  }
};

class FlushOp : public OpKernel {
 public:
  explicit FlushOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<HybridHashResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    table->store()->Flush(CpuParallelFor(ctx));
  }
};

class StatsOp : public OpKernel {
 public:
  explicit StatsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<HybridHashResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({kNumStats}), &out));
    StatsToArray(table->store()->GetStats(), out->flat<int64_t>().data());
  }
};

class ExportOp : public OpKernel {
 public:
  explicit ExportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<HybridHashResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    Store* store = table->store();
    OP_REQUIRES(ctx, dim_ == store->dim(),
                errors::InvalidArgument(Name(*store), " has dim ", store->dim(),
                                        " but the export asks for dim ", dim_, "."));
    const int64_t dim = store->dim();
    // written straight into the outputs: a save holds the table once more, not twice
    Status status;
    store->Export([&](int64_t n, int64_t num_slots, ExportBuffers* b) {
      Tensor *ids, *rows, *slots, *counts, *slot_init, *step, *members;
      status = ctx->allocate_output(0, TensorShape({n}), &ids);
      if (status.ok()) status = ctx->allocate_output(1, TensorShape({n, dim}), &rows);
      if (status.ok()) status = ctx->allocate_output(2, TensorShape({n, num_slots, dim}), &slots);
      if (status.ok()) status = ctx->allocate_output(3, TensorShape({n}), &counts);
      if (status.ok()) status = ctx->allocate_output(4, TensorShape({num_slots}), &slot_init);
      if (status.ok()) status = ctx->allocate_output(5, TensorShape({}), &step);
      if (status.ok()) status = ctx->allocate_output(6, TensorShape({n}), &members);
      if (!status.ok()) return false;
      *b = {ids->flat<int64_t>().data(),    members->flat<int64_t>().data(),
            rows->flat<float>().data(),     slots->flat<float>().data(),
            counts->flat<int64_t>().data(), slot_init->flat<float>().data(),
            &step->scalar<int64_t>()()};
      return true;
    });
    OP_REQUIRES_OK(ctx, status);
  }

 private:
  ::tensorflow::int64 dim_ = 0;
};

class ImportOp : public OpKernel {
 public:
  explicit ImportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("member", &member_));
    OP_REQUIRES(
        ctx, member_ >= -1,
        errors::InvalidArgument("HybridHash import: member must be -1 (the whole table) or a "
                                "packed table's index, got ",
                                member_, "."));
  }
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<HybridHashResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    Store* store = table->store();
    const Tensor& ids = ctx->input(1);
    const Tensor& rows = ctx->input(2);
    const Tensor& slots = ctx->input(3);
    const Tensor& counts = ctx->input(4);
    const Tensor& slot_init = ctx->input(5);
    const Tensor& step = ctx->input(6);
    const int64_t n = ids.dims() == 1 ? ids.dim_size(0) : -1;
    OP_REQUIRES(
        ctx, n >= 0 && counts.shape() == ids.shape(),
        errors::InvalidArgument(Name(*store), ": the checkpoint's ids ", ids.shape().DebugString(),
                                " and counts ", counts.shape().DebugString(),
                                " must be vectors of the same length."));
    OP_REQUIRES(
        ctx, step.dims() == 0,
        errors::InvalidArgument(Name(*store), ": the checkpoint's step must be a scalar, got ",
                                step.shape().DebugString(), "."));
    OP_REQUIRES(ctx, rows.dims() == 2 && rows.dim_size(0) == n,
                errors::InvalidArgument(Name(*store), ": the checkpoint's rows ",
                                        rows.shape().DebugString(),
                                        " must be a matrix of one row per id (", n, " ids)."));
    OP_REQUIRES(ctx, rows.dim_size(1) == store->dim(),
                errors::InvalidArgument(
                    Name(*store), " has dim ", store->dim(), " but the checkpoint's rows are ",
                    rows.shape().DebugString(),
                    ". Restore a checkpoint of this table, or build the layer with output_dim ",
                    rows.dim_size(1), "."));
    OP_REQUIRES(
        ctx, slot_init.dims() == 1,
        errors::InvalidArgument(Name(*store),
                                ": the checkpoint's slot_init must be a vector (one initial "
                                "value per optimizer slot), got shape ",
                                slot_init.shape().DebugString(), "."));
    OP_REQUIRES(ctx,
                slots.dims() == 3 && slots.dim_size(0) == n && slots.dim_size(2) == store->dim(),
                errors::InvalidArgument(Name(*store), ": the checkpoint's slots ",
                                        slots.shape().DebugString(), " do not match [", n,
                                        ", slots per row, ", store->dim(), "]."));
    OP_REQUIRES(ctx, slots.dim_size(1) == slot_init.NumElements(),
                errors::InvalidArgument(
                    Name(*store), ": the checkpoint's slots hold ", slots.dim_size(1),
                    " optimizer slot(s) per row but its slot_init has ", slot_init.NumElements(),
                    " value(s); they must agree (one initial value per slot)."));
    const int64_t* members;
    OP_REQUIRES_OK(ctx, Members(ctx, 7, *store, n, &members));
    OP_REQUIRES_OK(
        ctx, ToTfStatus(store->Import(ids.flat<int64_t>().data(), rows.flat<float>().data(),
                                      slots.flat<float>().data(), counts.flat<int64_t>().data(), n,
                                      slots.dim_size(1), slot_init.flat<float>().data(),
                                      step.scalar<int64_t>()(), members, member_)));
  }

 private:
  ::tensorflow::int64 member_ = -1;
};

// The MemberUnique outputs 0, 1 and 3 of the unique ops.
// (unique is the thread's, reused by its next call; freed when large.)
void SetUniqueOutputs(OpKernelContext* ctx, MemberUnique* unique) {
  const int64_t u = static_cast<int64_t>(unique->ids.size());
  const std::vector<int64_t>* parts[3] = {&unique->ids, &unique->members, &unique->counts};
  const int outputs[3] = {0, 1, 3};
  for (int k = 0; k < 3; ++k) {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(outputs[k], TensorShape({u}), &out));
    if (u) std::memcpy(out->flat<int64_t>().data(), parts[k]->data(), 8 * u);
  }
  if (unique->ids.capacity() > (size_t{1} << 21)) *unique = MemberUnique();
}

// HybridTF>HybridHashUniqueFields: no table, the TF-free pass of hybrid_hash_unique_impl.h.
class UniqueFieldsOp : public OpKernel {
 public:
  explicit UniqueFieldsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::OpInputList ids;
    OP_REQUIRES_OK(ctx, ctx->input_list("ids", &ids));
    const Tensor& members = ctx->input(ids.size());
    OP_REQUIRES(ctx, members.dims() == 1 && members.NumElements() == ids.size(),
                errors::InvalidArgument("HybridHash unique: ", ids.size(),
                                        " fields of ids but field_members has shape ",
                                        members.shape().DebugString(),
                                        "; pass one member index per field."));
    const int64_t fields = ids.size();
    std::vector<int64_t> sizes(static_cast<size_t>(fields));
    std::vector<const int64_t*> field_ids(static_cast<size_t>(fields));
    int64_t n = 0;
    for (int64_t f = 0; f < fields; ++f) {
      sizes[f] = ids[f].NumElements();
      field_ids[f] = ids[f].flat<int64_t>().data();
      OP_REQUIRES(ctx, !__builtin_add_overflow(n, sizes[f], &n),
                  errors::InvalidArgument("HybridHash unique: the fields' sizes overflow int64."));
    }
    const int64_t* member_data = members.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, ToTfStatus(CheckMemberFields(n, sizes.data(), member_data, fields)));
    Tensor* inverse;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &inverse));
    thread_local MemberUnique unique;  // the thread's vectors, reused (no page faults per call)
    UniqueMemberFieldIds(field_ids.data(), n, sizes.data(), member_data, fields,
                         inverse->flat<int32_t>().data(), &unique,
                         n < 2 * kUniquePartIds ? ParallelFor(SequentialFor) : CpuParallelFor(ctx));
    SetUniqueOutputs(ctx, &unique);
  }
};

#define HYBRIDTF_REGISTER(name, Op) \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP(name)).Device(::tensorflow::DEVICE_CPU), Op);
HYBRIDTF_REGISTER("HybridHashTable", TableOp)
HYBRIDTF_REGISTER("HybridHashLookup", LookupOp)
HYBRIDTF_REGISTER("HybridHashApplySgd", SgdOp)
HYBRIDTF_REGISTER("HybridHashApplyAdagrad", AdagradOp)
HYBRIDTF_REGISTER("HybridHashApplyAdam", AdamOp)
HYBRIDTF_REGISTER("HybridHashLookupRecords", LookupRecordsOp)
HYBRIDTF_REGISTER("HybridHashApplySgdRecords", SgdRecordsOp)
HYBRIDTF_REGISTER("HybridHashApplyAdagradRecords", AdagradRecordsOp)
HYBRIDTF_REGISTER("HybridHashApplyAdamRecords", AdamRecordsOp)
HYBRIDTF_REGISTER("HybridHashDecayAdamMoments", DecayAdamMomentsOp)
HYBRIDTF_REGISTER("HybridHashEndStep", EndStepOp)
HYBRIDTF_REGISTER("HybridHashFlush", FlushOp)
HYBRIDTF_REGISTER("HybridHashStats", StatsOp)
HYBRIDTF_REGISTER("HybridHashExport", ExportOp)
HYBRIDTF_REGISTER("HybridHashImport", ImportOp)
HYBRIDTF_REGISTER("HybridHashUniqueFields", UniqueFieldsOp)
#undef HYBRIDTF_REGISTER

}  // namespace hybrid_hash
}  // namespace hybridtf
