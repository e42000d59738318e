#include "reshard/layout/tp_partition.h"

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <utility>

namespace reshard::layout {
namespace {

using Shape = std::vector<int64_t>;
using view::AppendGather;
using view::Gather;
using view::GatherList;

template <typename Int>
std::string Str(Int v) {
  return std::to_string(v);
}

std::string ListString(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += Str(values[i]);
  }
  return out + "]";
}

std::string DoubleString(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

bool MulOk(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
bool AddOk(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }

Status Overflow(std::string_view what) { return OutOfRange(std::string(what) + " overflows int64"); }

// Checks dims (count, sign) and returns the numel. The product of the non-zero dims must fit too,
// so that every partial product taken later (rows before a dim, elements after it) is safe even
// for a tensor with a zero-sized dim.
Result<int64_t> ValidateShape(const Shape& shape, std::string_view what) {
  if (shape.size() > static_cast<size_t>(kMaxTensorDims)) {
    return Unsupported(std::string(what) + " " + ListString(shape) + " has " + Str(shape.size()) + " dims, more than " +
                       Str(kMaxTensorDims));
  }
  int64_t numel = 1, nonzero = 1;
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgument(std::string(what) + " " + ListString(shape) + " has a negative dim");
    if (!MulOk(nonzero, std::max<int64_t>(d, 1), &nonzero)) return Overflow(std::string(what));
    numel *= d;
  }
  return numel;
}

// Sum of non-negative sizes; `what` names the list in messages.
Result<int64_t> SumSizes(const std::vector<int64_t>& sizes, std::string_view what) {
  int64_t sum = 0;
  for (int64_t s : sizes) {
    if (s < 0) return InvalidArgument(std::string(what) + " " + ListString(sizes) + " has a negative entry");
    if (!AddOk(sum, s, &sum)) return Overflow(std::string(what) + " " + ListString(sizes));
  }
  return sum;
}

// torch's dim wrapping: -ndim <= dim < ndim.
Result<int> NormalizeDim(int dim, size_t ndim, std::string_view what) {
  const int n = static_cast<int>(ndim);
  if (dim < -n || dim >= n) {
    return InvalidArgument(std::string(what) + " " + Str(dim) + " is out of range for a " + Str(n) + "-dim tensor");
  }
  return dim < 0 ? dim + n : dim;
}

int64_t Product(const Shape& shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= shape[i];  // bounded by ValidateShape
  return p;
}

// The tensor DeepSpeed actually slices: the universal tensor, possibly zero-padded at the end
// (vocab rows) and possibly re-viewed (sub_param_shape, logical_shape). Views never move
// elements and padding only appends, so flat index i < real_elems is universal element i and
// the rest are zeros.
struct Source {
  Shape shape;
  uint64_t real_elems = 0;
};

struct Block {
  int64_t offset = 0;  // along the split dim
  int64_t length = 0;
};

// Appends `rows` rows of `row_elems` virtual elements, `stride` apart from `start`, cutting them
// at the padding boundary. Rows only grow in the source, so at most one row straddles it.
void AppendRows(uint64_t start, uint64_t row_elems, uint64_t rows, uint64_t stride, uint64_t real, GatherList& out) {
  if (rows == 0 || row_elems == 0) return;
  if (rows > 1 && stride == row_elems) {  // back-to-back rows are one run
    row_elems *= rows;
    rows = 1;
  }
  uint64_t whole = 0;
  if (start + row_elems <= real) whole = rows == 1 ? 1 : std::min(rows, (real - start - row_elems) / stride + 1);
  if (whole > 0) AppendGather(out, Gather::Source(start, row_elems, whole, stride));
  uint64_t r = whole;
  if (r < rows) {
    const uint64_t row_start = start + r * stride;
    if (row_start < real) {
      AppendGather(out, Gather::Source(row_start, real - row_start));
      AppendGather(out, Gather::Zeros(row_elems - (real - row_start)));
      ++r;
    }
  }
  if (r < rows) AppendGather(out, Gather::Zeros((rows - r) * row_elems));
}

// The local shape in `base` coordinates when the view's split dim is one dim of `base` (same
// elements before and after it), else in the view's coordinates.
Shape MapLocalShape(const Shape& base, const Shape& view_shape, int dim, int64_t local_len) {
  if (view_shape == base) {
    Shape out = base;
    out[static_cast<size_t>(dim)] = local_len;
    return out;
  }
  const int64_t lead = Product(view_shape, 0, static_cast<size_t>(dim));
  const int64_t trail = Product(view_shape, static_cast<size_t>(dim) + 1, view_shape.size());
  for (size_t k = 0; k < base.size(); ++k) {
    if (base[k] == view_shape[static_cast<size_t>(dim)] && Product(base, 0, k) == lead &&
        Product(base, k + 1, base.size()) == trail) {
      Shape out = base;
      out[k] = local_len;
      return out;
    }
  }
  Shape out = view_shape;
  out[static_cast<size_t>(dim)] = local_len;
  return out;
}

// cat([src.narrow(dim, b.offset, b.length) for b in blocks], dim), flattened. A split on dim 0
// (or of a single block) is one strided gather per block; a multi-block split on a later dim
// interleaves the blocks row by row, one piece each, which is what the cap is for.
Result<TpSlice> NarrowCat(const Source& src, int dim, const std::vector<Block>& blocks, const Shape& base) {
  const size_t d = static_cast<size_t>(dim);
  const int64_t outer = Product(src.shape, 0, d);
  const int64_t inner = Product(src.shape, d + 1, src.shape.size());
  const int64_t dim_size = src.shape[d];
  // Blocks that continue each other (every block at T=1, say) are one block: fewer pieces.
  std::vector<Block> nonempty;
  int64_t local_len = 0;
  for (const Block& b : blocks) {
    local_len += b.length;  // blocks lie inside dim_size (checked by callers), so this fits
    if (b.length == 0) continue;
    if (!nonempty.empty() && nonempty.back().offset + nonempty.back().length == b.offset) {
      nonempty.back().length += b.length;
    } else {
      nonempty.push_back(b);
    }
  }
  TpSlice slice;
  slice.local_shape = MapLocalShape(base, src.shape, dim, local_len);
  if (outer == 0 || inner == 0 || nonempty.empty()) return slice;
  const bool interleave = outer > 1 && nonempty.size() > 1;
  const uint64_t pieces = interleave ? static_cast<uint64_t>(outer) * nonempty.size() : nonempty.size();
  if (pieces > kMaxGatherPieces) {
    return ResourceExhausted("TP slice of shape " + ListString(slice.local_shape) + " needs " + std::to_string(pieces) +
                             " gather pieces, more than " + std::to_string(kMaxGatherPieces));
  }
  // Either one pass of `outer`-row gathers, or `outer` passes of one row per block.
  const uint64_t passes = interleave ? static_cast<uint64_t>(outer) : 1;
  const uint64_t rows = interleave ? 1 : static_cast<uint64_t>(outer);
  const uint64_t row_stride = static_cast<uint64_t>(dim_size) * static_cast<uint64_t>(inner);
  const uint64_t u_inner = static_cast<uint64_t>(inner);
  for (uint64_t o = 0; o < passes; ++o) {
    for (const Block& b : nonempty) {
      AppendRows(o * row_stride + static_cast<uint64_t>(b.offset) * u_inner, static_cast<uint64_t>(b.length) * u_inner,
                 rows, row_stride, src.real_elems, slice.gather);
    }
  }
  return slice;
}

TpSlice Whole(const Shape& shape, int64_t numel) {
  TpSlice slice;
  slice.local_shape = shape;
  AppendGather(slice.gather, Gather::Source(0, static_cast<uint64_t>(numel)));
  return slice;
}

// torch.view's rules for a shape with at most one -1: the -1 is inferred, and the product must
// equal the numel. `what` names the spec in messages, `code` is the error's code (a sub_param_shape
// comes from the checkpoint, a logical_shape from the caller's metadata).
Result<Shape> ResolveView(Shape dims, int64_t numel, const Shape& full, const std::string& what, StatusCode code) {
  const std::string spec = what + " " + ListString(dims);
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1 && infer < 0) {
      infer = static_cast<int>(i);
    } else if (dims[i] < 0) {
      return Status(code, spec + " has more than one -1 or a negative dim");
    } else if (!MulOk(known, dims[i], &known)) {
      return Overflow(spec);
    }
  }
  if (infer >= 0 && known != 0 && numel % known == 0) dims[static_cast<size_t>(infer)] = numel / known;
  if ((infer >= 0 && dims[static_cast<size_t>(infer)] == -1) || (infer < 0 && known != numel)) {
    return Status(code, spec + " cannot view the " + Str(numel) + "-element tensor of shape " + ListString(full));
  }
  RS_RETURN_IF_ERROR(ValidateShape(dims, what).status());
  return dims;
}

