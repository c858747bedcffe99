// A strict check that a text is one JSON value (RFC 8259) in well-formed
// UTF-8, for tests and fuzz harnesses that must see the status JSON parse as
// any client's parser would. It checks; it builds nothing.
#pragma once

#include <cctype>
#include <cstddef>
#include <string>

namespace blkps_test {

class JsonCheck {
 public:
  // "" if `text` is one JSON value (surrounding whitespace allowed) in
  // well-formed UTF-8, else what is wrong and where.
  static std::string Problem(const std::string& text) {
    JsonCheck c(text);
    c.Space();
    if (!c.Value(0)) return c.why_;
    c.Space();
    if (c.at_ != text.size()) c.Fail("text after the value");
    return c.why_;
  }

 private:
  explicit JsonCheck(const std::string& t) : t_(t) {}
  const std::string& t_;
  size_t at_ = 0;
  std::string why_;

  bool Fail(const std::string& why) {
    if (why_.empty()) why_ = why + " at byte " + std::to_string(at_);
    return false;
  }
  unsigned Peek() const { return at_ < t_.size() ? static_cast<unsigned char>(t_[at_]) : 0x100u; }
  void Space() {
    while (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r') ++at_;
  }
  bool Eat(char c) {
    if (Peek() != static_cast<unsigned char>(c)) return false;
    ++at_;
    return true;
  }
  bool Value(int depth) {
    if (depth > 64) return Fail("nested too deep");
    const unsigned c = Peek();
    if (c == '{') return Object(depth);
    if (c == '[') return Array(depth);
    if (c == '"') return String();
    if (c == '-' || (c >= '0' && c <= '9')) return Number();
    for (const char* word : {"true", "false", "null"}) {
      if (t_.compare(at_, std::string(word).size(), word) == 0) {
        at_ += std::string(word).size();
        return true;
      }
    }
    return Fail("expected a value");
  }
  bool Object(int depth) {
    ++at_;
    Space();
    if (Eat('}')) return true;
    for (;;) {
      Space();
      if (Peek() != '"' || !String()) return Fail("expected a key");
      Space();
      if (!Eat(':')) return Fail("expected ':'");
      Space();
      if (!Value(depth + 1)) return false;
      Space();
      if (Eat('}')) return true;
      if (!Eat(',')) return Fail("expected ',' or '}'");
    }
  }
  bool Array(int depth) {
    ++at_;
    Space();
    if (Eat(']')) return true;
    for (;;) {
      Space();
      if (!Value(depth + 1)) return false;
      Space();
      if (Eat(']')) return true;
      if (!Eat(',')) return Fail("expected ',' or ']'");
    }
  }
  bool Digits() {
    const size_t start = at_;
    while (Peek() >= '0' && Peek() <= '9') ++at_;
    return at_ > start;
  }
  bool Number() {
    Eat('-');
    if (Eat('0')) {
      if (Peek() >= '0' && Peek() <= '9') return Fail("leading zero");
    } else if (!Digits()) {
      return Fail("expected digits");
    }
    if (Eat('.') && !Digits()) return Fail("expected digits after '.'");
    if (Peek() == 'e' || Peek() == 'E') {
      ++at_;
      if (!Eat('+')) Eat('-');
      if (!Digits()) return Fail("expected exponent digits");
    }
    return true;
  }
  bool String() {
    ++at_;
    for (;;) {
      const unsigned c = Peek();
      if (c == 0x100u) return Fail("unterminated string");
      if (c == '"') {
        ++at_;
        return true;
      }
      if (c < 0x20) return Fail("control byte in a string");
      if (c == '\\') {
        ++at_;
        const unsigned e = Peek();
        if (e == 'u') {
          for (int k = 1; k <= 4; ++k) {
            const unsigned h = at_ + k < t_.size() ? static_cast<unsigned char>(t_[at_ + k]) : 0;
            if (!std::isxdigit(static_cast<int>(h))) return Fail("bad \\u escape");
          }
          at_ += 5;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
          ++at_;
        } else {
          return Fail("bad escape");
        }
        continue;
      }
      if (c < 0x80) {
        ++at_;
        continue;
      }
      if (!Utf8()) return Fail("invalid UTF-8");
    }
  }
  // One well-formed multi-byte UTF-8 sequence (RFC 3629).
  bool Utf8() {
    const auto b = [&](size_t k) { return at_ + k < t_.size() ? static_cast<unsigned char>(t_[at_ + k]) : 0u; };
    const unsigned c = b(0);
    size_t n = 0;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      n = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 3;
      lo = c == 0xe0 ? 0xa0 : 0x80;
      hi = c == 0xed ? 0x9f : 0xbf;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 4;
      lo = c == 0xf0 ? 0x90 : 0x80;
      hi = c == 0xf4 ? 0x8f : 0xbf;
    } else {
      return false;
    }
    if (b(1) < lo || b(1) > hi) return false;
    for (size_t k = 2; k < n; ++k) {
      if ((b(k) & 0xc0) != 0x80) return false;
    }
    at_ += n;
    return true;
  }
};

}  // namespace blkps_test
