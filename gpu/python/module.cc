// reshardfs._C: the restore plan and executor for Python (pybind11).
//
// Python sees RankPlan: the tensors one target rank's engine holds (plan/
// rank_state_plan.h) and fill(), which runs gpu::Executor into caller-owned buffers given as
// (kind, index, address, nbytes) tuples, kind "fp32" | "exp_avg" | "exp_avg_sq" (flat index) or
// "lp" (lp parameter index), through the backend "host", "cuda" or "discard" (reads only, for
// benchmarks), and chunks(), the reads fill() makes (scripts/bench_restore.py); and NodeRestore: the same for
// one rank of a node restoring cooperatively (gpu/node_executor.h), whose read_round /
// unpack_round surround the caller's all-to-all. Addresses are raw data pointers (torch's Tensor.data_ptr()); the
// caller keeps those tensors alive and unaliased for the call. The extension does not link
// LibTorch: pointers are all the executor needs, and a libtorch-free module keeps the CPU build
// independent of the pinned torch's CUDA flavour and C++ ABI.
//
// Errors: reshard Status values become Python exceptions here, once: kInvalidArgument ->
// ValueError, kUnsupported -> NotImplementedError, kNotFound -> FileNotFoundError, kIoError ->
// OSError, anything else -> RuntimeError; the message is the Status's. fill(), read_round and
// unpack_round release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/discard_backend.h"
#include "gpu/executor.h"
#include "gpu/host_backend.h"
#include "gpu/node_executor.h"
#include "reshard/plan/rank_state_plan.h"
#include "reshard/plan/target_config.h"
#include "reshard/native/native_checkpoint.h"
#include "reshard/ucp/universal_checkpoint.h"
#ifdef RESHARDFS_WITH_CUDA
#include "gpu/cuda_backend.h"
#endif

namespace py = pybind11;

namespace reshard::gpu {
namespace {

[[noreturn]] void Throw(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument: throw py::value_error(s.message());
    case StatusCode::kUnsupported: PyErr_SetString(PyExc_NotImplementedError, s.message().c_str()); throw py::error_already_set();
    case StatusCode::kNotFound: PyErr_SetString(PyExc_FileNotFoundError, s.message().c_str()); throw py::error_already_set();
    case StatusCode::kIoError: PyErr_SetString(PyExc_OSError, s.message().c_str()); throw py::error_already_set();
    default: throw std::runtime_error(s.ToString());
  }
}

template <typename T>
T Unwrap(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(*r);
}

nlohmann::ordered_json ParseObject(const std::string& text, const char* what) {
  if (text.empty()) return nlohmann::ordered_json();
  auto json = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) Throw(InvalidArgument(std::string(what) + " is not a JSON object"));
  return json;
}

// Every listed (tp_rank, dp_rank)'s plan, from one opening of the checkpoint.
std::vector<plan::RankStatePlan> PlanRanks(const std::string& source, const std::string& ds_config_json, int tp_size,
                                           int dp_size, const std::vector<std::pair<int, int>>& coords,
                                           const std::string& model_config_json) {
  ucp::UniversalCheckpoint ckpt = Unwrap(native::OpenCheckpointSource(source));
  const nlohmann::ordered_json config = ParseObject(ds_config_json, "ds_config");
  const nlohmann::ordered_json model_json = ParseObject(model_config_json, "model config");
  plan::ModelConfig model;
  if (!model_json.is_null()) model = Unwrap(plan::ParseModelConfig(model_json));
  plan::TargetOverrides o;
  o.tp_size = tp_size;
  o.dp_size = dp_size;
  const plan::Target target = Unwrap(plan::ResolveTarget(ckpt, config, o, model));
  std::vector<plan::RankStatePlan> plans;
  for (const auto& [tp_rank, dp_rank] : coords) plans.push_back(Unwrap(plan::PlanRankState(ckpt, target, tp_rank, dp_rank)));
  return plans;
}

py::list Flats(const plan::RankStatePlan& p) {
  py::list out;
  for (const plan::FlatState& f : p.flats) {
    py::dict d;
    d["param_group"] = f.param_group;
    d["param_names"] = f.param_names;
    d["local_shapes"] = f.local_shapes;
    d["numel"] = f.fp32.numel;
    out.append(d);
  }
  return out;
}