// A sub_param_shape's view of the tensor: each entry is its size, or the sum of its tuple.
Result<Shape> ResolveSubParamView(const SubParamShape& spec, const Shape& full, int64_t numel) {
  if (spec.shape.empty() || spec.shape.size() > static_cast<size_t>(kMaxTensorDims)) {
    return Corrupt("sub_param_shape has " + Str(spec.shape.size()) + " dims, not 1 to " + Str(kMaxTensorDims));
  }
  Shape dims;
  for (const std::vector<int64_t>& entry : spec.shape) {
    if (entry.size() == 1) {
      dims.push_back(entry[0]);  // -1 allowed here only
      continue;
    }
    auto sum = SumSizes(entry, "sub_param_shape entry");
    if (entry.empty() || !sum.ok()) return Corrupt("sub_param_shape entry " + ListString(entry) + " is not a size");
    dims.push_back(*sum);
  }
  return ResolveView(std::move(dims), numel, full, "sub_param_shape", StatusCode::kCorrupt);
}

// Rank t's block of one even split of [offset, offset + size) into tp_size parts, or the
// refusal DeepSpeed's numel assert amounts to.
Result<Block> EvenBlock(int64_t offset, int64_t size, int tp_size, int tp_rank, const std::string& context) {
  if (size % tp_size != 0) {
    return InvalidArgument("T=" + Str(tp_size) + " does not divide " + context);
  }
  const int64_t width = size / tp_size;
  return Block{offset + width * tp_rank, width};
}

