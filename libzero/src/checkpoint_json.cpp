#include "checkpoint_json.hpp"

#include <charconv>
#include <cmath>
#include <cstring>
#include <system_error>

#include "zero/error.hpp"

namespace zero::json {

// ---------------------------------------------------------------- building

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::boolean;
  v.bool_ = b;
  return v;
}

Value Value::integer(std::int64_t x) {
  Value v;
  v.kind_ = Kind::number;
  v.text_ = std::to_string(x);
  return v;
}

Value Value::number(double x) {
  ZERO_CHECK(std::isfinite(x), "json: cannot write the non-finite number " + std::to_string(x) +
                                   " (JSON has no inf/nan)");
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest text that reads back exactly
  Value v;
  v.kind_ = Kind::number;
  v.text_.assign(buf, r.ptr);  // to_chars' forms ("1e+20", "0.1") are all valid JSON numbers
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::string;
  v.text_ = std::move(s);
  return v;
}

Value Value::array() {
  Value v;
  v.kind_ = Kind::array;
  return v;
}

Value Value::object() {
  Value v;
  v.kind_ = Kind::object;
  return v;
}

Value& Value::set(std::string key, Value v) {
  ZERO_CHECK(kind_ == Kind::object, "json: set('" + key + "') on a value that is not an object");
  ZERO_CHECK(find(key) == nullptr, "json: duplicate key '" + key + "'");
  members_.emplace_back(std::move(key), std::move(v));
  return members_.back().second;
}

Value& Value::push(Value v) {
  ZERO_CHECK(kind_ == Kind::array, "json: push on a value that is not an array");
  items_.push_back(std::move(v));
  return items_.back();
}

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}

// ---------------------------------------------------------------- writing

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not one.
std::size_t utf8_length(std::string_view s, std::size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  return n;
}

