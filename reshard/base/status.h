// Status and Result<T>: errors as values for everything under reshard/.
//
// reshard/ never throws for bad input. Every function that can fail on data it did not create
// returns a Status or a Result<T>; both are [[nodiscard]]. A Status is a code plus one message
// line that names the file, the field and the values involved, e.g.
//   "zero/embed.weight/fp32.pt: data.pkl: LONG_BINPUT id 4294967295 exceeds memo limit 1048576".
// Layers add context with Annotate() ("outer: inner"). Each boundary converts a Status exactly
// once (fs/ to an errno, the CLI to an exit code and a log line, gpu/ to a Python exception).
//
// An OK Status holds no allocation. Status and Result are movable and copyable; they are not
// synchronised (use one per thread, like any value).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace reshard {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller asked for something that cannot be (bad flag, bad split)
  kNotFound,           // a file, record or key that must exist does not
  kCorrupt,            // input bytes violate their format (truncated, garbled, inconsistent)
  kUnsupported,        // well-formed input this version does not handle (compressed zip, new UCP)
  kIoError,            // the OS failed an operation (errno carried in the message)
  kOutOfRange,         // an offset or length outside an object
  kResourceExhausted,  // a configured limit was hit (pickle memo, depth, memory budget)
  kInternal,           // a broken invariant that input could not cause
};

// Returns a stable lower-case name for `code` ("corrupt", "not found", ...).
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The message without the code name; empty when OK.
  const std::string& message() const;
  // "corrupt: <message>", or "ok".
  std::string ToString() const;

  // Prefixes the message with `context + ": "`; no-op when OK. Returns *this for chaining.
  Status& Annotate(std::string_view context) &;
  Status&& Annotate(std::string_view context) &&;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // null when OK; immutable once built, so copies share it
};

// Factories, named after the codes.
Status InvalidArgument(std::string message);
Status NotFound(std::string message);
Status Corrupt(std::string message);
Status Unsupported(std::string message);
Status IoError(std::string message);
Status OutOfRange(std::string message);
Status ResourceExhausted(std::string message);
Status Internal(std::string message);
// An IoError that names `context` (usually a path) and the text of `errno_value`.
Status ErrnoError(std::string_view context, int errno_value);

// Result<T> holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design, like absl::StatusOr
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error; OK when the Result holds a value.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  // Precondition: ok(). Checked with std::get (throws bad_variant_access on misuse).
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace reshard

#define RS_INTERNAL_CONCAT2(a, b) a##b
#define RS_INTERNAL_CONCAT(a, b) RS_INTERNAL_CONCAT2(a, b)

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define RS_RETURN_IF_ERROR(expr)                             \
  do {                                                       \
    ::reshard::Status rs_status_ = (expr);                   \
    if (!rs_status_.ok()) return rs_status_;                 \
  } while (0)

// `RS_ASSIGN_OR_RETURN(auto x, F());` declares x from F()'s value, or returns its error.
#define RS_ASSIGN_OR_RETURN(lhs, expr) \
  RS_INTERNAL_ASSIGN_OR_RETURN(RS_INTERNAL_CONCAT(rs_result_, __LINE__), lhs, expr)
#define RS_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
