#include "reshard/ucp/source_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <new>

#include "reshard/base/checked_math.h"
#include "reshard/base/unique_fd.h"

namespace reshard::ucp {
namespace {

constexpr size_t kChunkBytes = size_t{8} << 20;

// An IEEE float is NaN or infinite exactly when its exponent bits are all ones; testing the bits
// needs no conversion of bf16/fp16 and lets the compiler vectorise the count.
template <typename Bits>
uint64_t CountAllOnes(const uint8_t* data, size_t n, Bits exponent_mask) {
  uint64_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    Bits v;
    std::memcpy(&v, data + i * sizeof(Bits), sizeof(Bits));
    count += (v & exponent_mask) == exponent_mask;
  }
  return count;
}

uint64_t CountNonFinite(format::DType dtype, const uint8_t* data, size_t n) {
  switch (dtype) {
    case format::DType::kFloat64: return CountAllOnes<uint64_t>(data, n, 0x7ff0000000000000ull);
    case format::DType::kFloat32: return CountAllOnes<uint32_t>(data, n, 0x7f800000u);
    case format::DType::kFloat16: return CountAllOnes<uint16_t>(data, n, uint16_t{0x7c00});
    case format::DType::kBFloat16: return CountAllOnes<uint16_t>(data, n, uint16_t{0x7f80});
    default: return 0;  // LocateTensor admits only the four float dtypes
  }
}

// Reads one contiguous run [offset, offset + nbytes) of `path` and counts its non-finite values;
// a problem with the file becomes a line of `problems` (false).
bool CheckRun(const std::string& where, const std::string& path, uint64_t offset, uint64_t nbytes,
              format::DType dtype, uint8_t* buffer, uint64_t& non_finite, std::vector<std::string>& problems) {
  const uint64_t itemsize = format::ItemSize(dtype);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
    problems.push_back(where + ": " + path + ": " + std::strerror(errno));
    return false;
  }
  if (!RangeFits(offset, nbytes, static_cast<uint64_t>(st.st_size))) {
    problems.push_back(where + ": " + path + ": its tensor needs bytes [" + std::to_string(offset) + ", +" +
                       std::to_string(nbytes) + ") but the file holds " + std::to_string(st.st_size));
    return false;
  }
  const size_t chunk = kChunkBytes / itemsize * itemsize;
  for (uint64_t done = 0; done < nbytes;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk, nbytes - done));
    const ssize_t n = ::pread(fd.get(), buffer, want, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      problems.push_back(where + ": " + path + ": cannot read at offset " + std::to_string(offset + done) + ": " +
                         (n < 0 ? std::strerror(errno) : "the file ended"));
      return false;
    }
    const size_t whole = static_cast<size_t>(n) / itemsize * itemsize;  // a split element is read again
    non_finite += CountNonFinite(dtype, buffer, whole / itemsize);
    done += whole;
  }
  return true;
}

// Reads the tensor `t` (whole, or its pieces of a native source) and adds it to `totals`.
void CheckTensor(const std::string& param, const std::string& key, const StateTensor& t, uint8_t* buffer,
                 StateTotals& totals, std::vector<std::string>& problems) {
  totals.tensors += 1;
  totals.elements += t.numel();
  totals.bytes += t.nbytes;
  const std::string where = "parameter '" + param + "' " + key;
  const uint64_t itemsize = format::ItemSize(t.dtype);
  uint64_t non_finite = 0;
  if (t.computed) {  // the mean of the TP slices, computed from their bytes when the source was opened
    non_finite = CountNonFinite(t.dtype, reinterpret_cast<const uint8_t*>(t.computed->data()), t.numel());
  } else if (t.pieces.empty()) {
    if (!CheckRun(where, t.path, t.data_offset, t.nbytes, t.dtype, buffer, non_finite, problems)) return;
  } else {
    for (const TensorPiece& p : t.pieces) {
      if (!CheckRun(where, p.path, p.data_offset, p.numel * itemsize, t.dtype, buffer, non_finite, problems)) return;
    }
  }
  totals.non_finite += non_finite;
  if (non_finite > 0) {
    problems.push_back(where + ": " + t.path + ": " + std::to_string(non_finite) + " of " + std::to_string(t.numel()) +
                       " values are NaN or infinite");
  }
}

}  // namespace

Result<SourceReport> CheckSource(const UniversalCheckpoint& checkpoint) {
  std::unique_ptr<uint8_t[]> buffer(new (std::nothrow) uint8_t[kChunkBytes]);
  if (buffer == nullptr) return ResourceExhausted("cannot allocate the 8 MiB read buffer");
  SourceReport report;
  for (const ParamEntry& param : checkpoint.params()) {
    report.params += 1;
    if (param.listed) {
      report.listed_params += 1;
      for (const char* needed : {"exp_avg", "exp_avg_sq"}) {
        if (param.states.count(needed) == 0) {
          report.problems.push_back("parameter '" + param.name + "': no " + needed + ".pt in " + param.dir +
                                    " (it is trained: param_shapes lists it)");
        }
      }
    }
    for (const auto& [key, tensor] : param.states) {
      CheckTensor(param.name, key, tensor, buffer.get(), report.states[key], report.problems);
    }
    if (param.step) {
      StateTotals& totals = report.states["step"];
      if (param.step->is_tensor) {
        CheckTensor(param.name, "step", param.step->tensor, buffer.get(), totals, report.problems);
      } else {
        totals.tensors += 1;
        totals.elements += 1;
      }
    }
  }
  return report;
}

}  // namespace reshard::ucp
