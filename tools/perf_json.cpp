// A recursive-descent JSON reader for coccl-perf --plot-from (see perf_json.hpp).
#include "perf_json.hpp"

#include <cstdlib>
#include <stdexcept>

namespace perf::json {

const Array* Value::array() const {
  auto* p = std::get_if<std::shared_ptr<Array>>(&v);
  return p ? p->get() : nullptr;
}

const Object* Value::object() const {
  auto* p = std::get_if<std::shared_ptr<Object>>(&v);
  return p ? p->get() : nullptr;
}

namespace {

// Deep enough for any coccl-perf file; bounds the recursion on hostile input.
constexpr int max_depth = 64;

class Reader {
 public:
  explicit Reader(const std::string& text) : s_(text) {}

  Value document() {
    Value v = value(0);
    space();
    if (at_ != s_.size()) fail("text after the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at byte " + std::to_string(at_));
  }
  void space() {
    while (at_ < s_.size() &&
           (s_[at_] == ' ' || s_[at_] == '\n' || s_[at_] == '\r' || s_[at_] == '\t'))
      ++at_;
  }
  bool take(char c) {
    space();
    if (at_ < s_.size() && s_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  bool word(const char* w) {
    const std::string_view sv(w);
    if (s_.compare(at_, sv.size(), sv) != 0) return false;
    at_ += sv.size();
    return true;
  }

  Value value(int depth) {
    if (depth > max_depth) fail("nesting too deep");
    space();
    if (at_ >= s_.size()) fail("unexpected end");
    const char c = s_[at_];
    if (c == '{') return Value{object(depth)};
    if (c == '[') return Value{array(depth)};
    if (c == '"') return Value{string()};
    if (word("true")) return Value{true};
    if (word("false")) return Value{false};
    if (word("null")) return Value{nullptr};
    return Value{number()};
  }

  std::shared_ptr<Object> object(int depth) {
    auto o = std::make_shared<Object>();
    expect('{');
    if (take('}')) return o;
    do {
      space();
      std::string key = string();
      expect(':');
      (*o)[std::move(key)] = value(depth + 1);
    } while (take(','));
    expect('}');
    return o;
  }

  std::shared_ptr<Array> array(int depth) {
    auto a = std::make_shared<Array>();
    expect('[');
    if (take(']')) return a;
    do a->push_back(value(depth + 1));
    while (take(','));
    expect(']');
    return a;
  }

  std::string string() {
    if (at_ >= s_.size() || s_[at_] != '"') fail("expected a string");
    ++at_;
    std::string out;
    for (;;) {
      if (at_ >= s_.size()) fail("unterminated string");
      const char c = s_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= s_.size()) fail("unterminated escape");
      const char e = s_[at_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          if (at_ + 4 > s_.size()) fail("short \\u escape");
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = s_[at_++];
            code <<= 4;
            if (h >= '0' && h <= '9')
              code |= h - '0';
            else if (h >= 'a' && h <= 'f')
              code |= h - 'a' + 10;
            else if (h >= 'A' && h <= 'F')
              code |= h - 'A' + 10;
            else
              fail("bad \\u escape");
          }
          out += code < 0x80 ? static_cast<char>(code) : '?';
          break;
        }
        default:
          fail("unknown escape");
      }
    }
  }

  double number() {
    // JSON's grammar: -? int frac? exp?, checked before strtod (which takes more, e.g. "inf").
    const std::size_t start = at_;
    auto digits = [&] {
      const std::size_t from = at_;
      while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') ++at_;
      return at_ > from;
    };
    if (at_ < s_.size() && s_[at_] == '-') ++at_;
    if (!digits()) fail("expected a value");
    if (at_ < s_.size() && s_[at_] == '.' && (++at_, !digits())) fail("bad fraction");
    if (at_ < s_.size() && (s_[at_] == 'e' || s_[at_] == 'E')) {
      ++at_;
      if (at_ < s_.size() && (s_[at_] == '+' || s_[at_] == '-')) ++at_;
      if (!digits()) fail("bad exponent");
    }
    return std::strtod(s_.substr(start, at_ - start).c_str(), nullptr);
  }

  const std::string& s_;
  std::size_t at_ = 0;
};

}  // namespace

Value parse(const std::string& text) { return Reader(text).document(); }

}  // namespace perf::json