// Rank t's block of a split by per-rank `widths`, for a (sub-)parameter starting at `offset`.
Block WidthBlock(const std::vector<int64_t>& widths, int64_t offset, int tp_rank) {
  for (int r = 0; r < tp_rank; ++r) offset += widths[static_cast<size_t>(r)];
  return Block{offset, widths[static_cast<size_t>(tp_rank)]};
}

// torch.chunk(n) along a dim of `size`: ceil-sized chunks, fewer than n when they run out, and
// n empty chunks for an empty dim.
std::vector<int64_t> TorchChunkSizes(int64_t size, int64_t n) {
  if (size == 0) return std::vector<int64_t>(static_cast<size_t>(n), 0);
  const int64_t chunk = size / n + (size % n != 0 ? 1 : 0);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size; start += chunk) sizes.push_back(std::min(chunk, size - start));
  return sizes;
}

// §3.2 category rules (the loader's `autotp_tp_hp_slice is None` branch), on `src` with
// (tp_size, tp_rank) already collapsed to (1, 0) when the tensor is served whole.
Result<TpSlice> CategorySlice(const Source& src, const UcpCategory& category, int tp_size, int tp_rank,
                              const Shape& base) {
  const int64_t numel = Product(src.shape, 0, src.shape.size());
  if (category.sub_param_shape) {
    const SubParamShape& spec = *category.sub_param_shape;
    RS_ASSIGN_OR_RETURN(Shape view_shape, ResolveSubParamView(spec, src.shape, numel));
    RS_ASSIGN_OR_RETURN(int pd, NormalizeDim(spec.partition_dim, view_shape.size(), "sub_param_shape partition_dim"));
    const std::vector<int64_t>& sizes = spec.shape[static_cast<size_t>(pd)];
    if (sizes.size() == 1 && sizes[0] == -1) return Corrupt("sub_param_shape has -1 at partition_dim " + Str(pd));
    std::vector<Block> blocks;
    int64_t offset = 0;
    for (size_t j = 0; j < sizes.size(); ++j) {
      RS_ASSIGN_OR_RETURN(
          Block b, EvenBlock(offset, sizes[j], tp_size, tp_rank,
                             "sub-parameter " + Str(j) + " of size " + Str(sizes[j]) + " (sub_param_shape sizes " +
                                 ListString(sizes) + ", partition_dim " + Str(pd) + ")"));
      blocks.push_back(b);
      offset += sizes[j];
    }
    return NarrowCat(Source{view_shape, src.real_elems}, pd, blocks, base);
  }
  RS_ASSIGN_OR_RETURN(int cd, NormalizeDim(category.cat_dim.value_or(0), src.shape.size(), "cat_dim"));
  const int64_t dim_size = src.shape[static_cast<size_t>(cd)];
  const std::string dim_text = "dim " + Str(cd) + " of size " + Str(dim_size);
  std::vector<Block> blocks;
  // torch.chunk may cut n parts unevenly (10 rows in 3: 4/4/2); only each part must split by T.
  if (category.n_sub_params > 1) {
    int64_t offset = 0;
    const std::vector<int64_t> parts = TorchChunkSizes(dim_size, category.n_sub_params);
    for (size_t j = 0; j < parts.size(); ++j) {
      RS_ASSIGN_OR_RETURN(Block b,
                          EvenBlock(offset, parts[j], tp_size, tp_rank,
                                    "sub-param " + Str(j) + " of size " + Str(parts[j]) + " (" + dim_text + " in " +
                                        Str(category.n_sub_params) + " sub-params, cat_dim " + Str(cd) + ")"));
      blocks.push_back(b);
      offset += parts[j];
    }
  } else {
    RS_ASSIGN_OR_RETURN(Block b, EvenBlock(0, dim_size, tp_size, tp_rank, dim_text + " (cat_dim " + Str(cd) + ")"));
    blocks.push_back(b);
  }
  return NarrowCat(src, cd, blocks, base);
}