void write_string(std::string& out, std::string_view s, StringMode mode) {
  static const char* kHex = "0123456789abcdef";
  out += '"';
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
    else if (c >= 0x80 && mode == StringMode::Utf8) {
      std::size_t n = utf8_length(s, i);
      ZERO_CHECK(n > 0, "json: the string '" + std::string(s) +
                            "' is not valid UTF-8; safetensors names must be UTF-8 text");
      out.append(s.substr(i, n));
      i += n - 1;
    } else {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  out += '"';
}

void write_value(std::string& out, const Value& v, int indent, int depth, StringMode mode) {
  auto newline = [&](int d) {
    if (indent <= 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(indent * d), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::null: out += "null"; break;
    case Value::Kind::boolean: out += v.bool_value() ? "true" : "false"; break;
    case Value::Kind::number: out += v.text(); break;
    case Value::Kind::string: write_string(out, v.text(), mode); break;
    case Value::Kind::array: {
      // Arrays of scalars (shapes) stay on one line; arrays of containers get a line each.
      bool flat = true;
      for (const auto& x : v.items())
        if (x.kind() == Value::Kind::array || x.kind() == Value::Kind::object) flat = false;
      out += '[';
      for (std::size_t i = 0; i < v.items().size(); ++i) {
        if (i) out += flat && indent > 0 ? ", " : ",";
        if (!flat) newline(depth + 1);
        write_value(out, v.items()[i], indent, depth + 1, mode);
      }
      if (!flat && !v.items().empty()) newline(depth);
      out += ']';
      break;
    }
    case Value::Kind::object: {
      out += '{';
      for (std::size_t i = 0; i < v.members().size(); ++i) {
        if (i) out += ',';
        newline(depth + 1);
        write_string(out, v.members()[i].first, mode);
        out += indent > 0 ? ": " : ":";
        write_value(out, v.members()[i].second, indent, depth + 1, mode);
      }
      if (!v.members().empty()) newline(depth);
      out += '}';
      break;
    }
  }
}

}  // namespace

std::string dump(const Value& v, int indent, StringMode mode) {
  std::string out;
  write_value(out, v, indent, 0, mode);
  if (indent > 0) out += '\n';
  return out;
}

// ---------------------------------------------------------------- parsing

class Parser {
 public:
  Parser(std::string_view t, const std::string& origin) : t_(t), origin_(origin) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (i_ != t_.size()) fail("unexpected text after the end of the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    ZERO_THROW(origin_ + ": malformed JSON at byte " + std::to_string(i_) + ": " + what +
               "; the file is corrupted or was not written by libzero");
  }
  void skip_ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\t' || t_[i_] == '\r')) ++i_;
  }
  char peek() { return i_ < t_.size() ? t_[i_] : '\0'; }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  void literal(std::string_view word) {
    if (t_.substr(i_, word.size()) != word) fail("unknown literal");
    i_ += word.size();
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Value::string(string());
    if (c == 't') { literal("true"); return Value::boolean(true); }
    if (c == 'f') { literal("false"); return Value::boolean(false); }
    if (c == 'n') { literal("null"); return Value(); }
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(i_ < t_.size() ? "unexpected character" : "unexpected end of text");
  }

  Value object(int depth) {
    expect('{');
    Value v = Value::object();
    skip_ws();
    if (peek() == '}') {
      ++i_;
      return v;
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a member name in quotes");
      std::size_t at = i_;
      std::string key = string();
      if (v.find(key) != nullptr) {
        i_ = at;
        fail("duplicate member name '" + key + "'");
      }
      skip_ws();
      expect(':');
      skip_ws();
      v.members_.emplace_back(std::move(key), value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}');
      return v;
    }
  }

  Value array(int depth) {
    expect('[');
    Value v = Value::array();
    skip_ws();
    if (peek() == ']') {
      ++i_;
      return v;
    }
    for (;;) {
      skip_ws();
      v.items_.push_back(value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect(']');
      return v;
    }
  }

  int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    fail("bad hex digit in a \\u escape");
  }

  std::string string() {
    expect('"');
    std::string s;
    for (;;) {
      if (i_ >= t_.size()) fail("unterminated string");
      auto c = static_cast<unsigned char>(t_[i_++]);
      if (c == '"') return s;
      if (c < 0x20) fail("raw control character inside a string");
      if (c >= 0x80) fail("raw non-ASCII byte inside a string (libzero escapes them)");
      if (c != '\\') {
        s += static_cast<char>(c);
        continue;
      }
      if (i_ >= t_.size()) fail("unterminated escape");
      char e = t_[i_++];
      switch (e) {
        case '"': s += '"'; break;
        case '\\': s += '\\'; break;
        case '/': s += '/'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'n': s += '\n'; break;
        case 'r': s += '\r'; break;
        case 't': s += '\t'; break;
        case 'u': {
          if (i_ + 4 > t_.size()) fail("truncated \\u escape");
          int code = 0;
          for (int k = 0; k < 4; ++k) code = code * 16 + hex_digit(t_[i_++]);
          if (code > 0xff) fail("\\u escape above \\u00ff (libzero strings are byte strings)");
          s += static_cast<char>(code);
          break;
        }
        default: fail(std::string("unknown escape '\\") + e + "'");
      }
    }
  }

  Value number() {
    std::size_t b = i_;
    auto digits = [&] {
      std::size_t s = i_;
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') ++i_;
      return i_ - s;
    };
    if (peek() == '-') ++i_;
    if (peek() == '0') ++i_;
    else if (digits() == 0) fail("malformed number");
    if (peek() == '.') {
      ++i_;
      if (digits() == 0) fail("malformed number (no digits after '.')");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      if (digits() == 0) fail("malformed number (no exponent digits)");
    }
    if (i_ - b > 64) fail("number text longer than 64 characters");
    Value v;
    v.kind_ = Value::Kind::number;
    v.text_ = std::string(t_.substr(b, i_ - b));
    return v;
  }

  std::string_view t_;
  const std::string& origin_;
  std::size_t i_ = 0;
};

Value parse(std::string_view text, const std::string& origin) { return Parser(text, origin).document(); }

// ---------------------------------------------------------------- located reading

