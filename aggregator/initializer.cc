#include "initializer.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

namespace blkps::server {
namespace {

Status ParseScale(const std::string& kind, const std::string& arg, double* out) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(arg.c_str(), &end);
  if (arg.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || v <= 0) {
    return Status::InvalidArgument("init: " + kind + ":<x> needs a finite number > 0, got '" + arg + "'");
  }
  *out = v;
  return Status::OK();
}

}  // namespace

Status ParseInitSpec(const std::string& text, InitSpec* spec) {
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : text.substr(colon + 1);
  InitSpec parsed = *spec;
  if (kind == "zeros" && colon == std::string::npos) {
    parsed.kind = InitSpec::Kind::kZeros;
  } else if (kind == "uniform") {
    parsed.kind = InitSpec::Kind::kUniform;
    Status s = ParseScale(kind, arg, &parsed.scale);
    if (!s.ok()) return s;
  } else if (kind == "normal") {
    parsed.kind = InitSpec::Kind::kNormal;
    Status s = ParseScale(kind, arg, &parsed.scale);
    if (!s.ok()) return s;
  } else if (kind == "file" && !arg.empty()) {
    parsed.kind = InitSpec::Kind::kFile;
    parsed.path = arg;
  } else {
    return Status::InvalidArgument("init: expected zeros, uniform:<a>, normal:<std> or file:<path>, got '" + text +
                                   "'");
  }
  *spec = parsed;
  return Status::OK();
}

Status InitializeWeights(const InitSpec& spec, float* w, uint64_t n) {
  switch (spec.kind) {
    case InitSpec::Kind::kZeros: return Status::OK();  // already zero

    case InitSpec::Kind::kUniform: {
      std::mt19937_64 rng(spec.seed);
      std::uniform_real_distribution<float> dist(-spec.scale, spec.scale);
      for (uint64_t i = 0; i < n; ++i) w[i] = dist(rng);
      return Status::OK();
    }
    case InitSpec::Kind::kNormal: {
      std::mt19937_64 rng(spec.seed);
      std::normal_distribution<float> dist(0.0f, spec.scale);
      for (uint64_t i = 0; i < n; ++i) w[i] = dist(rng);
      return Status::OK();
    }
    case InitSpec::Kind::kFile: {
      std::ifstream in(spec.path, std::ios::binary | std::ios::ate);
      if (!in) {
        return Status::NotFound("init: cannot open '" + spec.path + "': " + std::strerror(errno));
      }
      const uint64_t want = n * sizeof(float);
      const uint64_t have = static_cast<uint64_t>(in.tellg());
      if (have != want) {
        return Status::InvalidArgument("init: '" + spec.path + "' holds " + std::to_string(have) +
                                       " bytes; a model of " + std::to_string(n) +
                                       " float32 parameters needs exactly " + std::to_string(want));
      }
      in.seekg(0);
      if (!in.read(reinterpret_cast<char*>(w), static_cast<std::streamsize>(want))) {
        return Status::IOError("init: cannot read '" + spec.path + "'");
      }
      return Status::OK();
    }
  }
  return Status::InvalidArgument("init: unknown kind");
}

}  // namespace blkps::server
