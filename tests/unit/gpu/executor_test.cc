#include "gpu/executor.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpu/discard_backend.h"
#include "gpu/host_backend.h"
#include "gpu/node_executor.h"
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
    return {Source{path_, kOffsetA, format::DType::kFloat32, kA, nullptr},
            Source{path_, kOffsetB, format::DType::kFloat32, kB, nullptr}};
  }
  const std::string& path() const { return path_; }
  const std::vector<float>& a() const { return a_; }
  const std::vector<float>& b() const { return b_; }

 private:
  std::string path_;
  std::vector<float> a_, b_;
};


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
  const StoragePlan mixed = plan::MakeStoragePlan("mixed", format::DType::kFloat32, Conversion::kCopy, Mixed());
  ExtentList overlap;  // reads bytes `mixed` reads too: one read, two destinations
  plan::AppendExtents(overlap, 0, {Gather::Source(0, kA)});
  const StoragePlan whole = plan::MakeStoragePlan("whole", format::DType::kFloat32, Conversion::kCopy, overlap);

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

TEST_CASE("discard backend: the same reads as a host fill, and no destination byte written", "[executor]") {
  SourceFile f;
  const StoragePlan mixed = plan::MakeStoragePlan("mixed", format::DType::kFloat32, Conversion::kCopy, Mixed());
  ExecutorOptions options;
  options.chunk_bytes = 4096;
  options.lanes = 2;
  std::vector<float> hosted(mixed.numel, -1.0f), discarded(mixed.numel, -1.0f);
  auto host = Executor::Create(f.sources(), {{&mixed, hosted.data()}}, options);
  auto discard = Executor::Create(f.sources(), {{&mixed, discarded.data()}}, options);
  REQUIRE(host.ok());
  REQUIRE(discard.ok());
  HostBackend host_backend;
  DiscardBackend discard_backend;
  auto host_stats = host->Run(host_backend);
  auto discard_stats = discard->Run(discard_backend);
  REQUIRE(host_stats.ok());
  REQUIRE(discard_stats.ok());
  CHECK(discard_stats->chunks == host_stats->chunks);
  CHECK(discard_stats->bytes_read == host_stats->bytes_read);
  CHECK(SameBits(hosted, Expected(f, mixed.extents)));
  CHECK(SameBits(discarded, std::vector<float>(mixed.numel, -1.0f)));  // zero fills skipped too

  // It does read: a file cut short after the plan fails the fill.
  REQUIRE(::truncate(f.path().c_str(), static_cast<off_t>(kOffsetB + 10)) == 0);
  CHECK(discard->Run(discard_backend).status().code() == StatusCode::kIoError);
}

