#include "reshard/plan/state_extents.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace reshard::plan {
namespace {

// Where logical element `e` of `t` lives: (file, byte offset), by walking the pieces one by one.
std::pair<std::string, uint64_t> Locate(const ucp::StateTensor& t, uint64_t e) {
  if (t.pieces.empty()) return {t.path, t.data_offset + e * 4};
  for (const ucp::TensorPiece& p : t.pieces) {
    if (e < p.numel) return {p.path, p.data_offset + e * 4};
    e -= p.numel;
  }
  return {"past the end", 0};
}

// Every destination element the extents produce, as (file, byte offset); zeros as ("0", 0).
std::vector<std::pair<std::string, uint64_t>> Expand(const ExtentList& list, const SourceTable& sources) {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const Extent& e : list) {
    view::ForEachRun({e.gather}, [&](uint64_t, uint64_t src, uint64_t n, bool zero) {
      for (uint64_t k = 0; k < n; ++k) {
        if (zero) {
          out.emplace_back("0", 0);
        } else {
          const Source& s = sources.sources()[e.source];
          out.emplace_back(s.path, s.data_offset + (src + k) * 4);
        }
      }
    });
  }
  return out;
}

// The same, straight from the gathers over the logical tensor.
std::vector<std::pair<std::string, uint64_t>> Expected(const ucp::StateTensor& t, const view::GatherList& gathers) {
  std::vector<std::pair<std::string, uint64_t>> out;
  view::ForEachRun(gathers, [&](uint64_t, uint64_t src, uint64_t n, bool zero) {
    for (uint64_t k = 0; k < n; ++k) out.push_back(zero ? std::make_pair(std::string("0"), uint64_t{0}) : Locate(t, src + k));
  });
  return out;
}

// A 6 x 10 float32 tensor split over three ranks' files as 17 + 25 + 18 elements.
ucp::StateTensor Fragmented() {
  ucp::StateTensor t;
  t.shape = {6, 10};
  t.nbytes = 240;
  t.pieces = {{"rank0.pt", 1000, 17}, {"rank1.pt", 64, 25}, {"rank2.pt", 4096, 18}};
  t.path = t.pieces[0].path;
  t.data_offset = t.pieces[0].data_offset;
  return t;
}

TEST_CASE("AppendStateExtents maps views of a fragmented tensor onto its pieces", "[plan]") {
  const ucp::StateTensor t = Fragmented();
  const std::vector<view::GatherList> views = {
      {view::Gather::Source(0, 60)},                                   // the whole tensor
      {view::Gather::Source(3, 4, 6, 10)},                             // columns 3..6 of every row: rows cross pieces
      {view::Gather::Source(5, 5, 6, 10)},                             // the right half (a TP column cut)
      {view::Gather::Source(20, 20)},                                  // rows 2..3 (a TP row cut), inside rank 1
      {view::Gather::Source(15, 3), view::Gather::Zeros(7), view::Gather::Source(41, 2)},  // around both boundaries
  };
  for (const view::GatherList& gathers : views) {
    SourceTable sources;
    ExtentList list;
    REQUIRE(AppendStateExtents(list, sources, t, gathers).ok());
    CHECK(Expand(list, sources) == Expected(t, gathers));
    CHECK(NumElements(list) == view::NumElements(gathers));
  }
}

TEST_CASE("AppendStateExtents keeps strided rows inside one piece as one gather", "[plan]") {
  ucp::StateTensor t = Fragmented();
  t.pieces = {{"rank0.pt", 0, 40}, {"rank1.pt", 0, 20}};
  SourceTable sources;
  ExtentList list;
  REQUIRE(AppendStateExtents(list, sources, t, {view::Gather::Source(2, 3, 6, 10)}).ok());
  // Rows 0-3 lie in rank 0 (one strided gather), rows 4-5 in rank 1 (another).
  REQUIRE(list.size() == 2);
  CHECK(list[0].gather == view::Gather::Source(2, 3, 4, 10));
  CHECK(list[1].gather == view::Gather::Source(2, 3, 2, 10));
  CHECK(sources.sources()[list[1].source].path == "rank1.pt");
}

TEST_CASE("AppendStateExtents reads a whole-file tensor in place and refuses views past its end", "[plan]") {
  ucp::StateTensor whole;
  whole.path = "fp32.pt";
  whole.data_offset = 128;
  whole.shape = {6, 10};
  whole.nbytes = 240;
  SourceTable sources;
  ExtentList list;
  REQUIRE(AppendStateExtents(list, sources, whole, {view::Gather::Source(5, 5, 6, 10)}).ok());
  REQUIRE(list.size() == 1);
  CHECK(list[0].gather == view::Gather::Source(5, 5, 6, 10));
  CHECK(sources.sources()[0].data_offset == 128);

  for (const ucp::StateTensor& t : {whole, Fragmented()}) {
    ExtentList out;
    const Status s = AppendStateExtents(out, sources, t, {view::Gather::Source(55, 5, 2, 10)});
    CHECK(s.code() == StatusCode::kOutOfRange);
  }
}

}  // namespace
}  // namespace reshard::plan
