#include "initializer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "parallel.h"

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

// SplitMix64's output function (Steele, Lea and Flood 2014): a bijection
// that mixes every input bit into every output bit.
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A uniform float in (0, 1) from the top 24 bits of x.
float Unit(uint64_t x) { return (static_cast<float>(x >> 40) + 0.5f) * (1.0f / 16777216.0f); }

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;  // 2^64 / golden ratio

// Values [first, first + n) of a dense model (InitializeWeights) into w.
// A uniform value is drawn from Mix64 of its index; normal values in pairs,
// (2j, 2j + 1), by Box-Muller's cosine and sine from Mix64 of j.
void DenseValues(const InitSpec& spec, uint64_t first, uint64_t n, float* w) {
  const uint64_t key = Mix64(spec.seed ^ 0x6a09e667f3bcc909ull);
  const float scale = static_cast<float>(spec.scale);
  const uint64_t end = first + n;
  if (spec.kind == InitSpec::Kind::kUniform) {
    for (uint64_t i = first; i < end; ++i) w[i - first] = scale * (2.0f * Unit(Mix64(key + i * kGolden)) - 1.0f);
    return;
  }
  for (uint64_t j = first / 2; 2 * j < end; ++j) {
    const uint64_t x = Mix64(key + j * kGolden);
    const float u1 = Unit(x), u2 = Unit(x << 24);
    const float r = scale * std::sqrt(-2.0f * std::log(u1));
    const float angle = 6.28318530718f * u2;
    if (2 * j >= first) w[2 * j - first] = r * std::cos(angle);
    if (2 * j + 1 >= first && 2 * j + 1 < end) w[2 * j + 1 - first] = r * std::sin(angle);
  }
}

}  // namespace

void InitializeRow(const InitSpec& spec, uint64_t row, float* w, uint64_t width) {
  if (spec.kind == InitSpec::Kind::kZeros || spec.kind == InitSpec::Kind::kFile) {
    std::fill_n(w, width, 0.0f);
    return;
  }
  // Value i of the row is a function of (seed, row, i) alone.
  const uint64_t key = Mix64(spec.seed ^ Mix64(row + 0x9e3779b97f4a7c15ull));
  const float scale = static_cast<float>(spec.scale);
  for (uint64_t i = 0; i < width; ++i) {
    const uint64_t x = Mix64(key + i * 0x9e3779b97f4a7c15ull);
    if (spec.kind == InitSpec::Kind::kUniform) {
      w[i] = scale * (2.0f * Unit(x) - 1.0f);
    } else {
      // Box-Muller from two disjoint 24-bit parts of x.
      const float u1 = Unit(x), u2 = Unit(x << 24);
      w[i] = scale * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530718f * u2);
    }
  }
}

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

    case InitSpec::Kind::kUniform:
    case InitSpec::Kind::kNormal: {
      // Parameter i's value is a function of (seed, i) alone: pieces of the
      // model are filled in parallel, in any order, by any number of threads
      // (which also commit the pages in parallel).
      constexpr uint64_t kPiece = uint64_t{1} << 22;  // parameters
      ForEachInParallel((n + kPiece - 1) / kPiece, [&](uint64_t k) {
        const uint64_t first = k * kPiece;
        DenseValues(spec, first, std::min(kPiece, n - first), w + first);
      });
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
