#include "reshard/base/compressed_bytes.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace reshard {
namespace {

// Text that repeats with small changes, like the names in a pickle: zstd shrinks it a lot.
std::string Repetitive(size_t n) {
  std::string out;
  for (size_t i = 0; out.size() < n; ++i) out += "model.layers." + std::to_string(i) + ".mlp.up_proj.weight;";
  out.resize(n);
  return out;
}

// Bytes zstd cannot shrink.
std::string Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(gen() & 0xFF);
  return out;
}

std::string ReadRange(const CompressedBytes& bytes, uint64_t offset, size_t length) {
  std::string out(length, '\0');
  const Status s = bytes.Read(offset, out.data(), length);
  REQUIRE(s.ok());
  return out;
}

TEST_CASE("CompressedBytes: every range reads back the bytes given, across chunk edges", "[base]") {
  constexpr size_t kChunk = 64;
  for (const size_t size : {size_t{1}, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + kChunk / 2}) {
    // Half repetitive, half random, so both kinds of chunk are held.
    const std::string plain = Repetitive(size / 2) + Random(size - size / 2, static_cast<uint32_t>(size));
    auto bytes = CompressedBytes::Create(plain, kChunk);
    REQUIRE(bytes.ok());
    REQUIRE(bytes->size() == plain.size());
    for (size_t offset = 0; offset <= size; ++offset) {
      for (size_t length = 0; offset + length <= size; length += 7) {
        INFO("size " << size << " offset " << offset << " length " << length);
        REQUIRE(ReadRange(*bytes, offset, length) == plain.substr(offset, length));
      }
    }
    REQUIRE(bytes->ToString().value() == plain);
  }
}

TEST_CASE("CompressedBytes: repetitive bytes are held compressed, random ones as they are", "[base]") {
  const std::string text = Repetitive(1 << 20);
  auto compressed = CompressedBytes::Create(text);
  REQUIRE(compressed.ok());
  CHECK(compressed->stored_bytes() * 10 < text.size());
  CHECK(compressed->ToString().value() == text);

  const std::string noise = Random(200'000, 7);
  auto raw = CompressedBytes::Create(noise);
  REQUIRE(raw.ok());
  CHECK(raw->stored_bytes() == noise.size());
  CHECK(ReadRange(*raw, 65'000, 1'000) == noise.substr(65'000, 1'000));
}

TEST_CASE("CompressedBytes: partial reads of the same chunk of two byte strings do not mix", "[base]") {
  // The per-thread buffer keeps one decompressed chunk; it must know whose chunk it holds.
  const std::string a = Repetitive(4096);
  std::string b = a;
  for (size_t i = 0; i < b.size(); i += 5) b[i] = 'x';
  auto ca = CompressedBytes::Create(a, 1024);
  auto cb = CompressedBytes::Create(b, 1024);
  REQUIRE(ca.ok());
  REQUIRE(cb.ok());
  for (int round = 0; round < 3; ++round) {
    CHECK(ReadRange(*ca, 10, 100) == a.substr(10, 100));
    CHECK(ReadRange(*cb, 10, 100) == b.substr(10, 100));
    CHECK(ReadRange(*ca, 1500, 20) == a.substr(1500, 20));
    CHECK(ReadRange(*cb, 1500, 20) == b.substr(1500, 20));
  }
}

TEST_CASE("CompressedBytes: concurrent readers each get their bytes", "[base]") {
  const std::string plain = Repetitive(300'000);
  auto bytes = CompressedBytes::Create(plain, 4096);
  REQUIRE(bytes.ok());
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 gen(static_cast<uint32_t>(t));
      std::string out;
      for (int k = 0; k < 2000; ++k) {
        const uint64_t offset = gen() % plain.size();
        const size_t length = std::min<size_t>(gen() % 10'000, plain.size() - offset);
        out.assign(length, '\0');
        if (!bytes->Read(offset, out.data(), length).ok() || out != plain.substr(offset, length)) ++mismatches[t];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

TEST_CASE("CompressedBytes: ranges past the end and bad chunk sizes are refused", "[base]") {
  auto bytes = CompressedBytes::Create(Repetitive(100), 32);
  REQUIRE(bytes.ok());
  char out[16];
  CHECK(bytes->Read(90, out, 11).code() == StatusCode::kOutOfRange);
  CHECK(bytes->Read(101, out, 0).code() == StatusCode::kOutOfRange);
  CHECK(bytes->Read(UINT64_MAX, out, 2).code() == StatusCode::kOutOfRange);
  CHECK(bytes->Read(100, out, 0).ok());
  CHECK(CompressedBytes::Create("abc", 0).status().code() == StatusCode::kInvalidArgument);
  CHECK(CompressedBytes::Create("abc", CompressedBytes::kMaxChunkBytes + 1).status().code() ==
        StatusCode::kInvalidArgument);

  auto empty = CompressedBytes::Create("");
  REQUIRE(empty.ok());
  CHECK(empty->size() == 0);
  CHECK(empty->Read(0, out, 0).ok());
  CHECK(empty->Read(0, out, 1).code() == StatusCode::kOutOfRange);
}

TEST_CASE("CompressedBytes: a copy reads the same bytes; a moved-from one is empty", "[base]") {
  const std::string plain = Repetitive(10'000);
  auto made = CompressedBytes::Create(plain, 1000);
  REQUIRE(made.ok());
  const CompressedBytes copy = *made;
  CHECK(ReadRange(copy, 1234, 3000) == plain.substr(1234, 3000));
  const CompressedBytes moved = std::move(*made);
  CHECK(ReadRange(moved, 999, 2) == plain.substr(999, 2));
  CHECK(made->size() == 0);  // NOLINT(bugprone-use-after-move): the documented moved-from state
  char out[1];
  CHECK(made->Read(0, out, 1).code() == StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace reshard
