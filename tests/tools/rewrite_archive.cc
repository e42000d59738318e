// rewrite_archive: re-emits a torch.save file through reshardfs's own writers, for the
// integration tests (tests/integration/test_torch_write.py).
//
//   rewrite_archive IN.pt OUT.pt                 parse IN, write its pickle tree unchanged with
//                                                the pickle writer and the virtual zip writer,
//                                                storage bytes copied from IN's records
//   rewrite_archive --safetensors IN.pt OUT      every tensor reached from the root through str
//                                                dict keys, named "key1.key2", as safetensors
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "reshard/format/safetensors_writer.h"
#include "reshard/format/torch_archive.h"
#include "reshard/format/torch_archive_writer.h"
#include "reshard/view/virtual_file.h"

namespace {

using reshard::Result;
using reshard::Status;
namespace format = reshard::format;
namespace view = reshard::view;

class OutputFile {
 public:
  explicit OutputFile(const std::string& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) {}
  ~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

Status WriteFile(const std::string& path, const view::VirtualFile& file, const view::DataFill& fill) {
  OutputFile out(path);
  if (out.fd() < 0) return reshard::ErrnoError(path, errno);
  return view::WriteAll(file, fill, out.fd());
}

Status RewriteTorch(const format::TorchArchive& in, const std::string& out_path) {
  // Storages in order of first use, as torch.save writes them.
  std::vector<format::ArchiveStorageSpec> specs;
  std::vector<const format::ArchiveStorage*> sources;
  for (const std::string& key : in.storage_order()) {
    const format::ArchiveStorage& s = in.storages().at(key);
    specs.push_back({key, s.ref.nbytes});
    sources.push_back(&s);
  }
  RS_ASSIGN_OR_RETURN(format::TorchArchiveLayout layout, format::LayoutTorchArchive(in.tree(), specs));
  auto fill = [&](uint32_t record, uint64_t offset, uint8_t* out, size_t length) -> Status {
    const format::ArchiveStorage& s = *sources.at(record - layout.first_storage_entry);
    std::memcpy(out, in.StorageData(s) + offset, length);
    return Status::Ok();
  };
  return WriteFile(out_path, layout.zip.file, fill);
}

// Tensors reached from the root through str keys of dicts and OrderedDicts.
void NamedTensors(const format::PickleTree& tree, format::NodeId id, const std::string& path,
                  std::vector<std::pair<std::string, format::NodeId>>& out) {
  const format::Node& n = tree.node(id);
  const std::vector<format::NodeId>* pairs = nullptr;
  if (n.kind == format::NodeKind::kDict) pairs = &n.items;
  if (n.kind == format::NodeKind::kReduce || n.kind == format::NodeKind::kNewObj) pairs = &n.dict_items();
  if (pairs == nullptr || pairs->empty()) {
    if (!path.empty()) out.emplace_back(path, id);
    return;
  }
  for (size_t k = 0; k + 1 < pairs->size(); k += 2) {
    const format::Node& key = tree.node((*pairs)[k]);
    if (key.kind != format::NodeKind::kStr) continue;
    NamedTensors(tree, (*pairs)[k + 1], path.empty() ? key.text : path + "." + key.text, out);
  }
}

// The view's elements in row-major order (a test tool: clarity over speed).
std::string Contiguous(const format::TorchArchive& in, const format::TensorRef& t) {
  const uint8_t* base = in.StorageData(in.storages().at(t.storage.key));
  const size_t item = format::ItemSize(t.dtype);
  std::string out;
  out.resize(t.numel() * item);
  std::vector<int64_t> index(t.shape.size(), 0);
  for (uint64_t e = 0; e < t.numel(); ++e) {
    int64_t elem = t.storage_offset;
    for (size_t d = 0; d < index.size(); ++d) elem += index[d] * t.stride[d];
    std::memcpy(out.data() + e * item, base + static_cast<uint64_t>(elem) * item, item);
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

Status RewriteSafetensors(const format::TorchArchive& in, const std::string& out_path) {
  std::vector<std::pair<std::string, format::NodeId>> named;
  NamedTensors(in.tree(), in.tree().root(), "", named);
  std::vector<format::SafetensorsTensor> specs;
  std::vector<std::string> data;
  for (const auto& [name, node] : named) {
    RS_ASSIGN_OR_RETURN(std::optional<format::TensorRef> t, format::MatchTensor(in.tree(), node));
    if (!t) continue;
    specs.push_back({name, t->dtype, t->shape});
    data.push_back(Contiguous(in, *t));
  }
  RS_ASSIGN_OR_RETURN(format::SafetensorsLayout layout, format::LayoutSafetensors(specs));
  auto fill = [&](uint32_t record, uint64_t offset, uint8_t* out, size_t length) -> Status {
    std::memcpy(out, data.at(record).data() + offset, length);
    return Status::Ok();
  };
  return WriteFile(out_path, layout.file, fill);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Re-emit a torch.save file through reshardfs's writers (test tool)"};
  std::string in_path, out_path;
  bool safetensors = false;
  app.add_option("IN", in_path)->required();
  app.add_option("OUT", out_path)->required();
  app.add_flag("--safetensors", safetensors, "Write the named tensors as safetensors");
  CLI11_PARSE(app, argc, argv);

  Result<format::TorchArchive> in = format::TorchArchive::Open(in_path);
  Status status = in.status();
  if (status.ok()) status = safetensors ? RewriteSafetensors(*in, out_path) : RewriteTorch(*in, out_path);
  if (!status.ok()) {
    std::fprintf(stderr, "rewrite_archive: error: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
