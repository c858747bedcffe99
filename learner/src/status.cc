#include "status.h"

#include <cstdarg>
#include <cstdio>

namespace blkps {

Status Status::Error(int code, const char* format, ...) {
  char text[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  Status status;
  status.code_ = code;
  status.message_ = std::string("blkps: ") + text;
  return status;
}

}  // namespace blkps