// ParamAffineMap.extract for one rank. Each piece is cut into runs that are contiguous on both
// sides (its trailing dims that are dense in source and shard), the runs are ordered by shard
// offset, and they must tile the shard: DeepSpeed fills a torch.empty shard, so a gap would be
// garbage and an overlap an order-dependent overwrite; both are refused.
Result<TpSlice> AffineSlice(const AffineShard& shard, int tp_rank, int64_t full_numel) {
  const std::string where = "affine map rank " + Str(tp_rank);
  RS_ASSIGN_OR_RETURN(int64_t shard_numel, ValidateShape(shard.shard_shape, where + " shard_shape"));
  struct Run {
    int64_t dest, src, length;
  };
  std::vector<Run> runs;
  uint64_t total_runs = 0;
  for (size_t i = 0; i < shard.pieces.size(); ++i) {
    const AffinePiece& p = shard.pieces[i];
    const std::string piece = where + " piece " + Str(i);
    if (p.scale != 1.0) {
      return Unsupported(piece + " has scale " + DoubleString(p.scale) + "; a scaled shard is not a gather");
    }
    const size_t nd = p.shape.size();
    if (p.source_strides.size() != nd || p.dest_strides.size() != nd) {
      return InvalidArgument(piece + " has " + Str(nd) + " dims but strides " + ListString(p.source_strides) + " / " +
                             ListString(p.dest_strides));
    }
    RS_ASSIGN_OR_RETURN(int64_t piece_numel, ValidateShape(p.shape, piece + " shape"));
    if (piece_numel == 0) continue;
    if (p.source_offset < 0 || p.dest_offset < 0) return InvalidArgument(piece + " has a negative offset");
    int64_t src_last = p.source_offset, dest_last = p.dest_offset;
    for (size_t k = 0; k < nd; ++k) {
      int64_t s = 0, t = 0;
      if (p.source_strides[k] < 0 || p.dest_strides[k] < 0) return InvalidArgument(piece + " has a negative stride");
      if (!MulOk(p.shape[k] - 1, p.source_strides[k], &s) || !AddOk(src_last, s, &src_last) ||
          !MulOk(p.shape[k] - 1, p.dest_strides[k], &t) || !AddOk(dest_last, t, &dest_last)) {
        return Overflow(piece + " extent");
      }
    }
    if (src_last >= full_numel || dest_last >= shard_numel) {
      return InvalidArgument(piece + " reaches source element " + Str(src_last) + " of " + Str(full_numel) +
                             " / shard element " + Str(dest_last) + " of " + Str(shard_numel));
    }
    // Fold trailing dims that are dense on both sides into the run length.
    size_t outer_dims = nd;
    int64_t run = 1;
    while (outer_dims > 0) {
      const size_t k = outer_dims - 1;
      if (p.shape[k] != 1 && (p.source_strides[k] != run || p.dest_strides[k] != run)) break;
      run *= p.shape[k];
      --outer_dims;
    }
    const int64_t count = piece_numel / run;
    total_runs += static_cast<uint64_t>(count);
    if (total_runs > kMaxGatherPieces) {
      return ResourceExhausted(where + " needs more than " + std::to_string(kMaxGatherPieces) + " runs");
    }
    std::vector<int64_t> index(outer_dims, 0);
    int64_t src = p.source_offset, dest = p.dest_offset;
    for (int64_t n = 0; n < count; ++n) {
      runs.push_back(Run{dest, src, run});
      for (size_t k = outer_dims; k-- > 0;) {  // odometer over the outer dims
        if (++index[k] < p.shape[k]) {
          src += p.source_strides[k];
          dest += p.dest_strides[k];
          break;
        }
        src -= (p.shape[k] - 1) * p.source_strides[k];
        dest -= (p.shape[k] - 1) * p.dest_strides[k];
        index[k] = 0;
      }
    }
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.dest < b.dest; });
  TpSlice slice;
  slice.local_shape = shard.shard_shape;
  int64_t next = 0;
  for (const Run& r : runs) {
    if (r.dest != next) {
      return InvalidArgument(where + (r.dest > next ? " leaves shard element " + Str(next) + " uncovered"
                                                    : " writes shard element " + Str(r.dest) + " twice"));
    }
    AppendGather(slice.gather, Gather::Source(static_cast<uint64_t>(r.src), static_cast<uint64_t>(r.length)));
    next += r.length;
  }
  if (next != shard_numel) return InvalidArgument(where + " leaves shard element " + Str(next) + " uncovered");
  return slice;
}

