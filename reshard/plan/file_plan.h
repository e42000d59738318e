// FilePlan: one target file as the planner describes it, before any byte layout.
//
// A target file (a model-states or optimizer-states torch.save file of one rank) is its inert
// pickle tree plus one StoragePlan per storage the tree's tensors name. A StoragePlan says how
// to compute the storage's bytes: its elements in order, as extents over the universal
// checkpoint's files (plan/extent.h), optionally converted fp32 -> bf16/fp16 on the way. The
// zip bytes around them are laid out later (plan/planned_file.h). Plain values, immutable once
// planned; safe to share between threads.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "reshard/format/dtype.h"
#include "reshard/format/pickle_value.h"
#include "reshard/plan/extent.h"

namespace reshard::plan {

// How source elements become stored elements.
enum class Conversion : uint8_t {
  kCopy,        // same dtype, bytes copied
  kFp32ToBf16,  // float32 source, round to nearest even (view/dtype_convert.h)
  kFp32ToFp16,
};

struct StoragePlan {
  std::string key;  // the persistent-id key the tree names ("0", "1", ... in pickling order)
  format::DType dtype = format::DType::kFloat32;  // of the stored elements
  uint64_t numel = 0;                             // stored elements == NumElements(extents)
  Conversion conversion = Conversion::kCopy;
  ExtentList extents;  // in source elements, destination order; zeros for padding

  uint64_t nbytes() const { return numel * format::ItemSize(dtype); }
};

// A storage of `dtype` holding every element of `extents`, converted from its sources by `conversion`.
inline StoragePlan MakeStoragePlan(std::string key, format::DType dtype, Conversion conversion, ExtentList extents) {
  StoragePlan s;
  s.key = std::move(key);
  s.dtype = dtype;
  s.numel = NumElements(extents);
  s.conversion = conversion;
  s.extents = std::move(extents);
  return s;
}

struct FilePlan {
  std::string path;  // relative to the served root, e.g. "global_step3/mp_rank_00_model_states.pt"
  format::PickleTree tree;
  std::vector<StoragePlan> storages;  // in the order the tree first names them
};

}  // namespace reshard::plan
