// reshardfs._C: the restore plan and executor for Python (pybind11).
//
// Python sees one class, RankPlan: the tensors one target rank's engine holds (plan/
// rank_state_plan.h) and fill(), which runs gpu::Executor into caller-owned buffers given as
// (kind, index, address, nbytes) tuples, kind "fp32" | "exp_avg" | "exp_avg_sq" (flat index) or
// "lp" (lp parameter index). Addresses are raw data pointers (torch's Tensor.data_ptr()); the
// caller keeps those tensors alive and unaliased for the call. The extension does not link
// LibTorch: pointers are all the executor needs, and a libtorch-free module keeps the CPU build
// independent of the pinned torch's CUDA flavour and C++ ABI.
//
// Errors: reshard Status values become Python exceptions here, once: kInvalidArgument ->
// ValueError, kUnsupported -> NotImplementedError, kNotFound -> FileNotFoundError, kIoError ->
// OSError, anything else -> RuntimeError; the message is the Status's. fill() releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/executor.h"
#include "gpu/host_backend.h"
#include "reshard/plan/rank_state_plan.h"
#include "reshard/plan/target_config.h"
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

class RankPlan {
 public:
  RankPlan(const std::string& source, const std::string& ds_config_json, int tp_size, int dp_size, int tp_rank,
           int dp_rank, const std::string& model_config_json) {
    ucp::UniversalCheckpoint ckpt = Unwrap(ucp::UniversalCheckpoint::Open(source));
    const nlohmann::ordered_json config = ParseObject(ds_config_json, "ds_config");
    const nlohmann::ordered_json model_json = ParseObject(model_config_json, "model config");
    plan::ModelConfig model;
    if (!model_json.is_null()) model = Unwrap(plan::ParseModelConfig(model_json));
    plan::TargetOverrides o;
    o.tp_size = tp_size;
    o.dp_size = dp_size;
    const plan::Target target = Unwrap(plan::ResolveTarget(ckpt, config, o, model));
    plan_ = Unwrap(plan::PlanRankState(ckpt, target, tp_rank, dp_rank));
  }

  int zero_stage() const { return plan_.target.zero_stage; }
  std::string lp_dtype() const { return std::string(format::TorchName(plan_.target.lp_dtype)); }

  py::list flats() const {
    py::list out;
    for (const plan::FlatState& f : plan_.flats) {
      py::dict d;
      d["param_group"] = f.param_group;
      d["param_names"] = f.param_names;
      d["local_shapes"] = f.local_shapes;
      d["numel"] = f.fp32.numel;
      out.append(d);
    }
    return out;
  }

  py::list lp_params() const {
    py::list out;
    for (const plan::LpParam& p : plan_.lp_params) {
      py::dict d;
      d["name"] = p.name;
      d["param_group"] = p.param_group;
      d["shape"] = p.shape;
      d["numel"] = p.weight.numel;
      out.append(d);
    }
    return out;
  }

  py::dict Fill(const std::vector<std::tuple<std::string, size_t, uintptr_t, uint64_t>>& buffers,
                const std::string& backend_name, size_t lanes, uint64_t chunk_bytes, int device) const {
    std::vector<Destination> dests;
    for (const auto& [kind, index, address, nbytes] : buffers) {
      const plan::StoragePlan* s = Storage(kind, index);
      if (s->nbytes() != nbytes) {
        Throw(InvalidArgument(kind + "[" + std::to_string(index) + "] ('" + s->key + "') needs " +
                              std::to_string(s->nbytes()) + " bytes, the buffer has " + std::to_string(nbytes)));
      }
      dests.push_back({s, reinterpret_cast<void*>(address)});
    }
    ExecutorOptions options;
    options.lanes = lanes;
    options.chunk_bytes = chunk_bytes;
    Executor executor = Unwrap(Executor::Create(plan_.sources, dests, options));
    std::unique_ptr<CopyBackend> backend = MakeBackend(backend_name, device);
    Result<ExecutorStats> stats = Status();
    {
      py::gil_scoped_release release;
      stats = executor.Run(*backend);
    }
    const ExecutorStats s = Unwrap(std::move(stats));
    py::dict d;
    d["chunks"] = s.chunks;
    d["bytes_read"] = s.bytes_read;
    d["bytes_copied"] = s.bytes_copied;
    d["bytes_zeroed"] = s.bytes_zeroed;
    d["seconds"] = s.seconds;
    return d;
  }

 private:
  const plan::StoragePlan* Storage(const std::string& kind, size_t index) const {
    if (kind == "lp") {
      if (index >= plan_.lp_params.size()) Throw(InvalidArgument("no lp parameter " + std::to_string(index)));
      return &plan_.lp_params[index].weight;
    }
    if (index >= plan_.flats.size()) Throw(InvalidArgument("no flat partition " + std::to_string(index)));
    const plan::FlatState& f = plan_.flats[index];
    if (kind == "fp32") return &f.fp32;
    if (kind == "exp_avg") return &f.exp_avg;
    if (kind == "exp_avg_sq") return &f.exp_avg_sq;
    Throw(InvalidArgument("unknown buffer kind '" + kind + "' (fp32, exp_avg, exp_avg_sq or lp)"));
  }

  static std::unique_ptr<CopyBackend> MakeBackend(const std::string& name, int device) {
    if (name == "host") return std::make_unique<HostBackend>();
#ifdef RESHARDFS_WITH_CUDA
    if (name == "cuda") return std::make_unique<CudaBackend>(device);
#else
    (void)device;
    if (name == "cuda") Throw(Unsupported("this reshardfs extension was built without CUDA (RESHARDFS_CUDA=OFF)"));
#endif
    Throw(InvalidArgument("unknown backend '" + name + "' (host or cuda)"));
  }

  plan::RankStatePlan plan_;
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
           py::arg("chunk_bytes") = uint64_t{8} << 20, py::arg("device") = 0);
}