// Per-rank widths of every sub-parameter: the recorded ones (version >= 0.4), or the even split
// older metadata implies.
Result<std::vector<std::vector<int64_t>>> AutoTpWidths(const AutoTpRestoreMeta& meta, const std::vector<int64_t>& sizes,
                                                       int tp_size) {
  std::vector<std::vector<int64_t>> widths;
  // Older metadata has no widths, so only an even split can be reconstructed from it.
  if (meta.version < kAutoTpMetaVersion) {
    for (size_t j = 0; j < sizes.size(); ++j) {
      if (sizes[j] % tp_size != 0) {
        return InvalidArgument("T=" + Str(tp_size) + " does not divide AutoTP sub-parameter " + Str(j) + " of size " +
                               Str(sizes[j]) + ", and metadata version " + DoubleString(meta.version) +
                               " < 0.4 records no sub_param_shard_widths");
      }
      widths.emplace_back(static_cast<size_t>(tp_size), sizes[j] / tp_size);
    }
    return widths;
  }
  if (meta.sub_param_shard_widths.size() != sizes.size()) {
    return InvalidArgument("AutoTP sub_param_shard_widths has " + Str(meta.sub_param_shard_widths.size()) +
                           " entries for " + Str(sizes.size()) + " sub-parameters " + ListString(sizes));
  }
  for (size_t j = 0; j < sizes.size(); ++j) {
    const std::vector<int64_t>& w = meta.sub_param_shard_widths[j];
    const std::string what = "AutoTP shard widths " + ListString(w) + " of sub-parameter " + Str(j);
    if (w.size() != static_cast<size_t>(tp_size)) {
      return InvalidArgument(what + " do not have one entry per rank (T=" + Str(tp_size) + ")");
    }
    RS_ASSIGN_OR_RETURN(int64_t sum, SumSizes(w, what));
    if (sum != sizes[j]) return InvalidArgument(what + " sum to " + Str(sum) + ", not its size " + Str(sizes[j]));
  }
  return meta.sub_param_shard_widths;
}

