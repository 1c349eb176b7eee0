// Strict JSON for checkpoint metadata and safetensors headers, on nlohmann-json.
//
// Checkpoints are read back by code that must trust nothing. nlohmann's parser already accepts
// exactly RFC 8259 (no comments, no trailing commas, no NaN, valid UTF-8 only); parse() adds
// what it lets through: a duplicate key (nlohmann keeps the last one silently, so a file could
// say two things at once) and nesting deeper than kMaxDepth. Integers stay int64 and doubles are
// written as their shortest round-trip text, so both read back bit for bit.
//
// JSON strings are Unicode text, so arbitrary bytes (an application's RNG state) travel as
// lowercase hex (to_hex / Field::hex_bytes). Objects keep their members in insertion order.
//
// Field is a located view for reading a document: errors say "<origin>: field 'a.b[3]'
// <problem>; <hint>", where the hint tells the user what to do about a bad file.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace zero::json {

using Json = nlohmann::ordered_json;

// Parses `text`; errors name `origin` and where in the text the problem is.
constexpr int kMaxDepth = 32;
Json parse(std::string_view text, const std::string& origin);

// Pretty: two-space indent, a final newline, pure ASCII (other characters as \u escapes).
// Compact: no spaces, UTF-8 passes through (what safetensors readers expect). Strings that are
// not UTF-8 are an error that names `what` (the kind of document).
std::string dump_pretty(const Json& v, const char* what);
std::string dump_compact(const Json& v, const char* what);

std::string hex64(std::uint64_t v);          // "0x" + 16 hex digits
std::string to_hex(std::string_view bytes);  // two lowercase hex digits per byte

class Field {
 public:
  Field(const Json& v, std::string origin, std::string path, std::string hint)
      : v_(&v), origin_(std::move(origin)), path_(std::move(path)), hint_(std::move(hint)) {}

  Field at(std::string_view key) const;  // required member
  bool has(std::string_view key) const;
  Field operator[](std::size_t i) const;  // array element
  std::size_t size() const;               // array length
  std::vector<std::string> keys() const;  // an object's member names, in order
  // The object has exactly these keys (`optional` may be absent); anything else is an error.
  void expect_keys(std::initializer_list<std::string_view> required,
                   std::initializer_list<std::string_view> optional = {}) const;

  std::int64_t i64(std::int64_t lo = INT64_MIN, std::int64_t hi = INT64_MAX) const;
  std::uint64_t hex64() const;    // "0x" + 16 hex digits
  std::string hex_bytes() const;  // to_hex's text back to bytes
  double f64() const;
  bool boolean() const;
  const std::string& str() const;
  const Json& value() const { return *v_; }
  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& problem) const;

 private:
  void expect(bool ok, const char* what) const;
  const Json* v_;
  std::string origin_, path_, hint_;
};

}  // namespace zero::json
