// libblkps's reader of CHAP credentials files (ReadChapFile), for
// tests/chap_file_test.py: one line per file named on the command line,
// "ok USER SECRET TARGET_USER TARGET_SECRET" ("-" where empty) or
// "error MESSAGE" (without Status's "blkps: " prefix, as the CLI prints
// its own).
#include <cstdio>
#include <string>

#include "device.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    blkps::ChapCredentials chap;
    const blkps::Status s = blkps::ReadChapFile(argv[i], &chap);
    if (!s.ok()) {
      const std::string& m = s.message();
      std::printf("error %s\n", m.c_str() + (m.rfind("blkps: ", 0) == 0 ? 7 : 0));
      continue;
    }
    auto shown = [](const std::string& v) { return v.empty() ? "-" : v.c_str(); };
    std::printf("ok %s %s %s %s\n", shown(chap.user), shown(chap.secret), shown(chap.target_user),
                shown(chap.target_secret));
  }
  return 0;
}