// §3.3 _resolve_autotp_partition. nullopt means "not applicable": the category rules apply.
Result<std::optional<TpSlice>> AutoTpSlice(const Shape& full, int64_t numel, const AutoTpRestoreMeta& meta, int tp_size,
                                           int tp_rank) {
  if (!meta.unsupported_reason.empty()) {
    return Unsupported("AutoTP parameter cannot be restored from a universal checkpoint: " + meta.unsupported_reason);
  }
  if (meta.affine_map) {
    const auto it = meta.affine_map->ranks.find(tp_rank);
    RS_ASSIGN_OR_RETURN(int64_t map_numel, ValidateShape(meta.affine_map->logical_shape, "affine map logical_shape"));
    // DeepSpeed uses the map only when it names this rank and describes a tensor of this size; it
    // is checked before `replicated` because layouts with no generic rule (segmented or block-picked
    // fused QKV) publish only the map.
    if (it != meta.affine_map->ranks.end() && map_numel == numel) {
      RS_ASSIGN_OR_RETURN(TpSlice s, AffineSlice(it->second, tp_rank, numel));
      return std::optional<TpSlice>(std::move(s));
    }
  }
  if (meta.replicated) {
    if (meta.partition_dim) {
      return InvalidArgument("AutoTP metadata is replicated but has partition_dim " + Str(*meta.partition_dim));
    }
    return std::optional<TpSlice>(Whole(full, numel));
  }
  if (!meta.partition_dim || !meta.logical_shape) return std::optional<TpSlice>();
  RS_ASSIGN_OR_RETURN(Shape view_shape, ResolveView(*meta.logical_shape, numel, full, "AutoTP logical_shape",
                                                    StatusCode::kInvalidArgument));
  RS_ASSIGN_OR_RETURN(int pd, NormalizeDim(*meta.partition_dim, view_shape.size(), "AutoTP partition_dim"));
  const int64_t dim_size = view_shape[static_cast<size_t>(pd)];
  std::vector<Block> blocks;
  std::optional<std::vector<int64_t>> sizes = meta.sub_param_sizes;
  if (!sizes && meta.sub_param_shape) {
    if (static_cast<size_t>(pd) >= meta.sub_param_shape->size()) {
      return InvalidArgument("AutoTP sub_param_shape has no entry at partition_dim " + Str(pd));
    }
    sizes = (*meta.sub_param_shape)[static_cast<size_t>(pd)];
  }
  const std::string of_dim = "dim " + Str(pd) + " of logical shape " + ListString(view_shape) + " is " + Str(dim_size);
  if (sizes) {
    RS_ASSIGN_OR_RETURN(int64_t sum, SumSizes(*sizes, "AutoTP sub-parameter sizes"));
    if (sum != dim_size) {
      return InvalidArgument("AutoTP sub-parameter sizes " + ListString(*sizes) + " sum to " + Str(sum) + ", but " +
                             of_dim);
    }
    RS_ASSIGN_OR_RETURN(auto widths, AutoTpWidths(meta, *sizes, tp_size));
    int64_t offset = 0;
    for (size_t j = 0; j < sizes->size(); ++j) {
      blocks.push_back(WidthBlock(widths[j], offset, tp_rank));
      offset += (*sizes)[j];
    }
  } else if (meta.partition_sizes) {
    // DeepSpeed only bounds-checks the narrow; a list that does not tile the dim would silently
    // drop or overlap data across ranks, so it is refused here.
    const std::vector<int64_t>& ps = *meta.partition_sizes;
    if (ps.size() != static_cast<size_t>(tp_size)) {
      return InvalidArgument("AutoTP partition_sizes " + ListString(ps) +
                             " do not have one entry per rank (T=" + Str(tp_size) + ")");
    }
    RS_ASSIGN_OR_RETURN(int64_t sum, SumSizes(ps, "AutoTP partition_sizes"));
    if (sum != dim_size) {
      return InvalidArgument("AutoTP partition_sizes " + ListString(ps) + " sum to " + Str(sum) + ", but " + of_dim);
    }
    blocks.push_back(WidthBlock(ps, 0, tp_rank));
  } else {
    RS_ASSIGN_OR_RETURN(Block b, EvenBlock(0, dim_size, tp_size, tp_rank,
                                           "dim " + Str(pd) + " of size " + Str(dim_size) +
                                               " (AutoTP partition_dim, no partition_sizes)"));
    blocks.push_back(b);
  }
  RS_ASSIGN_OR_RETURN(TpSlice s, NarrowCat(Source{view_shape, static_cast<uint64_t>(numel)}, pd, blocks, full));
  return std::optional<TpSlice>(std::move(s));
}

