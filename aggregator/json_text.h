// How the server and its tools write text into JSON: the status JSON
// (job_status.cc), blkps-bsopts and blkps-checkpoint.
#pragma once

#include <string>

namespace blkps::server {

// `s` as a JSON string that is valid UTF-8 whatever `s` holds: quotes,
// backslashes and control bytes escaped, well-formed UTF-8 kept, and every
// other byte (a client's, in a refused command) as U+FFFD.
std::string JsonString(const std::string& s);

}  // namespace blkps::server