TEST_CASE("host backend reads chunks of plain, disjoint copies straight into the destinations", "[executor]") {
  SourceFile f;
  // One storage, no byte read twice (Mixed() reads part of A twice): every chunk is direct, the
  // gaps between rows included.
  ExtentList disjoint;
  plan::AppendExtents(disjoint, 0, {Gather::Source(15, 20, 60, 50)});
  plan::AppendZeros(disjoint, 33);
  plan::AppendExtents(disjoint, 1, {Gather::Source(0, kB)});
  const StoragePlan mixed = plan::MakeStoragePlan("mixed", format::DType::kFloat32, Conversion::kCopy, disjoint);
  for (const uint64_t chunk : {uint64_t{128}, uint64_t{4096}, uint64_t{8} << 20}) {
    for (const uint64_t gap : {uint64_t{0}, uint64_t{1} << 20}) {
      for (const size_t lanes : {size_t{1}, size_t{3}}) {
        CAPTURE(chunk, gap, lanes);
        std::vector<float> out(mixed.numel, -1.0f);
        ExecutorOptions options;
        options.chunk_bytes = chunk;
        options.max_gap_bytes = gap;
        options.lanes = lanes;
        auto ex = Executor::Create(f.sources(), {{&mixed, out.data()}}, options);
        REQUIRE(ex.ok());
        HostBackend backend;
        auto stats = ex->Run(backend);
        REQUIRE(stats.ok());
        CHECK(SameBits(out, Expected(f, mixed.extents)));
        CHECK(stats->bytes_read_direct == stats->bytes_read);
      }
    }
  }

  // A bf16 copy of bytes an fp32 storage reads too: those chunks go through staging.
  ExtentList run;
  plan::AppendExtents(run, 0, {Gather::Source(0, kA)});
  const StoragePlan fp32 = plan::MakeStoragePlan("fp32", format::DType::kFloat32, Conversion::kCopy, run);
  const StoragePlan bf16 = plan::MakeStoragePlan("bf16", format::DType::kBFloat16, Conversion::kFp32ToBf16, run);
  ExtentList tail;
  plan::AppendExtents(tail, 1, {Gather::Source(0, kB)});
  const StoragePlan b = plan::MakeStoragePlan("b", format::DType::kFloat32, Conversion::kCopy, tail);
  std::vector<float> got_fp32(kA), got_b(kB);
  std::vector<uint16_t> got_bf16(kA), want_bf16(kA);
  ExecutorOptions options;
  options.chunk_bytes = 4096;
  options.max_gap_bytes = 0;
  auto ex = Executor::Create(f.sources(), {{&fp32, got_fp32.data()}, {&bf16, got_bf16.data()}, {&b, got_b.data()}},
                             options);
  REQUIRE(ex.ok());
  HostBackend backend;
  auto stats = ex->Run(backend);
  REQUIRE(stats.ok());
  CHECK(SameBits(got_fp32, f.a()));
  CHECK(SameBits(got_b, f.b()));
  view::Float32ToBFloat16(f.a().data(), want_bf16.data(), kA);
  CHECK(got_bf16 == want_bf16);
  CHECK(stats->bytes_read_direct > 0);
  CHECK(stats->bytes_read_direct < stats->bytes_read);

  // A computed source: the direct copies come from its bytes in memory.
  auto bytes = std::make_shared<std::string>(8, 'x');
  bytes->append(reinterpret_cast<const char*>(f.b().data()), kB * 4);
  const std::vector<Source> computed = {Source{"/nonexistent/computed", 8, format::DType::kFloat32, kB, bytes}};
  ExtentList rows;
  plan::AppendExtents(rows, 0, {Gather::Source(3, 10, 20, 30)});
  const StoragePlan strided = plan::MakeStoragePlan("strided", format::DType::kFloat32, Conversion::kCopy, rows);
  std::vector<float> got(strided.numel), want;
  for (uint64_t r = 0; r < 20; ++r) {
    for (uint64_t k = 0; k < 10; ++k) want.push_back(f.b()[3 + r * 30 + k]);
  }
  auto from_memory = Executor::Create(computed, {{&strided, got.data()}}, options);
  REQUIRE(from_memory.ok());
  auto memory_stats = from_memory->Run(backend);
  REQUIRE(memory_stats.ok());
  CHECK(memory_stats->bytes_read_direct == memory_stats->bytes_read);
  CHECK(SameBits(got, want));

  // A file cut short after the plan fails a direct read as it fails a staged one.
  std::vector<float> out(mixed.numel);
  auto cut = Executor::Create(f.sources(), {{&mixed, out.data()}}, options);
  REQUIRE(cut.ok());
  REQUIRE(::truncate(f.path().c_str(), static_cast<off_t>(kOffsetB + 10)) == 0);
  auto failed = cut->Run(backend);
  REQUIRE(failed.status().code() == StatusCode::kIoError);
  CHECK_THAT(failed.status().message(), Catch::Contains("truncated after the plan was made"));
}