static const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::null: return "null";
    case Value::Kind::boolean: return "a boolean";
    case Value::Kind::number: return "a number";
    case Value::Kind::string: return "a string";
    case Value::Kind::array: return "an array";
    case Value::Kind::object: return "an object";
  }
  return "?";
}

void Field::fail(const std::string& problem) const {
  ZERO_THROW(origin_ + ": field '" + (path_.empty() ? std::string("<document>") : path_) + "' " + problem +
             (hint_.empty() ? std::string() : "; " + hint_));
}

void Field::expect(Value::Kind k, const char* what) const {
  if (v_->kind() != k) fail(std::string("must be ") + what + ", found " + kind_name(v_->kind()));
}

Field Field::at(std::string_view key) const {
  expect(Value::Kind::object, "an object");
  const Value* m = v_->find(key);
  std::string p = path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  if (!m) Field(*v_, origin_, p, hint_).fail("is missing");
  return Field(*m, origin_, p, hint_);
}

bool Field::has(std::string_view key) const {
  expect(Value::Kind::object, "an object");
  return v_->find(key) != nullptr;
}

Field Field::operator[](std::size_t i) const {
  expect(Value::Kind::array, "an array");
  std::string p = path_ + "[" + std::to_string(i) + "]";
  if (i >= v_->items().size()) Field(*v_, origin_, p, hint_).fail("is missing");
  return Field(v_->items()[i], origin_, p, hint_);
}

std::size_t Field::size() const {
  expect(Value::Kind::array, "an array");
  return v_->items().size();
}

const std::vector<std::pair<std::string, Value>>& Field::members() const {
  expect(Value::Kind::object, "an object");
  return v_->members();
}

void Field::expect_keys(std::initializer_list<std::string_view> required,
                        std::initializer_list<std::string_view> optional) const {
  expect(Value::Kind::object, "an object");
  for (auto k : required) (void)at(k);
  for (const auto& [k, v] : v_->members()) {
    bool known = false;
    for (auto r : required) known = known || r == k;
    for (auto o : optional) known = known || o == k;
    if (!known) {
      std::string p = path_.empty() ? k : path_ + "." + k;
      Field(v, origin_, p, hint_).fail("is not a field of this format version");
    }
  }
}

std::int64_t Field::i64(std::int64_t lo, std::int64_t hi) const {
  expect(Value::Kind::number, "an integer");
  const std::string& t = v_->text();
  std::int64_t x = 0;
  auto r = std::from_chars(t.data(), t.data() + t.size(), x);
  if (r.ec != std::errc() || r.ptr != t.data() + t.size()) fail("must be an integer that fits 64 bits, found " + t);
  if (x < lo || x > hi)
    fail("= " + t + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

std::uint64_t Field::hex64() const {
  const std::string& t = str();
  std::uint64_t x = 0;
  if (t.size() != 18 || t[0] != '0' || t[1] != 'x') fail("must be \"0x\" and 16 hex digits, found \"" + t + "\"");
  auto r = std::from_chars(t.data() + 2, t.data() + t.size(), x, 16);
  if (r.ec != std::errc() || r.ptr != t.data() + t.size()) fail("must be \"0x\" and 16 hex digits, found \"" + t + "\"");
  return x;
}

double Field::f64() const {
  expect(Value::Kind::number, "a number");
  const std::string& t = v_->text();
  double x = 0;
  auto r = std::from_chars(t.data(), t.data() + t.size(), x);
  if (r.ec != std::errc() || r.ptr != t.data() + t.size() || !std::isfinite(x)) fail("must be a finite number, found " + t);
  return x;
}

bool Field::boolean() const {
  expect(Value::Kind::boolean, "true or false");
  return v_->bool_value();
}

const std::string& Field::str() const {
  expect(Value::Kind::string, "a string");
  return v_->text();
}

std::string hex64(std::uint64_t v) {
  static const char* kHex = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 15; i >= 0; --i) s += kHex[(v >> (4 * i)) & 15];
  return s;
}

}  // namespace zero::json
