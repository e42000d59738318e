#include "fs/inline_content.h"

#include <algorithm>
#include <cstring>

namespace reshard::fs {

Result<size_t> InlineContent::Read(uint64_t offset, uint8_t* out, size_t length) const {
  if (offset >= bytes_.size()) return size_t{0};
  const size_t count = std::min<uint64_t>(length, bytes_.size() - offset);
  std::memcpy(out, bytes_.data() + offset, count);
  return count;
}

}  // namespace reshard::fs
