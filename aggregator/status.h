// Status: the outcome of an operation that can fail, as a value.
//
// A Status is OK or carries an error code and a one-line message meant for a
// person ("params: expected a positive integer, got '0'"). Thread-compatible.
#pragma once

#include <string>
#include <utility>

namespace blkps::server {

class Status {
 public:
  enum class Code {
    kOk,
    kInvalidArgument,    // the caller's input is wrong: an option, a gradient
    kOutOfRange,         // an offset or length past the end of the model
    kNotFound,           // a named file or thing does not exist
    kResourceExhausted,  // not enough memory
    kIOError,            // a file could not be read or written
    kUnavailable,        // the job has failed (too many learners dead)
    kDeadlineExceeded,   // a held command waited past its bound
    kPermissionDenied,   // the caller may not do this (the learners' control LUN)
    kStandby,            // a backup not promoted: it serves no learner (doc/replicas.md)
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status OutOfRange(std::string msg) { return Status(Code::kOutOfRange, std::move(msg)); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status ResourceExhausted(std::string msg) { return Status(Code::kResourceExhausted, std::move(msg)); }
  static Status IOError(std::string msg) { return Status(Code::kIOError, std::move(msg)); }
  static Status Unavailable(std::string msg) { return Status(Code::kUnavailable, std::move(msg)); }
  static Status DeadlineExceeded(std::string msg) { return Status(Code::kDeadlineExceeded, std::move(msg)); }
  static Status PermissionDenied(std::string msg) { return Status(Code::kPermissionDenied, std::move(msg)); }
  static Status Standby(std::string msg) { return Status(Code::kStandby, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}

  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace blkps::server