py::list LpParams(const plan::RankStatePlan& p) {
  py::list out;
  for (const plan::LpParam& lp : p.lp_params) {
    py::dict d;
    d["name"] = lp.name;
    d["param_group"] = lp.param_group;
    d["shape"] = lp.shape;
    d["numel"] = lp.weight.numel;
    out.append(d);
  }
  return out;
}

// The storage a (kind, index) buffer names, and its position in the canonical order (every
// flat's fp32, exp_avg, exp_avg_sq, then every lp parameter) that node ranks share.
std::pair<const plan::StoragePlan*, size_t> Storage(const plan::RankStatePlan& p, const std::string& kind, size_t index) {
  if (kind == "lp") {
    if (index >= p.lp_params.size()) Throw(InvalidArgument("no lp parameter " + std::to_string(index)));
    return {&p.lp_params[index].weight, 3 * p.flats.size() + index};
  }
  if (index >= p.flats.size()) Throw(InvalidArgument("no flat partition " + std::to_string(index)));
  const plan::FlatState& f = p.flats[index];
  if (kind == "fp32") return {&f.fp32, 3 * index};
  if (kind == "exp_avg") return {&f.exp_avg, 3 * index + 1};
  if (kind == "exp_avg_sq") return {&f.exp_avg_sq, 3 * index + 2};
  Throw(InvalidArgument("unknown buffer kind '" + kind + "' (fp32, exp_avg, exp_avg_sq or lp)"));
}

std::vector<const plan::StoragePlan*> CanonicalStorages(const plan::RankStatePlan& p) {
  std::vector<const plan::StoragePlan*> out;
  for (const plan::FlatState& f : p.flats) out.insert(out.end(), {&f.fp32, &f.exp_avg, &f.exp_avg_sq});
  for (const plan::LpParam& lp : p.lp_params) out.push_back(&lp.weight);
  return out;
}

using Buffers = std::vector<std::tuple<std::string, size_t, uintptr_t, uint64_t>>;

// Checks each buffer's size against its storage; returns (storage, canonical position, address).
std::vector<std::tuple<const plan::StoragePlan*, size_t, void*>> CheckBuffers(const plan::RankStatePlan& p,
                                                                              const Buffers& buffers) {
  std::vector<std::tuple<const plan::StoragePlan*, size_t, void*>> out;
  for (const auto& [kind, index, address, nbytes] : buffers) {
    const auto [s, position] = Storage(p, kind, index);
    if (s->nbytes() != nbytes) {
      Throw(InvalidArgument(kind + "[" + std::to_string(index) + "] ('" + s->key + "') needs " +
                            std::to_string(s->nbytes()) + " bytes, the buffer has " + std::to_string(nbytes)));
    }
    out.emplace_back(s, position, reinterpret_cast<void*>(address));
  }
  return out;
}

std::unique_ptr<CopyBackend> MakeBackend(const std::string& name, int device) {
  if (name == "host") return std::make_unique<HostBackend>();
  if (name == "discard") return std::make_unique<DiscardBackend>();
#ifdef RESHARDFS_WITH_CUDA
  if (name == "cuda") return std::make_unique<CudaBackend>(device);
#else
  (void)device;
  if (name == "cuda") Throw(Unsupported("this reshardfs extension was built without CUDA (RESHARDFS_CUDA=OFF)"));
#endif
  Throw(InvalidArgument("unknown backend '" + name + "' (host, cuda or discard)"));
}

py::dict StatsDict(const ExecutorStats& s) {
  py::dict d;
  d["chunks"] = s.chunks;
  d["bytes_read"] = s.bytes_read;
  d["bytes_read_direct"] = s.bytes_read_direct;
  d["bytes_copied"] = s.bytes_copied;
  d["bytes_zeroed"] = s.bytes_zeroed;
  d["seconds"] = s.seconds;
  return d;
}

class RankPlan {
 public:
  RankPlan(const std::string& source, const std::string& ds_config_json, int tp_size, int dp_size, int tp_rank,
           int dp_rank, const std::string& model_config_json)
      : plan_(std::move(PlanRanks(source, ds_config_json, tp_size, dp_size, {{tp_rank, dp_rank}}, model_config_json)
                            .front())) {}

