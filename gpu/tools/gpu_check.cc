// gpu_check: the CUDA backend against the host backend on a synthetic plan of about one rank's
// restore, and its speed against a plain pinned cudaMemcpy of the same bytes.
//
//   gpu_check [--gib G] [--dir D] [--host-only]
//
// Writes D/reshardfs_gpu_check.bin (G GiB of float32; it stays in the page cache, so reads are
// warm) and plans four destinations over it, the shapes a ZeRO restore has:
//   flat     the first half of the file, one contiguous fp32 run (a flat fp32 partition)
//   rows     the right half of every row of the rest, seen as [rows, 4096] (a row-parallel TP slice)
//   lp       the first quarter again, rounded to bf16 (lp weights; its bytes are read once for both)
//   padding  1 MiB of zeros
// Runs the plan with the host backend into host memory, and (unless --host-only) with the CUDA
// backend into cudaMalloc'ed memory, copies that back and compares CRC-32s (zlib) and bytes.
// Prints GB/s of each run (destination bytes per second) and of one pinned cudaMemcpy of the same
// number of bytes. Exits 1 on any mismatch or error.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/cuda_backend.h"
#include "gpu/executor.h"
#include "gpu/host_backend.h"

namespace reshard::gpu {
namespace {

constexpr uint64_t kRowElems = 4096;

struct Args {
  double gib = 1.5;
  std::string dir = "/tmp";
  bool host_only = false;
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "gpu_check: FAIL: %s\n", what.c_str());
  return 1;
}

bool WriteSource(const std::string& path, uint64_t numel) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  std::vector<float> block(uint64_t{1} << 22);
  uint32_t state = 12345;
  bool ok = true;
  for (uint64_t done = 0; done < numel && ok;) {
    const uint64_t n = std::min<uint64_t>(block.size(), numel - done);
    for (uint64_t i = 0; i < n; ++i) {
      state = state * 1664525u + 1013904223u;  // an LCG: varied mantissas and signs, no NaN
      block[i] = static_cast<float>(static_cast<int32_t>(state)) * 1e-6f;
    }
    ok = ::write(fd, block.data(), n * 4) == static_cast<ssize_t>(n * 4);
    done += n;
  }
  return ::close(fd) == 0 && ok;
}


// Removes the source file however Main returns.
struct RemoveOnExit {
  std::string path;
  ~RemoveOnExit() { ::unlink(path.c_str()); }
};