TEST_CASE("DirectReadable: plain, ordered, disjoint copies that fit one preadv", "[executor]") {
  std::vector<float> sink(4);
  auto op = [&](uint64_t at, uint64_t n, Conversion c = Conversion::kCopy) { return CopyOp{at, n, sink.data(), c}; };
  const std::vector<CopyOp> gaps = {op(0, 8), op(8, 8), op(64, 4)};
  CHECK(DirectReadable(gaps.data(), gaps.size()));
  const std::vector<CopyOp> overlap = {op(0, 8), op(4, 8)};
  CHECK_FALSE(DirectReadable(overlap.data(), overlap.size()));
  const std::vector<CopyOp> converted = {op(0, 8), op(8, 8, Conversion::kFp32ToBf16)};
  CHECK_FALSE(DirectReadable(converted.data(), converted.size()));
  CHECK_FALSE(DirectReadable(nullptr, 0));
  std::vector<CopyOp> many;  // a gap before each: two buffers a piece, past IOV_MAX
  for (uint64_t i = 0; i < 600; ++i) many.push_back(op(i * 16 + 8, 4));
  CHECK_FALSE(DirectReadable(many.data(), many.size()));
  many.resize(500);
  CHECK(DirectReadable(many.data(), many.size()));
}

TEST_CASE("executor rounds fp32 to bf16 and fp16 like dtype_convert", "[executor]") {
  SourceFile f;
  ExtentList e;
  plan::AppendExtents(e, 0, {Gather::Source(3, 17, 40, 70)});
  const StoragePlan bf16 = plan::MakeStoragePlan("bf16", format::DType::kBFloat16, Conversion::kFp32ToBf16, e);
  const StoragePlan fp16 = plan::MakeStoragePlan("fp16", format::DType::kFloat16, Conversion::kFp32ToFp16, e);
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

TEST_CASE("executor reads a computed source from its bytes in memory, never from its path", "[executor]") {
  // A native source's TP-averaged state: 4 bytes of lead-in, then 50 float32 values.
  std::vector<float> values(50);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 1.25f - 7.0f;
  auto bytes = std::make_shared<std::string>(4, 'x');
  bytes->append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  const std::vector<Source> sources = {Source{"/nonexistent/mean of 2 TP slices", 4, format::DType::kFloat32, 50, bytes}};
  ExtentList e;
  plan::AppendExtents(e, 0, {Gather::Source(1, 3, 10, 5)});
  const StoragePlan fp32 = plan::MakeStoragePlan("fp32", format::DType::kFloat32, Conversion::kCopy, e);
  const StoragePlan bf16 = plan::MakeStoragePlan("bf16", format::DType::kBFloat16, Conversion::kFp32ToBf16, e);
  std::vector<float> got(fp32.numel, -1.0f);
  std::vector<uint16_t> got_bf16(bf16.numel);
  ExecutorOptions options;
  options.chunk_bytes = 128;
  auto ex = Executor::Create(sources, {{&fp32, got.data()}, {&bf16, got_bf16.data()}}, options);
  REQUIRE(ex.ok());
  HostBackend backend;
  REQUIRE(ex->Run(backend).ok());
  std::vector<float> want;
  for (uint64_t r = 0; r < 10; ++r) {
    for (uint64_t k = 0; k < 3; ++k) want.push_back(values[1 + r * 5 + k]);
  }
  CHECK(SameBits(got, want));
  std::vector<uint16_t> want_bf16(want.size());
  view::Float32ToBFloat16(want.data(), want_bf16.data(), want.size());
  CHECK(got_bf16 == want_bf16);

  const std::vector<Source> past = {Source{"mean", 4, format::DType::kFloat32, 51, bytes}};
  auto refused = Executor::Create(past, {{&fp32, got.data()}}, options);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kCorrupt);
}