  int zero_stage() const { return plan_.target.zero_stage; }
  std::string lp_dtype() const { return std::string(format::TorchName(plan_.target.lp_dtype)); }
  py::list flats() const { return Flats(plan_); }
  py::list lp_params() const { return LpParams(plan_); }

  py::dict Fill(const Buffers& buffers, const std::string& backend_name, size_t lanes, uint64_t chunk_bytes,
                int device) const {
    const Executor executor = Schedule(buffers, lanes, chunk_bytes);
    std::unique_ptr<CopyBackend> backend = MakeBackend(backend_name, device);
    Result<ExecutorStats> stats = Status();
    {
      py::gil_scoped_release release;
      stats = executor.Run(*backend);
    }
    return StatsDict(Unwrap(std::move(stats)));
  }

  // The sequential reads fill() would make, as (path, offset, length, computed) in schedule order
  // (computed: the bytes are in memory, not in the file at path). For benchmarks.
  std::vector<std::tuple<std::string, uint64_t, uint64_t, bool>> Chunks(const Buffers& buffers, size_t lanes,
                                                                        uint64_t chunk_bytes) const {
    const Executor executor = Schedule(buffers, lanes, chunk_bytes);
    std::vector<std::tuple<std::string, uint64_t, uint64_t, bool>> out;
    for (const ChunkWork& c : executor.chunks()) {
      out.emplace_back(executor.files().path(c.file), c.offset, c.length, executor.files().computed(c.file));
    }
    return out;
  }

 private:
  Executor Schedule(const Buffers& buffers, size_t lanes, uint64_t chunk_bytes) const {
    std::vector<Destination> dests;
    for (const auto& [storage, position, address] : CheckBuffers(plan_, buffers)) dests.push_back({storage, address});
    ExecutorOptions options;
    options.lanes = lanes;
    options.chunk_bytes = chunk_bytes;
    return Unwrap(Executor::Create(plan_.sources, dests, options));
  }

  plan::RankStatePlan plan_;
};

// The ranks of one node restoring cooperatively (gpu/node_executor.h); the exchange between
// ReadRound and UnpackRound is the caller's all-to-all.
class NodeRestore {
 public:
  NodeRestore(const std::string& source, const std::string& ds_config_json, int tp_size, int dp_size,
              const std::vector<std::pair<int, int>>& node_ranks, size_t me, const std::string& model_config_json)
      : plans_(PlanRanks(source, ds_config_json, tp_size, dp_size, node_ranks, model_config_json)), me_(me) {
    if (me >= plans_.size()) Throw(InvalidArgument("node rank " + std::to_string(me) + " outside the node"));
  }

  int zero_stage() const { return plans_[me_].target.zero_stage; }
  py::list flats() const { return Flats(plans_[me_]); }
  py::list lp_params() const { return LpParams(plans_[me_]); }

  // Every storage of this rank needs a buffer: every node rank fills all of its own.
  void Prepare(const Buffers& buffers, const std::string& backend_name, size_t lanes, uint64_t chunk_bytes,
               uint64_t round_bytes, int device) {
    const std::vector<const plan::StoragePlan*> mine = CanonicalStorages(plans_[me_]);
    std::vector<void*> pointers(mine.size(), nullptr);
    for (const auto& [storage, position, address] : CheckBuffers(plans_[me_], buffers)) pointers[position] = address;
    for (size_t i = 0; i < mine.size(); ++i) {
      if (pointers[i] == nullptr) Throw(InvalidArgument("cooperative restore: no buffer for '" + mine[i]->key + "'"));
    }
    std::vector<RankStorages> ranks;
    for (const plan::RankStatePlan& p : plans_) ranks.push_back({&p.sources, CanonicalStorages(p)});
    NodeOptions options;
    options.executor.lanes = lanes;
    options.executor.chunk_bytes = chunk_bytes;
    options.round_bytes = round_bytes;
    executor_ = std::make_unique<NodeExecutor>(Unwrap(NodeExecutor::Create(ranks, static_cast<uint32_t>(me_), pointers, options)));
    backend_ = MakeBackend(backend_name, device);
    Check(executor_->ZeroFill(*backend_));
  }

