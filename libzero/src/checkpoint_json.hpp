// A small, strict JSON reader and writer for checkpoint metadata and safetensors headers.
//
// Checkpoints are read back by code that must trust nothing, so the parser accepts exactly
// RFC 8259 JSON and nothing more: no comments, no trailing commas, no duplicate keys, no NaN,
// a bounded nesting depth, and strings that are byte strings. The writer escapes every byte
// outside printable ASCII as \u00XX (ByteStrings) so that an application's opaque blobs (RNG
// states, data positions) survive a round trip unchanged; the parser maps \u00XX back to that
// byte and rejects larger code points, which this writer never emits. The safetensors header
// is written in Utf8 mode instead (names pass through as UTF-8, as other readers expect).
// Numbers keep their text, so an int64 reads back exactly and a double written as the
// shortest round-trip text reads back bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zero::json {

class Value {
 public:
  enum class Kind { null, boolean, number, string, array, object };

  Value() = default;
  static Value boolean(bool b);
  static Value integer(std::int64_t v);
  static Value number(double v);  // finite only
  static Value string(std::string s);
  static Value array();
  static Value object();

  Kind kind() const { return kind_; }
  // Object members keep their order; set() appends (the key must be new).
  Value& set(std::string key, Value v);
  Value& push(Value v);

  // Raw access for readers; Field (below) wraps these with checked, located errors.
  bool bool_value() const { return bool_; }
  const std::string& text() const { return text_; }  // string contents or number text
  const std::vector<Value>& items() const { return items_; }
  const std::vector<std::pair<std::string, Value>>& members() const { return members_; }
  const Value* find(std::string_view key) const;

 private:
  friend class Parser;
  Kind kind_ = Kind::null;
  bool bool_ = false;
  std::string text_;
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

enum class StringMode { ByteStrings, Utf8 };

// Pretty (indent > 0, one member per line) or compact (indent 0) text.
std::string dump(const Value& v, int indent = 2, StringMode mode = StringMode::ByteStrings);

// Parses `text`; errors name `origin` and the byte offset. Depth is bounded by kMaxDepth.
constexpr int kMaxDepth = 32;
Value parse(std::string_view text, const std::string& origin);

// A located view of one value while reading a document: errors say "<origin>: field 'a.b[3]'
// <problem>" and end with `hint`, which tells the user what to do about a bad file.
class Field {
 public:
  Field(const Value& v, std::string origin, std::string path, std::string hint)
      : v_(&v), origin_(std::move(origin)), path_(std::move(path)), hint_(std::move(hint)) {}

  Field at(std::string_view key) const;      // required member
  bool has(std::string_view key) const;
  Field operator[](std::size_t i) const;     // array element
  std::size_t size() const;                  // array length
  // An object's members, for maps with free keys (the client state).
  const std::vector<std::pair<std::string, Value>>& members() const;
  // The object has exactly these keys (`optional` may be absent); anything else is an error.
  void expect_keys(std::initializer_list<std::string_view> required,
                   std::initializer_list<std::string_view> optional = {}) const;

  std::int64_t i64(std::int64_t lo = INT64_MIN, std::int64_t hi = INT64_MAX) const;
  std::uint64_t hex64() const;               // "0x" + 16 hex digits
  double f64() const;
  bool boolean() const;
  const std::string& str() const;
  const Value& value() const { return *v_; }
  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& problem) const;

 private:
  void expect(Value::Kind k, const char* what) const;
  const Value* v_;
  std::string origin_, path_, hint_;
};

std::string hex64(std::uint64_t v);

}  // namespace zero::json
