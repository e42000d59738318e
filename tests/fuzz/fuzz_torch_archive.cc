// libFuzzer harness: a whole torch.save file (format/torch_archive.h: zip directory, data.pkl, tensor
// matching) and, for every tensor it names, ucp::LocateTensor, which the universal-checkpoint reader uses to
// find a state's bytes. The input is written to a memfd and opened by path, as a file on disk would be.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "reshard/format/torch_archive.h"
#include "reshard/ucp/param_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz_torch_archive", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  reshard::format::PickleLimits limits;
  limits.max_nodes = 1 << 16;
  limits.max_payload_bytes = 1 << 20;
  auto archive = reshard::format::TorchArchive::Open(path, limits);
  if (!archive.ok()) return 0;
  for (const reshard::format::TensorRef& tensor : archive->tensors()) {
    auto located = reshard::ucp::LocateTensor(*archive, tensor);
    if (located.ok() && (located->data_offset > size || located->nbytes > size - located->data_offset)) std::abort();
  }
  return 0;
}
