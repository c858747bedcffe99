// Status: the outcome of an operation inside libblkps: ok, or a positive
// errno value with a one-line message for the user ("blkps: ...").
//
// A Status is a plain value; copy and move it freely. The public APIs turn it
// into a negative errno plus last_error() at the boundary (model.cc).

#ifndef BLKPS_LEARNER_STATUS_H_
#define BLKPS_LEARNER_STATUS_H_

#include <string>

namespace blkps {

class Status {
 public:
  Status() = default;  // ok

  // An error with errno value `code` (> 0) and the message
  // "blkps: " followed by the printf-formatted text.
  static Status Error(int code, const char* format, ...) __attribute__((format(printf, 2, 3)));

  bool ok() const { return code_ == 0; }
  int code() const { return code_; }  // errno value; 0 when ok
  const std::string& message() const { return message_; }
  // The message without its "blkps: ", to go on with in another message.
  const char* reason() const { return message_.c_str() + (message_.rfind("blkps: ", 0) == 0 ? 7 : 0); }

 private:
  int code_ = 0;
  std::string message_;
};

}  // namespace blkps

#endif  // BLKPS_LEARNER_STATUS_H_
