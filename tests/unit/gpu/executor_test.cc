#include "gpu/executor.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu/host_backend.h"
#include "reshard/view/dtype_convert.h"

namespace reshard::gpu {
namespace {

using plan::Conversion;
using plan::ExtentList;
using plan::Source;
using plan::StoragePlan;
using view::Gather;

// A source file: a 100-byte header, then float32 tensor A (kA elements: i * 0.37 - 50, plus NaN,
// infinities and values that round to ties), 28 bytes of filler, then float32 tensor B (kB
// elements). Offsets 100 and 4 * kA + 128 keep the floats 4-aligned but not 64-aligned, so
// chunk starts are aligned down.
constexpr uint64_t kA = 3000;
constexpr uint64_t kB = 777;
constexpr uint64_t kOffsetA = 100;
constexpr uint64_t kOffsetB = kOffsetA + kA * 4 + 28;

class SourceFile {
 public:
  SourceFile() {
    char name[] = "/tmp/reshardfs_executor_XXXXXX";
    const int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    path_ = name;
    for (uint64_t i = 0; i < kA; ++i) a_.push_back(static_cast<float>(i) * 0.37f - 50.0f);
    a_[7] = std::numeric_limits<float>::quiet_NaN();
    a_[8] = std::numeric_limits<float>::infinity();
    a_[9] = -std::numeric_limits<float>::infinity();
    a_[10] = 1.00390625f;  // exactly between two bf16 values: ties to even
    a_[11] = 65520.0f;     // rounds to fp16 infinity
    a_[12] = 1e-7f;        // an fp16 subnormal
    for (uint64_t i = 0; i < kB; ++i) b_.push_back(1000.0f + static_cast<float>(i));
    std::string bytes(kOffsetA, 'H');
    bytes.append(reinterpret_cast<const char*>(a_.data()), kA * 4);
    bytes.append(28, 'F');
    bytes.append(reinterpret_cast<const char*>(b_.data()), kB * 4);
    REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  ~SourceFile() { ::unlink(path_.c_str()); }

  std::vector<Source> sources() const {
    return {Source{path_, kOffsetA, format::DType::kFloat32, kA}, Source{path_, kOffsetB, format::DType::kFloat32, kB}};
  }
  const std::string& path() const { return path_; }
  const std::vector<float>& a() const { return a_; }
  const std::vector<float>& b() const { return b_; }

 private:
  std::string path_;
  std::vector<float> a_, b_;
};

StoragePlan Plan(const std::string& key, format::DType dtype, Conversion conversion, ExtentList extents) {
  StoragePlan s;
  s.key = key;
  s.dtype = dtype;
  s.conversion = conversion;
  s.numel = plan::NumElements(extents);
  s.extents = std::move(extents);
  return s;
}

// The expected float32 elements of `extents`, by walking every run element by element.
std::vector<float> Expected(const SourceFile& f, const ExtentList& extents) {
  std::vector<float> out;
  for (const plan::Extent& e : extents) {
    const std::vector<float>& src = e.source == 0 ? f.a() : f.b();
    view::ForEachRun({e.gather}, [&](uint64_t, uint64_t first, uint64_t n, bool zero) {
      for (uint64_t i = 0; i < n; ++i) out.push_back(zero ? 0.0f : src[first + i]);
    });
  }
  return out;
}

// A column slice of A seen as [60, 50] (rows of 20, stride 50), zeros, B whole, a run of A.
ExtentList Mixed() {
  ExtentList e;
  plan::AppendExtents(e, 0, {Gather::Source(15, 20, 60, 50)});
  plan::AppendZeros(e, 33);
  plan::AppendExtents(e, 1, {Gather::Source(0, kB)});
  plan::AppendExtents(e, 0, {Gather::Source(5, 900)});
  return e;
}

bool SameBits(const std::vector<float>& got, const std::vector<float>& want) {
  return got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size() * 4) == 0;
}

TEST_CASE("executor copies strided gathers, zeros and shared source bytes exactly", "[executor]") {
  SourceFile f;
  const StoragePlan mixed = Plan("mixed", format::DType::kFloat32, Conversion::kCopy, Mixed());
  ExtentList overlap;  // reads bytes `mixed` reads too: one read, two destinations
  plan::AppendExtents(overlap, 0, {Gather::Source(0, kA)});
  const StoragePlan whole = Plan("whole", format::DType::kFloat32, Conversion::kCopy, overlap);

  for (const uint64_t chunk : {uint64_t{128}, uint64_t{4096}, uint64_t{8} << 20}) {
    for (const uint64_t gap : {uint64_t{0}, uint64_t{1} << 20}) {
      for (const size_t lanes : {size_t{1}, size_t{3}}) {
        CAPTURE(chunk, gap, lanes);
        std::vector<float> out1(mixed.numel, -1.0f), out2(whole.numel, -1.0f);
        ExecutorOptions options;
        options.chunk_bytes = chunk;
        options.max_gap_bytes = gap;
        options.lanes = lanes;
        auto ex = Executor::Create(f.sources(), {{&mixed, out1.data()}, {&whole, out2.data()}}, options);
        REQUIRE(ex.ok());
        HostBackend backend;
        auto stats = ex->Run(backend);
        REQUIRE(stats.ok());
        CHECK(SameBits(out1, Expected(f, mixed.extents)));
        CHECK(SameBits(out2, Expected(f, whole.extents)));
        CHECK(stats->bytes_copied == (mixed.numel - 33 + whole.numel) * 4);
        CHECK(stats->bytes_zeroed == 33 * 4);
        if (gap > 0 && chunk == (uint64_t{8} << 20)) {
          // Everything within 1 MiB of everything else: one sequential read of both tensors.
          CHECK(stats->chunks == 1);
          CHECK(stats->bytes_read == kOffsetB + kB * 4 - kOffsetA / 64 * 64);
        }
        if (chunk == 128) CHECK(stats->chunks > 100);
      }
    }
  }
}

TEST_CASE("executor rounds fp32 to bf16 and fp16 like dtype_convert", "[executor]") {
  SourceFile f;
  ExtentList e;
  plan::AppendExtents(e, 0, {Gather::Source(3, 17, 40, 70)});
  const StoragePlan bf16 = Plan("bf16", format::DType::kBFloat16, Conversion::kFp32ToBf16, e);
  const StoragePlan fp16 = Plan("fp16", format::DType::kFloat16, Conversion::kFp32ToFp16, e);
  std::vector<uint16_t> got_bf16(bf16.numel), got_fp16(fp16.numel);
  ExecutorOptions options;
  options.chunk_bytes = 192;
  auto ex = Executor::Create(f.sources(), {{&bf16, got_bf16.data()}, {&fp16, got_fp16.data()}}, options);
  REQUIRE(ex.ok());
  HostBackend backend;
  REQUIRE(ex->Run(backend).ok());
  const std::vector<float> in = Expected(f, e);
  std::vector<uint16_t> want_bf16(in.size()), want_fp16(in.size());
  view::Float32ToBFloat16(in.data(), want_bf16.data(), in.size());
  view::Float32ToFloat16(in.data(), want_fp16.data(), in.size());
  CHECK(got_bf16 == want_bf16);
  CHECK(got_fp16 == want_fp16);
  CHECK(got_bf16[4] == 0x7FC0);  // source element 7: NaN
}

TEST_CASE("executor refuses bad plans and reports short reads", "[executor]") {
  SourceFile f;
  std::vector<float> out(4096);
  HostBackend backend;

  SECTION("an extent past its source") {
    ExtentList e;
    plan::AppendExtents(e, 1, {Gather::Source(kB - 3, 4)});
    const StoragePlan s = Plan("past", format::DType::kFloat32, Conversion::kCopy, e);
    auto ex = Executor::Create(f.sources(), {{&s, out.data()}});
    REQUIRE(ex.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(ex.status().message(), Catch::Contains("reads past the 777 elements"));
  }
  SECTION("a conversion its dtypes do not allow") {
    ExtentList e;
    plan::AppendExtents(e, 0, {Gather::Source(0, 4)});
    const StoragePlan s = Plan("bad", format::DType::kFloat32, Conversion::kFp32ToBf16, e);
    auto ex = Executor::Create(f.sources(), {{&s, out.data()}});
    REQUIRE(ex.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(ex.status().message(), Catch::Contains("cannot be filled from"));
  }
  SECTION("a missing source") {
    ExtentList e;
    plan::AppendExtents(e, 2, {Gather::Source(0, 4)});
    const StoragePlan s = Plan("missing", format::DType::kFloat32, Conversion::kCopy, e);
    CHECK(Executor::Create(f.sources(), {{&s, out.data()}}).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("a destination without a buffer, and bad options") {
    ExtentList e;
    plan::AppendExtents(e, 0, {Gather::Source(0, 4)});
    const StoragePlan s = Plan("null", format::DType::kFloat32, Conversion::kCopy, e);
    CHECK(Executor::Create(f.sources(), {{&s, nullptr}}).status().code() == StatusCode::kInvalidArgument);
    ExecutorOptions options;
    options.chunk_bytes = 100;
    CHECK(Executor::Create(f.sources(), {{&s, out.data()}}, options).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("a source longer than its file") {
    std::vector<Source> sources = f.sources();
    sources[1].numel = kB + 1;
    auto ex = Executor::Create(sources, {});
    REQUIRE(ex.status().code() == StatusCode::kCorrupt);
    CHECK_THAT(ex.status().message(), Catch::Contains("run past the file"));
  }
  SECTION("a file truncated after the plan") {
    ExtentList e;
    plan::AppendExtents(e, 1, {Gather::Source(0, kB)});
    const StoragePlan s = Plan("b", format::DType::kFloat32, Conversion::kCopy, e);
    auto ex = Executor::Create(f.sources(), {{&s, out.data()}});
    REQUIRE(ex.ok());
    REQUIRE(::truncate(f.path().c_str(), static_cast<off_t>(kOffsetB + 10)) == 0);
    auto stats = ex->Run(backend);
    REQUIRE(stats.status().code() == StatusCode::kIoError);
    CHECK_THAT(stats.status().message(), Catch::Contains("truncated after the plan was made"));
  }
}

}  // namespace
}  // namespace reshard::gpu
