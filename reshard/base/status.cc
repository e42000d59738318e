#include "reshard/base/status.h"

#include <cstring>

namespace reshard {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kCorrupt: return "corrupt";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kOutOfRange: return "out of range";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

Status::Status(StatusCode code, std::string message) {
  // An OK code never carries a message: that keeps ok() a single pointer test.
  if (code != StatusCode::kOk) rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string out(StatusCodeName(code()));
  out += ": ";
  out += rep_->message;
  return out;
}

Status& Status::Annotate(std::string_view context) & {
  if (!ok() && !context.empty()) {
    std::string msg(context);
    msg += ": ";
    msg += rep_->message;
    rep_ = std::make_shared<const Rep>(Rep{rep_->code, std::move(msg)});
  }
  return *this;
}

Status&& Status::Annotate(std::string_view context) && { return std::move(Annotate(context)); }

Status InvalidArgument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
Status NotFound(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
Status Corrupt(std::string m) { return Status(StatusCode::kCorrupt, std::move(m)); }
Status Unsupported(std::string m) { return Status(StatusCode::kUnsupported, std::move(m)); }
Status IoError(std::string m) { return Status(StatusCode::kIoError, std::move(m)); }
Status OutOfRange(std::string m) { return Status(StatusCode::kOutOfRange, std::move(m)); }
Status ResourceExhausted(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

Status ErrnoError(std::string_view context, int errno_value) {
  std::string msg(context);
  msg += ": ";
  msg += std::strerror(errno_value);
  return Status(StatusCode::kIoError, std::move(msg));
}

}  // namespace reshard