// The vocab rule of §3.2: pad dim 0 with zero rows to the target's padded size, then split.
Result<TpSlice> VocabSlice(const Shape& full, int64_t numel, const UcpCategory& category,
                           std::optional<int64_t> padded_vocab_rows, int tp_size, int tp_rank) {
  if (full.size() != 2) {
    return Unsupported("vocab_tensor of shape " + ListString(full) + ": DeepSpeed pads the rows of 2-D tensors only");
  }
  const int64_t rows = full[0];
  int64_t padded = 0;
  // The stored tensor has no padding left (the converter strips it), so the target's is re-added.
  if (padded_vocab_rows) {
    padded = *padded_vocab_rows;
  } else if (!AddOk(rows, (tp_size - rows % tp_size) % tp_size, &padded)) {
    return Overflow("padded vocab rows");
  }
  if (padded < rows) {
    return InvalidArgument("padded vocab rows " + Str(padded) + " < universal vocab rows " + Str(rows));
  }
  if (padded % tp_size != 0) {
    return InvalidArgument("padded vocab rows " + Str(padded) + " is not a multiple of T=" + Str(tp_size));
  }
  // DeepSpeed's `F.shape == p.shape` shortcut: a local shape equal to the stored one means the
  // whole, unpadded tensor on every rank.
  if (padded / tp_size == rows) return Whole(full, numel);
  RS_ASSIGN_OR_RETURN(int cd, NormalizeDim(category.cat_dim.value_or(0), 2, "cat_dim"));
  if (category.sub_param_shape || cd != 0) {
    return Unsupported("vocab_tensor of shape " + ListString(full) +
                       " is not split on dim 0; DeepSpeed derives its padding from the local rows");
  }
  Source src{{padded, full[1]}, static_cast<uint64_t>(numel)};
  RS_RETURN_IF_ERROR(ValidateShape(src.shape, "padded vocab shape").status());
  return CategorySlice(src, category, tp_size, tp_rank, src.shape);
}

bool ContainsAny(std::string_view name, std::initializer_list<std::string_view> needles) {
  for (std::string_view n : needles) {
    if (name.find(n) != std::string_view::npos) return true;
  }
  return false;
}

Status ValidateTp(int tp_size, int tp_rank) {
  if (tp_size < 1 || tp_size > kMaxTpSize) {
    return InvalidArgument("T=" + Str(tp_size) + " is outside [1, " + Str(kMaxTpSize) + "]");
  }
  if (tp_rank < 0 || tp_rank >= tp_size) {
    return InvalidArgument("TP rank " + Str(tp_rank) + " is outside [0, T=" + Str(tp_size) + ")");
  }
  return Status::Ok();
}

}  // namespace

bool IsReplicatedCategory(const UcpCategory& category) {
  return !category.cat_dim && category.n_sub_params <= 1 && !category.sub_param_shape && !category.vocab_tensor;
}