double GBs(uint64_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

int Main(const Args& args) {
  const uint64_t numel = static_cast<uint64_t>(args.gib * (1 << 30)) / 4 / kRowElems * kRowElems;
  const std::string path = args.dir + "/reshardfs_gpu_check.bin";
  const RemoveOnExit remove{path};
  if (!WriteSource(path, numel)) return Fail("cannot write " + path);
  const std::vector<plan::Source> sources = {{path, 0, format::DType::kFloat32, numel, nullptr}};

  const uint64_t half = numel / 2 / kRowElems * kRowElems;
  std::vector<plan::StoragePlan> plans;
  plan::ExtentList e;
  plan::AppendExtents(e, 0, {view::Gather::Source(0, half)});
  plans.push_back(plan::MakeStoragePlan("flat", format::DType::kFloat32, plan::Conversion::kCopy, e));
  e.clear();
  const uint64_t rows = (numel - half) / kRowElems;
  plan::AppendExtents(e, 0, {view::Gather::Source(half + kRowElems / 2, kRowElems / 2, rows, kRowElems)});
  plans.push_back(plan::MakeStoragePlan("rows", format::DType::kFloat32, plan::Conversion::kCopy, e));
  e.clear();
  plan::AppendExtents(e, 0, {view::Gather::Source(0, half / 2)});
  plans.push_back(plan::MakeStoragePlan("lp", format::DType::kBFloat16, plan::Conversion::kFp32ToBf16, e));
  e.clear();
  plan::AppendZeros(e, (uint64_t{1} << 20) / 4);
  plans.push_back(plan::MakeStoragePlan("padding", format::DType::kFloat32, plan::Conversion::kCopy, e));

  uint64_t total = 0;
  for (const auto& p : plans) total += p.nbytes();
  std::printf("gpu_check: source %.2f GiB, destinations %.2f GB (flat, row-parallel slice, bf16 lp, zeros)\n",
              static_cast<double>(numel * 4) / (1 << 30), static_cast<double>(total) / 1e9);

  // Host backend: the reference.
  std::vector<std::vector<uint8_t>> host(plans.size());
  std::vector<Destination> host_dests;
  for (size_t i = 0; i < plans.size(); ++i) {
    host[i].assign(plans[i].nbytes(), 0xAB);
    host_dests.push_back({&plans[i], host[i].data()});
  }
  ExecutorOptions options;
  options.lanes = 8;
  auto host_ex = Executor::Create(sources, host_dests, options);
  if (!host_ex.ok()) return Fail(host_ex.status().ToString());
  HostBackend host_backend;
  auto host_stats = host_ex->Run(host_backend);
  if (!host_stats.ok()) return Fail(host_stats.status().ToString());
  std::printf("gpu_check: host backend  %.3f s  %.2f GB/s  (%llu chunks, %.2f GB read)\n", host_stats->seconds,
              GBs(total, host_stats->seconds), static_cast<unsigned long long>(host_stats->chunks),
              static_cast<double>(host_stats->bytes_read) / 1e9);
  std::vector<uLong> crcs;
  for (size_t i = 0; i < plans.size(); ++i) {
    crcs.push_back(crc32_z(crc32_z(0L, Z_NULL, 0), host[i].data(), host[i].size()));
    std::printf("gpu_check: %-8s %12llu bytes  crc32 %08lx\n", plans[i].key.c_str(),
                static_cast<unsigned long long>(host[i].size()), crcs.back());
  }
  if (args.host_only) {
    std::printf("gpu_check: --host-only: the CUDA backend was not run\n");
    return 0;
  }

  // CUDA backend into device memory.
  std::vector<void*> device(plans.size(), nullptr);
  std::vector<Destination> device_dests;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (cudaMalloc(&device[i], plans[i].nbytes()) != cudaSuccess) return Fail("cudaMalloc");
    cudaMemset(device[i], 0xAB, plans[i].nbytes());
    device_dests.push_back({&plans[i], device[i]});
  }
  auto cuda_ex = Executor::Create(sources, device_dests, options);
  if (!cuda_ex.ok()) return Fail(cuda_ex.status().ToString());
  int failures = 0;
  for (int run = 0; run < 2; ++run) {  // the first run pays for pinned allocations and module load
    CudaBackend cuda_backend(0);
    auto stats = cuda_ex->Run(cuda_backend);
    if (!stats.ok()) return Fail(stats.status().ToString());
    std::printf("gpu_check: cuda backend run %d  %.3f s  %.2f GB/s\n", run, stats->seconds, GBs(total, stats->seconds));
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    std::vector<uint8_t> back(plans[i].nbytes());
    if (cudaMemcpy(back.data(), device[i], back.size(), cudaMemcpyDeviceToHost) != cudaSuccess) return Fail("cudaMemcpy back");
    const uLong crc = crc32_z(crc32_z(0L, Z_NULL, 0), back.data(), back.size());
    const bool same = crc == crcs[i] && std::memcmp(back.data(), host[i].data(), back.size()) == 0;
    std::printf("gpu_check: %-8s cuda crc32 %08lx  %s\n", plans[i].key.c_str(), crc, same ? "equal" : "DIFFERENT");
    failures += same ? 0 : 1;
    cudaFree(device[i]);
  }

  // Baseline: one pinned host -> device copy of the same number of bytes.
  void* pinned = nullptr;
  void* target = nullptr;
  if (cudaHostAlloc(&pinned, total, cudaHostAllocDefault) != cudaSuccess || cudaMalloc(&target, total) != cudaSuccess) {
    return Fail("baseline allocation");
  }
  std::memset(pinned, 1, total);
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    const auto start = std::chrono::steady_clock::now();
    cudaMemcpy(target, pinned, total, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::printf("gpu_check: pinned cudaMemcpy of the same bytes  %.3f s  %.2f GB/s (best of 3)\n", best, GBs(total, best));
  cudaFreeHost(pinned);
  cudaFree(target);
  if (failures > 0) return Fail(std::to_string(failures) + " destinations differ between the CUDA and host backends");
  std::printf("gpu_check: PASS\n");
  return 0;
}

}  // namespace
}  // namespace reshard::gpu

int main(int argc, char** argv) {
  reshard::gpu::Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--gib" && i + 1 < argc) {
      args.gib = std::atof(argv[++i]);
    } else if (a == "--dir" && i + 1 < argc) {
      args.dir = argv[++i];
    } else if (a == "--host-only") {
      args.host_only = true;
    } else {
      std::fprintf(stderr, "usage: gpu_check [--gib G] [--dir D] [--host-only]\n");
      return 2;
    }
  }
  if (args.gib <= 0 || args.gib > 64) {
    std::fprintf(stderr, "gpu_check: --gib must be in (0, 64]\n");
    return 2;
  }
  return reshard::gpu::Main(args);
}