  size_t rounds() const { return Executor().rounds(); }
  std::vector<uint64_t> send_sizes(size_t k) const { return Executor().send_sizes(CheckedRound(k)); }
  std::vector<uint64_t> recv_sizes(size_t k) const { return Executor().recv_sizes(CheckedRound(k)); }
  uint64_t bytes_to_read() const { return Executor().bytes_to_read(); }
  uint64_t bytes_owned() const { return Executor().bytes_owned(); }

  void ReadRound(size_t k, uintptr_t send) const {
    Status s;
    {
      py::gil_scoped_release release;
      s = Executor().ReadRound(CheckedRound(k), reinterpret_cast<uint8_t*>(send), *backend_);
    }
    Check(s);
  }
  void UnpackRound(size_t k, uintptr_t recv) const {
    Status s;
    {
      py::gil_scoped_release release;
      s = Executor().UnpackRound(CheckedRound(k), reinterpret_cast<const uint8_t*>(recv), *backend_);
    }
    Check(s);
  }

 private:
  static void Check(const Status& s) {
    if (!s.ok()) Throw(s);
  }
  const NodeExecutor& Executor() const {
    if (!executor_) Throw(InvalidArgument("call prepare() first"));
    return *executor_;
  }
  size_t CheckedRound(size_t k) const {
    if (k >= Executor().rounds()) Throw(InvalidArgument("no round " + std::to_string(k)));
    return k;
  }

  std::vector<plan::RankStatePlan> plans_;
  size_t me_ = 0;
  std::unique_ptr<NodeExecutor> executor_;
  std::unique_ptr<CopyBackend> backend_;
};

}  // namespace
}  // namespace reshard::gpu

PYBIND11_MODULE(_C, m) {
  using reshard::gpu::RankPlan;
  m.doc() = "reshardfs restore plans and executor (see gpu/python/module.cc)";
#ifdef RESHARDFS_WITH_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
  py::class_<RankPlan>(m, "RankPlan")
      .def(py::init<const std::string&, const std::string&, int, int, int, int, const std::string&>(),
           py::arg("source"), py::arg("ds_config_json"), py::arg("tp_size"), py::arg("dp_size"), py::arg("tp_rank"),
           py::arg("dp_rank"), py::arg("model_config_json") = "")
      .def_property_readonly("zero_stage", &RankPlan::zero_stage)
      .def_property_readonly("lp_dtype", &RankPlan::lp_dtype)
      .def_property_readonly("flats", &RankPlan::flats)
      .def_property_readonly("lp_params", &RankPlan::lp_params)
      .def("fill", &RankPlan::Fill, py::arg("buffers"), py::arg("backend") = "host", py::arg("lanes") = 4,
           py::arg("chunk_bytes") = uint64_t{8} << 20, py::arg("device") = 0)
      .def("chunks", &RankPlan::Chunks, py::arg("buffers"), py::arg("lanes") = 4,
           py::arg("chunk_bytes") = uint64_t{8} << 20);
  using reshard::gpu::NodeRestore;
  py::class_<NodeRestore>(m, "NodeRestore")
      .def(py::init<const std::string&, const std::string&, int, int, const std::vector<std::pair<int, int>>&, size_t,
                    const std::string&>(),
           py::arg("source"), py::arg("ds_config_json"), py::arg("tp_size"), py::arg("dp_size"), py::arg("node_ranks"),
           py::arg("me"), py::arg("model_config_json") = "")
      .def_property_readonly("zero_stage", &NodeRestore::zero_stage)
      .def_property_readonly("flats", &NodeRestore::flats)
      .def_property_readonly("lp_params", &NodeRestore::lp_params)
      .def("prepare", &NodeRestore::Prepare, py::arg("buffers"), py::arg("backend") = "host", py::arg("lanes") = 4,
           py::arg("chunk_bytes") = uint64_t{8} << 20, py::arg("round_bytes") = uint64_t{256} << 20,
           py::arg("device") = 0)
      .def_property_readonly("rounds", &NodeRestore::rounds)
      .def("send_sizes", &NodeRestore::send_sizes)
      .def("recv_sizes", &NodeRestore::recv_sizes)
      .def_property_readonly("bytes_to_read", &NodeRestore::bytes_to_read)
      .def_property_readonly("bytes_owned", &NodeRestore::bytes_owned)
      .def("read_round", &NodeRestore::ReadRound)
      .def("unpack_round", &NodeRestore::UnpackRound);
}
