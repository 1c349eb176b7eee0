#include "checkpoint/json.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <set>
#include <system_error>

#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero::json {

Json parse(std::string_view text, const std::string& origin) {
  const char* kFix = "; the file is corrupted or was not written by libzero";
  std::vector<std::set<std::string>> open;  // member names seen so far, per open object
  auto strict = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= kMaxDepth)
          ZERO_THROW(fmt::format("{}: malformed JSON: nesting deeper than {} levels{}", origin, kMaxDepth, kFix));
        if (event == Json::parse_event_t::object_start) open.emplace_back();
        break;
      case Json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!open.back().insert(key).second)
          ZERO_THROW(
              fmt::format("{}: malformed JSON: duplicate member name '{}' (a strict reader cannot tell "
                          "which one is meant){}",
                          origin, escape_bytes(key), kFix));
        break;
      }
      case Json::parse_event_t::object_end: open.pop_back(); break;
      default: break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), strict, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    ZERO_THROW(fmt::format("{}: malformed JSON: {}{}", origin, e.what(), kFix));
  }
}

namespace {
std::string dump_checked(const Json& v, int indent, bool ascii, const char* what) {
  try {
    return v.dump(indent, ' ', ascii);
  } catch (const Json::exception& e) {
    ZERO_THROW(
        fmt::format("{}: cannot write a string that is not valid UTF-8 ({}); names and keys must be UTF-8 "
                    "text",
                    what, e.what()));
  }
}
}  // namespace

std::string dump_pretty(const Json& v, const char* what) { return dump_checked(v, 2, true, what) + "\n"; }
std::string dump_compact(const Json& v, const char* what) { return dump_checked(v, -1, false, what); }

std::string hex64(std::uint64_t v) { return fmt::format("{:#018x}", v); }

std::string to_hex(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) fmt::format_to(std::back_inserter(out), "{:02x}", c);
  return out;
}

// ---------------------------------------------------------------- located reading

void Field::fail(const std::string& problem) const {
  // Paths and problems quote the file's text, which may hold anything: escaped, it cannot
  // garble the terminal or log that shows the message.
  ZERO_THROW(fmt::format("{}: field '{}' {}{}{}", origin_, escape_bytes(path_.empty() ? "<document>" : path_),
                         escape_bytes(problem), hint_.empty() ? "" : "; ", hint_));
}

void Field::expect(bool ok, const char* what) const {
  if (!ok) fail(fmt::format("must be {}, found {}", what, v_->type_name()));
}

Field Field::at(std::string_view key) const {
  expect(v_->is_object(), "an object");
  std::string p = path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
  auto it = v_->find(std::string(key));
  if (it == v_->end()) Field(*v_, origin_, p, hint_).fail("is missing");
  return Field(*it, origin_, std::move(p), hint_);
}

bool Field::has(std::string_view key) const {
  expect(v_->is_object(), "an object");
  return v_->contains(std::string(key));
}

Field Field::operator[](std::size_t i) const {
  expect(v_->is_array(), "an array");
  std::string p = fmt::format("{}[{}]", path_, i);
  if (i >= v_->size()) Field(*v_, origin_, p, hint_).fail("is missing");
  return Field((*v_)[i], origin_, std::move(p), hint_);
}

std::size_t Field::size() const {
  expect(v_->is_array(), "an array");
  return v_->size();
}

std::vector<std::string> Field::keys() const {
  expect(v_->is_object(), "an object");
  std::vector<std::string> out;
  for (const auto& item : v_->items()) out.push_back(item.key());
  return out;
}

void Field::expect_keys(std::initializer_list<std::string_view> required,
                        std::initializer_list<std::string_view> optional) const {
  expect(v_->is_object(), "an object");
  for (auto k : required) (void)at(k);
  for (const auto& item : v_->items()) {
    bool known = false;
    for (auto r : required) known = known || r == item.key();
    for (auto o : optional) known = known || o == item.key();
    if (!known) at(item.key()).fail("is not a field of this format version");
  }
}

std::int64_t Field::i64(std::int64_t lo, std::int64_t hi) const {
  // nlohmann reads integers beyond int64 as unsigned (up to 2^64) or, larger still, as doubles.
  const bool fits = v_->is_number_integer() &&
                    !(v_->is_number_unsigned() && v_->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX));
  if (!fits) fail(fmt::format("must be an integer that fits 64 bits, found {}", v_->dump()));
  const auto x = v_->get<std::int64_t>();
  if (x < lo || x > hi) fail(fmt::format("= {} is out of range [{}, {}]", x, lo, hi));
  return x;
}

std::uint64_t Field::hex64() const {
  const std::string& t = str();
  std::uint64_t x = 0;
  const bool shaped = t.size() == 18 && t[0] == '0' && t[1] == 'x';
  auto r = std::from_chars(t.data() + (shaped ? 2 : 0), t.data() + t.size(), x, 16);
  if (!shaped || r.ec != std::errc() || r.ptr != t.data() + t.size())
    fail(fmt::format("must be \"0x\" and 16 hex digits, found \"{}\"", t));
  return x;
}

std::string Field::hex_bytes() const {
  const std::string& t = str();
  std::string out(t.size() / 2, '\0');
  bool ok = t.size() % 2 == 0;
  for (std::size_t i = 0; ok && i < out.size(); ++i) {
    unsigned v = 0;
    auto r = std::from_chars(t.data() + 2 * i, t.data() + 2 * i + 2, v, 16);
    ok = r.ec == std::errc() && r.ptr == t.data() + 2 * i + 2;
    out[i] = static_cast<char>(v);
  }
  if (!ok) fail("must be bytes as hex digits, two per byte");
  return out;
}

double Field::f64() const {
  expect(v_->is_number(), "a number");
  const auto x = v_->get<double>();
  if (!std::isfinite(x)) fail(fmt::format("must be a finite number, found {}", v_->dump()));
  return x;
}

bool Field::boolean() const {
  expect(v_->is_boolean(), "true or false");
  return v_->get<bool>();
}

const std::string& Field::str() const {
  expect(v_->is_string(), "a string");
  return v_->get_ref<const std::string&>();
}

}  // namespace zero::json
