// TempDir: a scratch folder for one test (a target's state, checkpoint
// files, secret files), made as /tmp/PREFIX-XXXXXX and removed with all it
// holds when the TempDir goes out of scope: also when an ASSERT ends the
// test early. `path` is empty if the folder could not be made.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace blkps_test {

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "blkps-test") {
    std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path = tmpl;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace blkps_test