Result<TpSlice> SliceForRank(const std::vector<int64_t>& full_shape, const UcpCategory& category,
                             const AutoTpRestoreMeta* autotp_meta, std::optional<int64_t> padded_vocab_rows,
                             int tp_size, int tp_rank) {
  RS_RETURN_IF_ERROR(ValidateTp(tp_size, tp_rank));
  RS_ASSIGN_OR_RETURN(int64_t numel, ValidateShape(full_shape, "universal tensor shape"));
  const Source src{full_shape, static_cast<uint64_t>(numel)};
  // Metadata pins the target layout, so DeepSpeed skips both the shape shortcut and vocab padding.
  if (autotp_meta != nullptr) {
    RS_ASSIGN_OR_RETURN(std::optional<TpSlice> s, AutoTpSlice(full_shape, numel, *autotp_meta, tp_size, tp_rank));
    if (s) return std::move(*s);
    return CategorySlice(src, category, tp_size, tp_rank, full_shape);
  }
  if (IsReplicatedCategory(category)) return Whole(full_shape, numel);
  if (category.vocab_tensor) return VocabSlice(full_shape, numel, category, padded_vocab_rows, tp_size, tp_rank);
  return CategorySlice(src, category, tp_size, tp_rank, full_shape);
}

Result<int64_t> GetShardSize(int64_t total, int tp_size, std::string_view name, int rank,
                             std::optional<int64_t> num_kv_heads, int64_t tp_grain_size) {
  RS_RETURN_IF_ERROR(ValidateTp(tp_size, rank));
  if (total < 0) return InvalidArgument("AutoTP shard size of a negative total " + Str(total));
  if (num_kv_heads && *num_kv_heads < 1) return InvalidArgument("num_kv_heads " + Str(*num_kv_heads) + " < 1");
  if (tp_grain_size < 1) return InvalidArgument("tp_grain_size " + Str(tp_grain_size) + " < 1");
  // Python tests `"mlp" in str(name)` (substring) but `str(name) in [...]` (exact) for the last
  // linear layers; an empty name stands for None, which matches nothing.
  // The kv-head rule keeps attention heads whole; MLP and output layers prefer a near-even split.
  const bool moe_mlp = ContainsAny(name, {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"});
  const bool last_linear = name == "lm_head" || name == "embed_out";
  const int64_t t = tp_size, r = rank;
  if (num_kv_heads && total % *num_kv_heads == 0 && name.find("mlp") == std::string_view::npos && !last_linear &&
      !moe_mlp) {
    const int64_t heads = *num_kv_heads;
    const int64_t mine = heads / t + (r < heads % t ? 1 : 0);
    return total / heads * mine;  // exact: heads divides total; Python's total * mine // heads
  }
  if (total >= tp_grain_size) {
    const int64_t grains = total / tp_grain_size, rem = total % tp_grain_size;
    const int64_t shard = (grains / t + (r < grains % t ? 1 : 0)) * tp_grain_size;
    return r == t - 1 ? shard + rem : shard;  // the sub-grain tail goes to the last rank
  }
  return total / t + (r < total % t ? 1 : 0);
}

Result<std::vector<int64_t>> GetShardSizeList(int64_t total, int tp_size, std::string_view name,
                                              std::optional<int64_t> num_kv_heads, int64_t tp_grain_size) {
  RS_RETURN_IF_ERROR(ValidateTp(tp_size, 0));
  std::vector<int64_t> sizes;
  int64_t sum = 0;
  for (int r = 0; r < tp_size; ++r) {
    RS_ASSIGN_OR_RETURN(int64_t s, GetShardSize(total, tp_size, name, r, num_kv_heads, tp_grain_size));
    sizes.push_back(s);
    sum += s;  // each s <= total, and they sum to total
  }
  if (sum != total) {
    return Internal("AutoTP shard sizes " + ListString(sizes) + " do not sum to " + Str(total));
  }
  return sizes;
}

Result<std::vector<std::vector<int64_t>>> SubParamShardWidths(const std::vector<int64_t>& sizes, int tp_size,
                                                              std::string_view name,
                                                              std::optional<int64_t> num_kv_heads,
                                                              int64_t tp_grain_size) {
  RS_RETURN_IF_ERROR(ValidateTp(tp_size, 0));
  std::vector<std::vector<int64_t>> widths;
  for (int64_t size : sizes) {
    RS_ASSIGN_OR_RETURN(std::vector<int64_t> w, GetShardSizeList(size, tp_size, name, num_kv_heads, tp_grain_size));
    widths.push_back(std::move(w));
  }
  return widths;
}

}  // namespace reshard::layout
