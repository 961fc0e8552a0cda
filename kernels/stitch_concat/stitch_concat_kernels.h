// The attribute parsing, layouts and column placement shared by the kernels
// of HybridTF>StitchConcat, StitchConcatGrad, StitchConcatMatMul and
// StitchConcatMatMulGrad (they take the same layout attributes).
#ifndef HYBRIDTF_KERNELS_STITCH_CONCAT_STITCH_CONCAT_KERNELS_H_
#define HYBRIDTF_KERNELS_STITCH_CONCAT_STITCH_CONCAT_KERNELS_H_

#include <string>
#include <vector>

#include "kernels/common/checked_math.h"
#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/stitch_concat/stitch_concat_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace hybridtf {
namespace stitch_combine {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// The inputs of a StitchConcat-layout op as the implementation layer takes them.
template <typename T, typename Idx>
struct ConcatInputs {
  std::vector<Layout> layouts;
  std::vector<ConcatGroup<T, Idx>> groups;
  std::vector<ConcatPiece<T>> pieces;
  int64_t batch = 0;
  int64_t width = 0;
};

// Attribute parsing, layouts and the column of every piece, shared by both kernels.
class StitchConcatOpBase : public OpKernel {
 public:
  explicit StitchConcatOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_groups", &num_groups_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_dense", &num_dense_));
    std::vector<std::string> names;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiners", &names));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("group_fields", &group_fields_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("piece_groups", &piece_groups_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("piece_items", &piece_items_));
    OP_REQUIRES(ctx, static_cast<int64_t>(group_fields_.size()) == num_groups_,
                errors::InvalidArgument("group_fields has ", group_fields_.size(),
                                        " entries but num_groups is ", num_groups_, "."));
    int64_t total_fields = 0;
    for (const int64_t f : group_fields_) {
      OP_REQUIRES(ctx, f >= 1 && CheckedAdd(total_fields, f, &total_fields),
                  errors::InvalidArgument("every group needs >= 1 field and the group_fields "
                                          "must sum to the number of combiners, got ",
                                          f, "."));
    }
    OP_REQUIRES(
        ctx, static_cast<int64_t>(names.size()) == total_fields,
        errors::InvalidArgument("combiners has ", names.size(), " entries but the groups have ",
                                total_fields, " fields; give one per field."));
    combiners_.resize(num_groups_);
    int64_t at = 0;
    for (int64_t g = 0; g < num_groups_; ++g) {
      for (int64_t f = 0; f < group_fields_[g]; ++f, ++at) {
        Combiner combiner;
        OP_REQUIRES(
            ctx, ParseCombiner(names[at], &combiner),
            errors::InvalidArgument("combiner must be one of 'none', 'sum', 'mean', 'sqrtn', got '",
                                    names[at], "'."));
        combiners_[g].push_back(combiner);
      }
    }
    OP_REQUIRES(ctx, piece_groups_.size() == piece_items_.size() && !piece_groups_.empty(),
                errors::InvalidArgument(
                    "piece_groups and piece_items must be non-empty and of equal length, got ",
                    piece_groups_.size(), " and ", piece_items_.size(), "."));
    std::vector<std::vector<bool>> used_field(num_groups_);
    for (int64_t g = 0; g < num_groups_; ++g) used_field[g].assign(group_fields_[g], false);
    std::vector<bool> used_dense(num_dense_, false);
    for (size_t k = 0; k < piece_groups_.size(); ++k) {
      const int64_t g = piece_groups_[k], item = piece_items_[k];
      if (g < 0) {
        OP_REQUIRES(
            ctx, g == -1 && item >= 0 && item < num_dense_ && !used_dense[item],
            errors::InvalidArgument("piece ", k, " names dense input ", item, " of ", num_dense_,
                                    "; every dense input must be used exactly once."));
        used_dense[item] = true;
        continue;
      }
      OP_REQUIRES(ctx,
                  g < num_groups_ && item >= 0 && item < group_fields_[g] && !used_field[g][item],
                  errors::InvalidArgument("piece ", k, " names field ", item, " of group ", g,
                                          ", which does not exist or is already used; a field "
                                          "can be placed once."));
      used_field[g][item] = true;
    }
    for (int64_t m = 0; m < num_dense_; ++m) {
      OP_REQUIRES(ctx, used_dense[m],
                  errors::InvalidArgument("dense input ", m, " is not placed."));
    }
  }

 protected:
  // Layouts of every group from the inputs at first_inverse (inverses, then
  // field_sizes, field_segments, segment_lengths lists, num_groups each).
  Status BuildLayouts(OpKernelContext* ctx, int first_inverse, std::vector<Layout>* layouts) const {
    layouts->resize(num_groups_);
    for (int64_t g = 0; g < num_groups_; ++g) {
      const Tensor& inverse = ctx->input(first_inverse + g);
      const Tensor& sizes = ctx->input(first_inverse + num_groups_ + g);
      const Tensor& segments = ctx->input(first_inverse + 2 * num_groups_ + g);
      const Tensor& lengths = ctx->input(first_inverse + 3 * num_groups_ + g);
      for (const Tensor* t : {&inverse, &sizes, &segments, &lengths}) {
        if (t->dims() != 1) {
          return errors::InvalidArgument(
              "group ", g, ": inverses, field_sizes, field_segments and ",
              "segment_lengths must be vectors, got shape ", t->shape().DebugString(), ".");
        }
      }
      if (sizes.NumElements() != group_fields_[g] || segments.NumElements() != group_fields_[g]) {
        return errors::InvalidArgument("group ", g, ": field_sizes and field_segments need ",
                                       group_fields_[g], " entries, got ", sizes.NumElements(),
                                       " and ", segments.NumElements(), ".");
      }
      TF_RETURN_IF_ERROR(ToTfStatus((*layouts)[g].Build(
          combiners_[g], sizes.flat<int64_t>().data(), segments.flat<int64_t>().data(),
          lengths.flat<int64_t>().data(), lengths.NumElements(), inverse.NumElements())));
    }
    return Status();
  }

  // Column offset of every piece and the total width, from the group dims and
  // dense widths; checks that every piece has `*batch` rows.
  Status PlacePieces(const std::vector<Layout>& layouts, const std::vector<int64_t>& dims,
                     const std::vector<int64_t>& dense_rows,
                     const std::vector<int64_t>& dense_widths, std::vector<int64_t>* columns,
                     int64_t* width, int64_t* batch) const {
    columns->clear();
    *width = 0;
    *batch = -1;
    for (size_t k = 0; k < piece_groups_.size(); ++k) {
      const int64_t g = piece_groups_[k], item = piece_items_[k];
      const int64_t rows =
          g < 0 ? dense_rows[item] : layouts[g].output_rows(static_cast<int>(item));
      if (*batch < 0) *batch = rows;
      if (rows != *batch) {
        return errors::InvalidArgument("StitchConcat: piece ", k,
                                       (g < 0 ? " (a dense input)" : " (an embedding field)"),
                                       " has ", rows, " rows but piece 0 has ", *batch,
                                       "; concatenated inputs need the same number of rows.");
      }
      columns->push_back(*width);
      const int64_t piece_width = g < 0 ? dense_widths[item] : dims[g];
      if (piece_width < 0 || !CheckedAdd(*width, piece_width, width)) {
        return errors::InvalidArgument("StitchConcat: piece ", k, " has width ", piece_width,
                                       "; widths must be >= 0 and their sum must fit int64.");
      }
    }
    return Status();
  }

  // Reads rows, inverses, field lists and dense matrices starting at input
  // `first_rows` (in StitchConcat's order): layouts, groups and pieces with their
  // columns. Checks every inverse index against its group's rows when
  // `validate_inverse` (StitchConcatMatMul checks them from its per-field ranges).
  template <typename T, typename Idx>
  Status ReadInputs(OpKernelContext* ctx, int first_rows, bool validate_inverse,
                    ConcatInputs<T, Idx>* in) const {
    const int ng = static_cast<int>(num_groups_);
    TF_RETURN_IF_ERROR(BuildLayouts(ctx, first_rows + ng, &in->layouts));
    std::vector<int64_t> dims(ng), dense_rows(num_dense_), dense_widths(num_dense_);
    for (int g = 0; g < ng; ++g) {
      const Tensor& rows = ctx->input(first_rows + g);
      if (rows.dims() != 2) {
        return errors::InvalidArgument("rows[", g, "] must be a matrix [num_unique, dim], got ",
                                       rows.shape().DebugString(), ".");
      }
      dims[g] = rows.dim_size(1);
      if (validate_inverse) {
        const Tensor& inverse = ctx->input(first_rows + ng + g);
        TF_RETURN_IF_ERROR(
            ToTfStatus(ValidateInverse(inverse.flat<Idx>().data(), inverse.NumElements(),
                                       rows.dim_size(0), CpuParallelFor(ctx))));
      }
    }
    for (int64_t m = 0; m < num_dense_; ++m) {
      const Tensor& d = ctx->input(first_rows + 5 * ng + m);
      if (d.dims() != 2) {
        return errors::InvalidArgument("dense[", m, "] must be a matrix [batch, width], got ",
                                       d.shape().DebugString(), ".");
      }
      dense_rows[m] = d.dim_size(0);
      dense_widths[m] = d.dim_size(1);
    }
    std::vector<int64_t> columns;
    TF_RETURN_IF_ERROR(
        PlacePieces(in->layouts, dims, dense_rows, dense_widths, &columns, &in->width, &in->batch));
    for (int g = 0; g < ng; ++g) {
      const Tensor& rows = ctx->input(first_rows + g);
      in->groups.push_back({&in->layouts[g], rows.flat<T>().data(), dims[g],
                            ctx->input(first_rows + ng + g).flat<Idx>().data(), rows.dim_size(0)});
    }
    for (size_t k = 0; k < columns.size(); ++k) {
      const int64_t g = piece_groups_[k], item = piece_items_[k];
      in->pieces.push_back(
          {static_cast<int>(g), g < 0 ? -1 : static_cast<int>(item),
           g < 0 ? ctx->input(first_rows + 5 * ng + item).flat<T>().data() : nullptr,
           g < 0 ? dense_widths[item] : dims[g], columns[k]});
    }
    return Status();
  }

  int64_t num_groups_ = 1;
  int64_t num_dense_ = 0;
  std::vector<int64_t> group_fields_;
  std::vector<std::vector<Combiner>> combiners_;
  std::vector<int64_t> piece_groups_;
  std::vector<int64_t> piece_items_;
};

}  // namespace stitch_combine
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_STITCH_CONCAT_STITCH_CONCAT_KERNELS_H_