TEST_CASE("executor refuses bad plans and reports short reads", "[executor]") {
  SourceFile f;
  std::vector<float> out(4096);
  HostBackend backend;

  SECTION("an extent past its source") {
    ExtentList e;
    plan::AppendExtents(e, 1, {Gather::Source(kB - 3, 4)});
    const StoragePlan s = plan::MakeStoragePlan("past", format::DType::kFloat32, Conversion::kCopy, e);
    auto ex = Executor::Create(f.sources(), {{&s, out.data()}});
    REQUIRE(ex.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(ex.status().message(), Catch::Contains("reads past the 777 elements"));
  }
  SECTION("a conversion its dtypes do not allow") {
    ExtentList e;
    plan::AppendExtents(e, 0, {Gather::Source(0, 4)});
    const StoragePlan s = plan::MakeStoragePlan("bad", format::DType::kFloat32, Conversion::kFp32ToBf16, e);
    auto ex = Executor::Create(f.sources(), {{&s, out.data()}});
    REQUIRE(ex.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(ex.status().message(), Catch::Contains("cannot be filled from"));
  }
  SECTION("a missing source") {
    ExtentList e;
    plan::AppendExtents(e, 2, {Gather::Source(0, 4)});
    const StoragePlan s = plan::MakeStoragePlan("missing", format::DType::kFloat32, Conversion::kCopy, e);
    CHECK(Executor::Create(f.sources(), {{&s, out.data()}}).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("a destination without a buffer, and bad options") {
    ExtentList e;
    plan::AppendExtents(e, 0, {Gather::Source(0, 4)});
    const StoragePlan s = plan::MakeStoragePlan("null", format::DType::kFloat32, Conversion::kCopy, e);
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
    const StoragePlan s = plan::MakeStoragePlan("b", format::DType::kFloat32, Conversion::kCopy, e);
    auto ex = Executor::Create(f.sources(), {{&s, out.data()}});
    REQUIRE(ex.ok());
    REQUIRE(::truncate(f.path().c_str(), static_cast<off_t>(kOffsetB + 10)) == 0);
    auto stats = ex->Run(backend);
    REQUIRE(stats.status().code() == StatusCode::kIoError);
    CHECK_THAT(stats.status().message(), Catch::Contains("truncated after the plan was made"));
  }
}

// Three ranks' storages over the same file, overlapping: a row-parallel slice each (a third of
// every row), a shared contiguous run, a bf16 copy of it, and zeros.
std::vector<std::vector<StoragePlan>> NodePlans() {
  std::vector<std::vector<StoragePlan>> plans(3);
  for (uint64_t r = 0; r < 3; ++r) {
    ExtentList slice, shared, padded;
    plan::AppendExtents(slice, 0, {Gather::Source(r * 10, 10, 90, 30)});
    plan::AppendExtents(shared, 1, {Gather::Source(r * 100, 400)});
    plan::AppendExtents(padded, 0, {Gather::Source(2700 + r * 50, 50)});
    plan::AppendZeros(padded, 7);
    plans[r].push_back(plan::MakeStoragePlan("slice", format::DType::kFloat32, Conversion::kCopy, slice));
    plans[r].push_back(plan::MakeStoragePlan("shared", format::DType::kFloat32, Conversion::kCopy, shared));
    plans[r].push_back(plan::MakeStoragePlan("shared_bf16", format::DType::kBFloat16, Conversion::kFp32ToBf16, shared));
    plans[r].push_back(plan::MakeStoragePlan("padded", format::DType::kFloat32, Conversion::kCopy, padded));
  }
  return plans;
}

TEST_CASE("node executor: each byte read once per node, every rank gets what it alone would read", "[executor]") {
  SourceFile f;
  const std::vector<Source> sources = f.sources();
  const std::vector<std::vector<StoragePlan>> plans = NodePlans();
  const uint32_t n = static_cast<uint32_t>(plans.size());
  std::vector<RankStorages> ranks(n);
  for (uint32_t r = 0; r < n; ++r) {
    ranks[r].sources = &sources;
    for (const StoragePlan& s : plans[r]) ranks[r].storages.push_back(&s);
  }
  for (const uint64_t round_bytes : {uint64_t{1} << 30, uint64_t{2048}}) {
    CAPTURE(round_bytes);
    NodeOptions options;
    options.executor.chunk_bytes = 1024;
    options.executor.lanes = 2;
    options.round_bytes = round_bytes;
    // Garbage-filled buffers: padding must be written, not inherited.
    std::vector<std::vector<std::vector<uint8_t>>> buffers(n);
    std::vector<NodeExecutor> nodes;
    uint64_t node_read = 0;
    for (uint32_t r = 0; r < n; ++r) {
      std::vector<void*> pointers;
      for (const StoragePlan& s : plans[r]) {
        buffers[r].emplace_back(s.nbytes(), 0xEE);
        pointers.push_back(buffers[r].back().data());
      }
      auto node = NodeExecutor::Create(ranks, r, pointers, options);
      REQUIRE(node.ok());
      node_read += node->bytes_to_read();
      nodes.push_back(std::move(*node));
    }
    REQUIRE(nodes[0].rounds() == nodes[1].rounds());
    if (round_bytes == 2048) CHECK(nodes[0].rounds() > 3);
    uint64_t exchanged = 0;
    for (size_t k = 0; k < nodes[0].rounds(); ++k) {
      for (uint32_t r = 0; r < n; ++r) {
        for (uint64_t b : nodes[r].send_sizes(k)) exchanged += b;
      }
    }
    CHECK(exchanged > 0);  // the test exercises the exchange, not just every rank reading its own bytes
    HostBackend backend;
    for (uint32_t r = 0; r < n; ++r) REQUIRE(nodes[r].ZeroFill(backend).ok());
    for (size_t k = 0; k < nodes[0].rounds(); ++k) {
      // Each rank reads and packs; then the all-to-all, done here by hand: rank q's segment for
      // rank r follows its segments for the ranks below r.
      std::vector<std::vector<uint8_t>> send(n);
      for (uint32_t r = 0; r < n; ++r) {
        uint64_t total = 0;
        for (uint64_t b : nodes[r].send_sizes(k)) total += b;
        send[r].assign(total, 0);
        REQUIRE(nodes[r].ReadRound(k, send[r].data(), backend).ok());
      }
      for (uint32_t r = 0; r < n; ++r) {
        std::vector<uint8_t> recv;
        for (uint32_t q = 0; q < n; ++q) {
          uint64_t at = 0;
          for (uint32_t o = 0; o < r; ++o) at += nodes[q].send_sizes(k)[o];
          const uint64_t len = nodes[q].send_sizes(k)[r];
          CHECK(len == nodes[r].recv_sizes(k)[q]);
          recv.insert(recv.end(), send[q].begin() + static_cast<std::ptrdiff_t>(at),
                      send[q].begin() + static_cast<std::ptrdiff_t>(at + len));
        }
        REQUIRE(nodes[r].UnpackRound(k, recv.data(), backend).ok());
      }
    }
    // The reference: each rank alone, with the single-rank executor.
    uint64_t alone_read = 0;
    for (uint32_t r = 0; r < n; ++r) {
      std::vector<std::vector<uint8_t>> want;
      std::vector<Destination> dests;
      for (const StoragePlan& s : plans[r]) {
        want.emplace_back(s.nbytes(), 0);
        dests.push_back({&s, want.back().data()});
      }
      ExecutorOptions alone_options;
      alone_options.chunk_bytes = 1024;
      auto alone = Executor::Create(sources, dests, alone_options);
      REQUIRE(alone.ok());
      REQUIRE(alone->Run(backend).ok());
      alone_read += alone->bytes_to_read();
      for (size_t i = 0; i < want.size(); ++i) {
        CAPTURE(r, plans[r][i].key);
        CHECK(buffers[r][i] == want[i]);
      }
    }
    // The shared run and the neighbouring row slices are read once for the node, not once per rank.
    CHECK(node_read < alone_read);
  }
}

TEST_CASE("node executor refuses a rank outside the node and mismatched buffers", "[executor]") {
  SourceFile f;
  const std::vector<Source> sources = f.sources();
  const std::vector<std::vector<StoragePlan>> plans = NodePlans();
  std::vector<RankStorages> ranks(2);
  for (uint32_t r = 0; r < 2; ++r) {
    ranks[r].sources = &sources;
    for (const StoragePlan& s : plans[r]) ranks[r].storages.push_back(&s);
  }
  std::vector<uint8_t> buffer(1 << 16);
  const std::vector<void*> four(4, buffer.data());
  CHECK(NodeExecutor::Create(ranks, 2, four).status().code() == StatusCode::kInvalidArgument);
  auto short_list = NodeExecutor::Create(ranks, 0, {buffer.data()});
  REQUIRE(short_list.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(short_list.status().message(), Catch::Contains("4 storages but 1 buffers"));
}

}  // namespace
}  // namespace reshard::gpu
