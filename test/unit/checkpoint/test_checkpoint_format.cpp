// The checkpoint format on its own: the strict JSON reader, metadata validation, file headers,
// the safetensors header, and saves killed part way (child processes that _exit or receive
// SIGKILL mid-save; the parent, which never starts MPI, checks with the offline reader that
// `latest` still names a complete, verified checkpoint, and a second child resumes from it).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_common.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/json.hpp"
#include "holding_child.hpp"
#include "checkpoint/safetensors.hpp"
#include "test_data.hpp"

using namespace zero;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const char* tag) {
  std::string t = (fs::temp_directory_path() / (std::string("zero_") + tag + "_XXXXXX")).string();
  std::vector<char> buf(t.begin(), t.end());
  buf.push_back('\0');
  REQUIRE(::mkdtemp(buf.data()) != nullptr);
  return buf.data();
}

void require_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL("no error");
  } catch (const Error& e) {
    std::string msg = e.what();
    INFO(msg);
    for (const auto& p : parts) CHECK(msg.find(p) != std::string::npos);
  }
}

ckpt::Metadata sample_metadata() {
  ckpt::Metadata m;
  m.step = 7;
  m.applied = 6;
  m.world = 2;
  m.stage = 3;
  m.compute_dtype = DType::bf16;
  m.optimizer = "AdamW";
  m.moments = 2;
  m.scaler_dynamic = true;
  m.scaler = {32768.0, 1, 7, 3};
  m.scheduler = "WarmupLR";
  m.scheduler_step = 6;
  m.units.push_back({"embed", 38, 64, {{"embed.w", {7, 5}, 35, 0}, {"embed.b", {3}, 3, 35}}});
  m.units.push_back({"big", 201, 128, {{"big.w", {200}, 200, 0}, {"big.s", {1}, 1, 200}}});
  m.shards = {{"shard_00000.ckpt", 1000, 0x0123456789abcdefULL}, {"shard_00001.ckpt", 900, 42}};
  std::string blob;
  for (int i = 0; i < 256; ++i) blob += static_cast<char>(i);
  m.client = {{"blob", blob}, {"data.position", "1234"}};
  m.config_yaml = "zero_optimization:\n  stage: 3\n";
  return m;
}

// Replaces the first occurrence of `from` (which must exist) in `s`.
std::string replaced(std::string s, const std::string& from, const std::string& to) {
  auto at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

}  // namespace

// ---------------------------------------------------------------- JSON

TEST_CASE("json: strict parsing") {
  auto v = json::parse(R"({"a": [1, -2.5e3, true, null, "x\n\u00ff"], "b": {}})", "t");
  json::Field d(v, "t", "", "");
  CHECK(d.at("a")[0].i64() == 1);
  CHECK(d.at("a")[1].f64() == -2500.0);
  CHECK(d.at("a")[4].str() == "x\n\xc3\xbf");  // JSON strings are Unicode text, held as UTF-8
  for (const char* bad : {"[1,]", "{\"a\":1,\"a\":2}", "{\"o\":{\"k\":1,\"k\":1}}", "[1] x", "// c\n1", "NaN", "01",
                          "[1.]", "\"a\tb\"", "\"\xff\"", "\"\\ud800\"", "\"\\q\"", "{\"a\" 1}", "", "[", "tru"}) {
    INFO(bad);
    CHECK_THROWS_WITH(json::parse(bad, "doc.json"), Contains("doc.json") && Contains("malformed JSON"));
  }
  CHECK_THROWS_WITH(json::parse("{\"a\":1,\"a\":2}", "d"), Contains("duplicate member name 'a'"));
  // The same key in different objects is fine.
  CHECK(json::parse("{\"a\":{\"k\":1},\"b\":{\"k\":2}}", "d")["b"]["k"] == 2);
  std::string deep(40, '[');
  deep += std::string(40, ']');
  CHECK_THROWS_WITH(json::parse(deep, "d"), Contains("nesting"));
}

TEST_CASE("json: int64, shortest doubles and bytes round-trip exactly") {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  const std::vector<double> doubles = {0.1 + 0.2, 5e-324, 1.7976931348623157e308, -0.0, 32768.0, 1.0 / 3.0};
  json::Json o = json::Json::object();
  o["s"] = json::to_hex(all);
  o["min"] = INT64_MIN;
  o["max"] = INT64_MAX;
  o["d"] = doubles;
  std::string text = json::dump_pretty(o, "test");
  for (unsigned char c : text) CHECK((c == '\n' || (c >= 0x20 && c < 0x7f)));   // pure printable ASCII
  CHECK(text.find("\"d\": [\n    0.30000000000000004,") != std::string::npos);  // shortest text
  auto back = json::parse(text, "t");
  json::Field f(back, "t", "", "");
  CHECK(f.at("s").hex_bytes() == all);
  CHECK(f.at("min").i64() == INT64_MIN);
  CHECK(f.at("max").i64() == INT64_MAX);
  for (std::size_t i = 0; i < doubles.size(); ++i) {
    double x = f.at("d")[i].f64();
    CHECK(std::memcmp(&x, &doubles[i], sizeof x) == 0);  // bit for bit, sign of zero included
  }
  CHECK_THROWS_WITH(f.at("s").i64(), Contains("field 's'") && Contains("must be an integer"));
  CHECK_THROWS_WITH(f.at("d")[0].i64(), Contains("field 'd[0]'") && Contains("must be an integer"));
  CHECK_THROWS_WITH(f.at("nope"), Contains("field 'nope'") && Contains("missing"));
  for (const char* bad : {"{\"x\": 99999999999999999999}", "{\"x\": 9223372036854775808}"}) {
    auto big = json::parse(bad, "t");
    CHECK_THROWS_WITH(json::Field(big, "t", "", "").at("x").i64(), Contains("fits 64 bits"));
  }
  for (const char* bad : {"{\"x\": \"abc\"}", "{\"x\": \"0g\"}", "{\"x\": \"+1\"}"}) {
    auto h = json::parse(bad, "t");
    CHECK_THROWS_WITH(json::Field(h, "t", "", "").at("x").hex_bytes(), Contains("field 'x'") && Contains("hex"));
  }
}

// The checksum is XXH3-64 with seed 0: the values `xxhsum -H3` prints for the same bytes.
TEST_CASE("checksums are standard XXH3-64") {
  CHECK(ckpt::checksum("", 0) == 0x2d06800538d394c2ULL);
  CHECK(ckpt::checksum("libzero", 7) == 0xc58ef4271acbdef6ULL);
}

// ---------------------------------------------------------------- metadata

TEST_CASE("metadata: round trip and strict validation naming the field") {
  ckpt::Metadata m = sample_metadata();
  std::string text = m.to_json();
  ckpt::Metadata b = ckpt::Metadata::parse(text, "meta");
  CHECK(b.step == 7);
  CHECK(b.applied == 6);
  CHECK(b.world == 2);
  CHECK(b.stage == 3);
  CHECK(b.compute_dtype == DType::bf16);
  CHECK(b.optimizer == "AdamW");
  CHECK(b.scaler.scale == 32768.0);
  CHECK(b.scaler.last_overflow_iter == 3);
  CHECK(b.client == m.client);
  CHECK(b.config_yaml == m.config_yaml);
  REQUIRE(b.units.size() == 2);
  CHECK(b.units[1].params[1].name == "big.s");
  CHECK(b.units[1].params[1].offset == 200);
  CHECK(b.shards[0].index_checksum == 0x0123456789abcdefULL);

  using json::Json;
  struct Bad {
    std::function<void(Json&)> change;
    std::string field;
  };
  for (const Bad& c : std::vector<Bad>{
           {[](Json& d) { d["format_version"] = 1; }, "format_version"},
           {[](Json& d) { d["extra"] = 1; }, "'extra'"},
           {[](Json& d) { d["applied_steps"] = 8; }, "applied_steps"},
           {[](Json& d) { d["world_size"] = 3; }, "units[0].padded"},
           {[](Json& d) { d["shards"][1]["file"] = "../../etc/passwd"; }, "shards[1].file"},
           {[](Json& d) { d["units"][0]["params"][0]["numel"] = 36; }, "units[0].params[0].numel"},
           {[](Json& d) { d["units"][0]["params"][1]["offset"] = 34; }, "units[0].params[1].offset"},
           {[](Json& d) { d["units"][0]["params"][0]["shape"][1] = 0; }, "units[0].params[0].shape[1]"},
           {[](Json& d) { d["units"][0]["params"][0]["shape"] = "7x5"; }, "units[0].params[0].shape"},
           {[](Json& d) { d["units"][0]["slice"] = 16; }, "units[0].slice"},
           {[](Json& d) { d["compute_dtype"] = "int8"; }, "compute_dtype"},
           {[](Json& d) { d["optimizer"] = "adamw"; }, "optimizer"},
           {[](Json& d) { d["optimizer_moments"] = 1; }, "optimizer_moments"},
           {[](Json& d) { d["compute_params"]["stored"] = true; }, "compute_params.stored"},
           {[](Json& d) { d["loss_scaler"]["scale"] = -1; }, "loss_scaler.scale"},
           {[](Json& d) { d["units"][1]["name"] = "embed"; }, "units[1].name"},
           {[](Json& d) { d["units"][1]["name"] = "embed"; }, "= \"embed\" repeats"},
           {[](Json& d) { d["units"][1]["params"][0]["name"] = "big.s"; }, "units[1].params[1].name"},
           {[](Json& d) { d["format"] = "\x1b[2J"; }, "format' is not"},
           {[](Json& d) { d["shards"][0]["index_checksum"] = "0x12"; }, "shards[0].index_checksum"},
           {[](Json& d) { d["client_state"]["data.position"] = 1234; }, "client_state.data.position"},
           {[](Json& d) { d["client_state"]["data.position"] = "1234x"; }, "client_state.data.position"},
           {[](Json& d) { d["client_state"] = Json::array(); }, "client_state"},
       }) {
    Json d = json::parse(text, "t");
    c.change(d);
    INFO(d.dump());
    require_error([&] { ckpt::Metadata::parse(d.dump(), "dir/metadata.ckpt"); }, {"dir/metadata.ckpt", c.field});
  }
  // Text from the file is echoed escaped.
  {
    Json d = json::parse(text, "t");
    d["compute_dtype"] = "\x1b[2J";
    require_error([&] { ckpt::Metadata::parse(d.dump(), "m"); }, {"field 'compute_dtype' = \"\\x1b[2J\" is not"});
  }
  // A duplicate key is refused even where both copies agree.
  require_error([&] { ckpt::Metadata::parse(replaced(text, "\"step\": 7,", "\"step\": 7, \"step\": 7,"), "m"); },
                {"m", "duplicate member name 'step'"});
}

// Per-rank state (PowerSGD's, qgZ's, the 1-bit exchange's): kind and files, and the layout when
// there is one.
TEST_CASE("metadata: the per-rank state record round-trips for each kind and refuses others") {
  for (const std::string kind : {"powersgd", "qgz", "onebit"}) {
    ckpt::Metadata m = sample_metadata();
    m.rank_state_kind = kind;
    m.rank_state_layout = kind == "qgz" ? "2 nodes x 1 ranks, block 256" : kind == "onebit" ? "OneBitLamb" : "";
    for (int r = 0; r < m.world; ++r) m.rank_state.push_back({ckpt::rank_state_file_name(r), 64 + 4u * r, 0x42u + r});
    const std::string text = m.to_json();
    CHECK((text.find("\"layout\"") != std::string::npos) == (kind != "powersgd"));
    const ckpt::Metadata b = ckpt::Metadata::parse(text, "meta");
    CHECK(b.rank_state_kind == kind);
    CHECK(b.rank_state_layout == m.rank_state_layout);
    REQUIRE(b.rank_state.size() == 2);
    CHECK(b.rank_state[1].file == "rank_state_00001.ckpt");
    CHECK(b.rank_state[1].bytes == 68);
    CHECK(b.rank_state[1].index_checksum == 0x43);
    json::Json d = json::parse(text, "t");
    d["rank_state"]["kind"] = "topk";
    require_error([&] { ckpt::Metadata::parse(d.dump(), "m"); },
                  {"rank_state.kind", "is not \"powersgd\", \"qgz\" or \"onebit\""});
    d = json::parse(text, "t");
    d["rank_state"]["files"][0]["file"] = "feedback_00000.ckpt";
    require_error([&] { ckpt::Metadata::parse(d.dump(), "m"); }, {"rank_state.files[0].file"});
  }
}

// Format 1 (libzero 0.1.0, its own checksum) is refused by name, before any checksum is compared.
TEST_CASE("a checkpoint of format 1 is refused with the release that wrote it") {
  // Written by libzero 0.1.0 (one unit of 3 elements, AdamW, step 4) and kept as it was.
  const std::string root = zero::test::data_path("checkpoint_v1");
  for (const auto& fn : std::vector<std::function<void()>>{
           [&] { ckpt::Reader r(ckpt::resolve(root, "latest")); },
           [&] { ckpt::read_metadata_file(root + "/step_00000004/metadata.ckpt"); },
           [&] {
             ckpt::Fd f = ckpt::Fd::open_read(root + "/step_00000004/shard_00000.ckpt");
             ckpt::read_header(f, ckpt::FileKind::shard);
           },
       })
    require_error(fn, {"step_00000004", "format_version' = 1", "libzero 0.1.0", "reads formats 2 to 3"});
  std::ostringstream out;
  CHECK_FALSE(inspect_checkpoint(root, out));
  CHECK_THAT(out.str(), Contains("FAILED") && Contains("libzero 0.1.0"));
}

// ---------------------------------------------------------------- files

TEST_CASE("file headers: truncation, corruption and misplacement are named") {
  std::string dir = temp_dir("ckpt_hdr");
  std::string path = dir + "/metadata.ckpt";
  ckpt::write_metadata_file(path, sample_metadata());
  CHECK(ckpt::read_metadata_file(path).step == 7);
  auto size = fs::file_size(path);
  auto copy_with = [&](const std::function<void(const std::string&)>& change) {
    std::string p = dir + "/variant.ckpt";
    fs::copy_file(path, p, fs::copy_options::overwrite_existing);
    change(p);
    return p;
  };
  auto flip = [](const std::string& p, std::uint64_t at) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(at));
    c = static_cast<char>(c ^ 1);
    f.write(&c, 1);
  };
  for (std::uint64_t len : std::vector<std::uint64_t>{0, 8, 63}) {
    auto p = copy_with([&](const std::string& q) { fs::resize_file(q, len); });
    require_error([&] { ckpt::read_metadata_file(p); }, {"variant.ckpt", "'header'", "truncated"});
  }
  for (std::uint64_t len : std::vector<std::uint64_t>{64, size / 2, size - 1, size + 5}) {
    auto p = copy_with([&](const std::string& q) { fs::resize_file(q, len); });
    require_error([&] { ckpt::read_metadata_file(p); }, {"variant.ckpt", "header.payload_bytes"});
  }
  require_error([&] { ckpt::read_metadata_file(copy_with([&](const std::string& q) { flip(q, 0); })); },
                {"variant.ckpt", "header.magic"});
  require_error([&] { ckpt::read_metadata_file(copy_with([&](const std::string& q) { flip(q, 17); })); },
                {"variant.ckpt", "header.checksum"});
  for (std::uint64_t at : std::vector<std::uint64_t>{64, size / 2, size - 1})
    require_error([&] { ckpt::read_metadata_file(copy_with([&](const std::string& q) { flip(q, at); })); },
                  {"variant.ckpt", "header.index_checksum"});
  // A metadata file where a shard belongs.
  ckpt::Fd f = ckpt::Fd::open_read(path);
  require_error([&] { ckpt::read_header(f, ckpt::FileKind::shard); }, {"metadata.ckpt", "header.kind"});
  require_error([&] { ckpt::read_metadata_file(dir + "/absent.ckpt"); }, {"absent.ckpt", "cannot open"});
  fs::remove_all(dir);
}

TEST_CASE("latest pointer and tags are parsed strictly") {
  std::string dir = temp_dir("ckpt_latest");
  require_error([&] { ckpt::resolve(dir, "latest"); }, {"no 'latest' file"});
  fs::create_directory(dir + "/step_00000012");
  for (const char* bad : {"step_12\n", "../step_00000012\n", "step_00000012\n\n", "", "step_000000012x"}) {
    std::ofstream(dir + "/latest") << bad;
    INFO(bad);
    require_error([&] { ckpt::resolve(dir, "latest"); }, {"latest", "content"});
  }
  ckpt::write_file_atomic(dir, "latest", "step_00000012\n");
  CHECK(ckpt::resolve(dir, "latest") == dir + "/step_00000012");
  CHECK(ckpt::resolve(dir, "12") == dir + "/step_00000012");
  require_error([&] { ckpt::resolve(dir, "13"); }, {"step_00000013", "available: step_00000012"});
  require_error([&] { ckpt::resolve(dir, "-1"); }, {"neither"});
  CHECK(ckpt::parse_step_dir_name("step_123456789") == 123456789);
  CHECK(ckpt::parse_step_dir_name("step_0000001") == -1);
  CHECK(ckpt::parse_step_dir_name("step_000000012") == -1);  // one spelling per step
  fs::remove_all(dir);
}

namespace {

// A complete one-rank checkpoint of one 4-element unit at `step`, committed the way a save is.
void write_tiny_checkpoint(const std::string& root, std::int64_t step) {
  std::string tmp = ckpt::prepare(root, step, "test");
  ckpt::Metadata m;
  m.step = m.applied = m.scheduler_step = step;
  m.optimizer = "AdamW";
  m.scheduler = "none";
  m.units.push_back({"u", 4, 4, {{"u.w", {4}, 4, 0}}});
  ckpt::ShardWriter w(tmp + "/" + ckpt::shard_file_name(0), 0, 1, 0, 2, step, {{0, 4}});
  std::vector<float> section(12, static_cast<float>(step));
  w.add_section(section.data());
  m.shards = {w.finish()};
  ckpt::write_metadata_file(tmp + "/" + ckpt::kMetadataFile, m);
  ckpt::commit(root, tmp, step, 0, [](const char*) {});
}

}  // namespace

TEST_CASE("reshard never moves latest back: an older step into a root with newer ones is refused") {
  std::string root = temp_dir("ckpt_reshard_back");
  write_tiny_checkpoint(root, 20);
  write_tiny_checkpoint(root, 40);
  REQUIRE(ckpt::read_latest(root) == "step_00000040");
  require_error([&] { reshard_checkpoint(root, root, 2, -1, "20"); },
                {"reshard", "already holds step 40", "newer than step 20", "another directory"});
  CHECK(ckpt::read_latest(root) == "step_00000040");
  CHECK(list_checkpoints(root) == std::vector<std::int64_t>{20, 40});
  CHECK(ckpt::Reader(ckpt::resolve(root, "20")).meta().world == 1);  // the source is untouched
  // The latest step into its own root is refused as before; into a new root both work.
  require_error([&] { reshard_checkpoint(root, root, 2, -1, "latest"); }, {"already exists and is the latest"});
  std::string out = root + "/out";
  reshard_checkpoint(root, out, 2, -1, "20");
  reshard_checkpoint(root, out, 2, -1, "40");
  CHECK(ckpt::read_latest(out) == "step_00000040");
  require_error([&] { reshard_checkpoint(root, out, 3, -1, "20"); }, {"already holds step 40"});
  CHECK(ckpt::Reader(ckpt::resolve(out, "latest")).meta().world == 2);
  fs::remove_all(root);
}

TEST_CASE("inspect fails when latest names a missing step, and echoes file content escaped") {
  std::string root = temp_dir("ckpt_inspect_latest");
  write_tiny_checkpoint(root, 20);
  std::ostringstream good;
  CHECK(inspect_checkpoint(root, good));
  // The loop set no rate: inspect says the config gives it (a loop-set one: test_loop_hooks).
  CHECK_THAT(good.str(), Contains("learning rate: from the config (optimizer.params.lr; no scheduler"));
  ckpt::write_file_atomic(root, "latest", "step_00000030\n");
  std::ostringstream bad;
  CHECK_FALSE(inspect_checkpoint(root, bad));
  INFO(bad.str());
  CHECK_THAT(bad.str(), Contains("FAILED") && Contains("latest names step_00000030, which does not exist"));
  CHECK_THAT(bad.str(), Contains("step_00000020:") && Contains("all checksums ok"));  // the rest is still checked

  ckpt::write_file_atomic(root, "latest", std::string("step_\x1b[2J\x00\xff\n", 11));
  std::ostringstream esc;
  CHECK_FALSE(inspect_checkpoint(root, esc));
  INFO(esc.str());
  CHECK(esc.str().find('\x1b') == std::string::npos);
  CHECK_THAT(esc.str(), Contains("\"step_\\x1b[2J\\x00\\xff\""));
  fs::remove_all(root);
}

// ---------------------------------------------------------------- safetensors

TEST_CASE("safetensors: header layout, alignment and names") {
  std::vector<safetensors::TensorSpec> ts = {{"wte", DType::f32, {3, 2}}, {"h.0.ln_1.b\xc3\xa9", DType::bf16, {5}}};
  std::string h = safetensors::header(ts, {{"format", "pt"}});
  CHECK(h.size() % 8 == 0);
  CHECK(h.rfind("{\"__metadata__\":{\"format\":\"pt\"}", 0) == 0);
  CHECK(h.find("\"wte\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]}") != std::string::npos);
  CHECK(h.find("\"h.0.ln_1.b\xc3\xa9\":{\"dtype\":\"BF16\",\"shape\":[5],\"data_offsets\":[24,34]}") !=
        std::string::npos);
  CHECK_THROWS_WITH(safetensors::header({{"w", DType::f32, {1}}, {"w", DType::f32, {2}}}, {}), Contains("unique"));
  CHECK_THROWS_WITH(safetensors::header({{"bad\xff", DType::f32, {1}}}, {}), Contains("UTF-8"));

  std::string dir = temp_dir("st");
  {
    safetensors::Writer w(dir + "/x.safetensors", {{"a", DType::f32, {2}}}, {});
    float v[2] = {1, 2};
    CHECK_THROWS(w.write_next(v, 4));  // wrong size
    // Destroyed unfinished: nothing appears under the name, no temporary is left.
  }
  CHECK(fs::is_empty(dir));
  fs::remove_all(dir);
}

namespace {

// A safetensors file made by hand: the 8-byte length, `header` as given, `data_bytes` zero bytes.
std::string crafted_safetensors(const std::string& dir, const std::string& name, const std::string& header,
                                std::size_t data_bytes) {
  const std::string path = dir + "/" + name;
  std::ofstream f(path, std::ios::binary);
  unsigned char len[8];
  ckpt::detail::put64(len, header.size());
  f.write(reinterpret_cast<const char*>(len), 8);
  f << header << std::string(data_bytes, '\0');
  REQUIRE(f.good());
  return path;
}

safetensors::Contents read_safetensors(const std::string& path) {
  return safetensors::read_header(ckpt::Fd::open_read(path));
}

}  // namespace

// The format's own reader (the safetensors library) sorts the tensors by data_offsets and wants
// them back to back over the whole data; so does this one, naming the tensors.
TEST_CASE("safetensors: overlapping, reversed or gapped data_offsets are refused naming the tensors") {
  std::string dir = temp_dir("st_read");
  {  // What the writer writes reads back: order by offset, metadata kept.
    safetensors::Writer w(dir + "/ok.safetensors", {{"a", DType::f32, {2}}, {"b", DType::bf16, {3}}}, {{"k", "v"}});
    const float a[2] = {1, 2};
    const std::uint16_t b[3] = {1, 2, 3};
    w.write_next(a, sizeof a);
    w.write_next(b, sizeof b);
    w.finish();
    const safetensors::Contents c = read_safetensors(dir + "/ok.safetensors");
    REQUIRE(c.tensors.size() == 2);
    CHECK(c.tensors[1].name == "b");
    CHECK(c.tensors[1].dtype == "BF16");
    CHECK(c.tensors[1].shape == std::vector<std::int64_t>{3});
    CHECK(c.tensors[1].begin == 8);
    CHECK(c.tensors[1].end == 14);
    CHECK(c.data_bytes == 14);
    CHECK(c.metadata.at("k") == "v");
  }
  // Listed out of offset order but back to back: accepted (JSON keys have no order to keep).
  const auto listed = crafted_safetensors(
      dir, "listed.safetensors",
      R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
      12);
  CHECK(read_safetensors(listed).tensors[0].name == "a");

  struct Bad {
    const char* what;
    std::string header;
    std::size_t data;
    std::vector<std::string> says;
  };
  for (
      const Bad& c : std::vector<Bad>{
          {"overlap",
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           12,
           {"tensors 'a' [0, 8) and 'b' [4, 12) overlap", "bytes [4, 8) belong to both"}},
          {"the same bytes twice",
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           8,
           {"'a' [0, 8) and 'b' [0, 8) overlap"}},
          {"reversed",
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})",
           8,
           {"tensor 'a': data_offsets [8, 0] are out of order"}},
          {"gap",
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
           12,
           {"bytes [4, 8) between tensors 'a' [0, 4) and 'b' [8, 12) belong to no tensor"}},
          {"not from 0",
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           8,
           {"the first tensor 'a' [4, 8) starts at byte 4"}},
          {"trailing bytes",
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
           12,
           {"8 bytes after the last tensor 'a' [0, 4) belong to no tensor"}},
          {"past the end",
           R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
           8,
           {"'a' [0, 16) ends at byte 16, past the end of the data (8 bytes)"}},
          {"size against shape",
           R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
           8,
           {"'a' [0, 8) holds 8 bytes, but its shape [3] of F32 makes 96 bits"}},
          {"unknown dtype",
           R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})",
           1,
           {"dtype \"Q7\" is not a safetensors dtype"}},
      }) {
    INFO(c.what);
    const std::string path = crafted_safetensors(dir, "bad.safetensors", c.header, c.data);
    std::vector<std::string> says = c.says;
    says.push_back("bad.safetensors");
    says.push_back("the format's own reader refuses it too");
    require_error([&] { read_safetensors(path); }, says);
  }
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- killed saves

namespace {

using namespace zero::test;
using namespace zero::test::cktest;

// Runs fn in a child process with its own MPI (singleton) and returns its exit status; the
// parent never initialises MPI, so children can come and go.
int in_child(const std::function<int()>& fn) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 3;
    try {
      code = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

Case kill_case() {
  Case c;
  c.stage = 2;
  c.offload = "cpu";
  return c;
}

// Offline: latest names a complete checkpoint whose every file verifies; returns its client state.
ClientState verified_latest(const std::string& root) {
  ckpt::Reader r(ckpt::resolve(root, "latest"));
  for (int k = 0; k < r.meta().world; ++k) r.verify_shard(k);
  return r.meta().client;
}

}  // namespace

TEST_CASE("a save killed at each point leaves latest loadable; the next run resumes and saves") {
  for (const char* point : {"mid_shard", "after_shard", "before_rename", "after_rename", "after_latest"}) {
    SECTION(point) {
      std::string root = temp_dir("ckpt_kill");
      const bool committed = std::string(point) == "after_latest";
      int code = in_child([&] {
        Context cx;
        Case c = kill_case();
        Engine e(cx, make_config(c, 1), make_ckpt_layout());
        e.init_params(init_value);
        for (int s = 0; s < 3; ++s) train_step(e, c);
        save_checkpoint(e, root, {{"at", "3"}});
        for (int s = 0; s < 2; ++s) train_step(e, c);
        ::setenv("ZERO_CKPT_FAIL_AT", (std::string(point) + ":exit").c_str(), 1);
        save_checkpoint(e, root, {{"at", "5"}});
        return 1;  // not reached
      });
      REQUIRE(code == 86);
      CHECK(verified_latest(root).at("at") == (committed ? "5" : "3"));
      bool leftover = false;
      for (const auto& ent : fs::directory_iterator(root))
        leftover = leftover || ent.path().filename().string().rfind(".tmp_step_", 0) == 0;
      CHECK(leftover == (std::string(point) == "mid_shard" || std::string(point) == "after_shard" ||
                         std::string(point) == "before_rename"));

      // A new run resumes from latest, reaches step 6 and saves: leftovers go, latest moves.
      code = in_child([&] {
        Context cx;
        Case c = kill_case();
        Engine e(cx, make_config(c, 1), make_ckpt_layout());
        ClientState cs = load_checkpoint(e, root);
        if (e.global_step() != (committed ? 5 : 3)) return 4;
        while (e.global_step() < 6) train_step(e, c);
        save_checkpoint(e, root, {{"at", "6"}});
        return 0;
      });
      REQUIRE(code == 0);
      CHECK(verified_latest(root).at("at") == "6");
      for (const auto& ent : fs::directory_iterator(root)) CHECK(ent.path().filename().string()[0] != '.');
      fs::remove_all(root);
    }
  }
}

TEST_CASE("SIGKILL at arbitrary moments during repeated saves never breaks latest") {
  std::string root = temp_dir("ckpt_sigkill");
  // The child saves after every step (keep_last 2, so pruning runs too) and reports each
  // completed save on a pipe; the parent kills it at varying delays after a report.
  for (int round = 0; round < 6; ++round) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    std::fflush(nullptr);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      try {
        Context cx;
        Case c = kill_case();
        Engine e(cx, make_config(c, 1), make_ckpt_layout());
        bool resumed = fs::exists(root + "/latest");
        if (resumed)
          load_checkpoint(e, root);
        else
          e.init_params(init_value);
        CheckpointOptions o;
        o.keep_last = 2;
        for (;;) {
          train_step(e, c);
          save_checkpoint(e, root, {{"at", std::to_string(e.global_step())}}, o);
          char b = 1;
          if (::write(fds[1], &b, 1) != 1) break;
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child: %s\n", e.what());
      }
      ::_exit(3);
    }
    ::close(fds[1]);
    char b = 0;
    REQUIRE(::read(fds[0], &b, 1) == 1);  // one save completed
    std::this_thread::sleep_for(std::chrono::microseconds(700 * round));
    ::kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    ::close(fds[0]);
    CHECK(WIFSIGNALED(status));
    ClientState cs = verified_latest(root);
    INFO("round " << round << ": latest at step " << cs.at("at"));
    CHECK(std::stoi(cs.at("at")) >= round + 1);
  }
  // inspect verifies every file: a flipped data byte is reported with the file's name.
  std::ostringstream good;
  CHECK(inspect_checkpoint(root, good));
  CHECK_THAT(good.str(), Contains("all checksums ok") && !Contains("FAILED"));
  std::string shard = ckpt::resolve(root, "latest") + "/shard_00000.ckpt";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    auto at = static_cast<std::streamoff>(fs::file_size(shard) - 5);
    f.seekg(at);
    char c = static_cast<char>(f.get() ^ 0x10);
    f.seekp(at);
    f.put(c);
  }
  std::ostringstream bad;
  CHECK_FALSE(inspect_checkpoint(root, bad));
  CHECK_THAT(bad.str(), Contains("shard_00000.ckpt  ") && Contains("FAILED") && Contains("checksum"));
  fs::remove_all(root);
}

// ---------------------------------------------------------------- two jobs, one root

TEST_CASE("a second job on a checkpoint root is refused, naming the holder's host and pid") {
  std::string root = temp_dir("ckpt_lock");
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  const std::string lock_file = root + "/" + ckpt::kLockFile;
  std::int64_t step = 0;
  {
    // The first job saves (which takes the root) and keeps training.
    zero::test::HoldingChild first([&] {
      Context cx;
      Case c = kill_case();
      Engine e(cx, make_config(c, 1), make_ckpt_layout());
      e.init_params(init_value);
      for (int s = 0; s < 2; ++s) train_step(e, c);
      save_checkpoint(e, root, {{"at", "2"}});
    });
    const std::string holder = std::string("host ") + host + " pid " + std::to_string(first.pid());
    // A second job's save (prepare is its first step on rank 0) and its resume (load locks the
    // root shared, as load_checkpoint does on rank 0) are both refused.
    for (bool save : {true, false}) {
      INFO((save ? "save" : "resume"));
      try {
        if (save)
          (void)ckpt::prepare(root, 5, "save_checkpoint");
        else
          ckpt::lock_root(root, false);
        FAIL("a second job took a checkpoint root another process holds");
      } catch (const Error& e) {
        const std::string msg = e.what();
        INFO(msg);
        CHECK_THAT(msg, Contains(lock_file) && Contains("in use by another job") && Contains(holder));
      }
    }
    // Nothing of the first job's was touched: no temporary of step 5, latest still its save.
    CHECK_FALSE(fs::exists(root + "/.tmp_step_00000005"));
    CHECK(verified_latest(root).at("at") == "2");
    step = ckpt::parse_step_dir_name(ckpt::read_latest(root));
  }  // the first job is killed: the kernel releases its lock
  CHECK(step == 2);
  ckpt::lock_root(root, false);                                 // resume
  std::string tmp = ckpt::prepare(root, 3, "save_checkpoint");  // and save: shared becomes exclusive
  CHECK(fs::is_directory(tmp));
  fs::remove_all(root);
}

TEST_CASE("jobs that only read a checkpoint root share it; a writer is refused while they read") {
  std::string root = temp_dir("ckpt_share");
  const std::string step_dir = root + "/" + ckpt::step_dir_name(4);
  fs::create_directories(step_dir);
  std::ofstream(step_dir + "/" + ckpt::kMetadataFile) << "{}";
  // Two reading jobs (forked before this process locks anything, so they share nothing of it):
  // the second one's setup fails if readers exclude each other. A step directory locks its root.
  zero::test::HoldingChild reader1([&] { ckpt::lock_root(root, false); });
  zero::test::HoldingChild reader2([&] { ckpt::lock_root(step_dir, false); });
  try {
    (void)ckpt::prepare(root, 5, "save_checkpoint");
    FAIL("a writer took a root that other jobs read");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Contains("pid " + std::to_string(reader2.pid())));
  }
  reader1.kill();
  reader2.kill();
  CHECK(fs::is_directory(ckpt::prepare(root, 5, "save_checkpoint")));
  fs::remove_all(root);
}

TEST_CASE("lock_checkpoint_root takes a root at a job's start, before its first save") {
  std::string root = temp_dir("ckpt_lock_start") + "/run/checkpoints";  // created by the call
  zero::test::HoldingChild first([&] {
    Context cx;
    Engine e(cx, make_config(kill_case(), 1), make_ckpt_layout());
    lock_checkpoint_root(e, root);
  });
  CHECK(fs::is_directory(root));
  CHECK_THROWS_WITH(ckpt::lock_root(root, false), Contains("pid " + std::to_string(first.pid())));
  first.kill();
  ckpt::lock_root(root, false);
  fs::remove_all(fs::path(root).parent_path().parent_path());
}

// A Layout needs parameter names unique within a unit only (llm.c-style loops name every block's
// weights "w" and "b"): the export then qualifies every name with its unit, and the values land
// under those names.
TEST_CASE("export to safetensors qualifies names that repeat across units") {
  const std::string root = temp_dir("st_unit_names");
  Layout l;
  l.add_unit("h0", {{"w", {3, 4}}, {"b", {4}}});
  l.add_unit("h1", {{"w", {4, 2}}, {"b", {2}}});
  Context cx;
  Engine e(cx, make_config(Case{}, 1), l);
  e.init_params(init_value);
  save_checkpoint(e, root + "/ckpt");
  const std::string file = root + "/model.safetensors";
  export_safetensors(root + "/ckpt", file, DType::f32, "latest");
  const safetensors::Contents c = read_safetensors(file);
  std::vector<std::string> names;
  for (const auto& t : c.tensors) names.push_back(t.name);
  CHECK(names == std::vector<std::string>{"h0.w", "h0.b", "h1.w", "h1.b"});
  CHECK(c.metadata.at("libzero.names") == "unit-qualified");
  // h1.w's values, read from the file, are the engine's.
  const std::vector<float> h1 = e.full_master(1);
  std::ifstream in(file, std::ios::binary);
  const auto& w = c.tensors[2];
  std::vector<float> got(8);
  in.seekg(static_cast<std::streamoff>(c.data_start + w.begin));
  in.read(reinterpret_cast<char*>(got.data()), 8 * sizeof(float));
  CHECK(std::equal(got.begin(), got.end(), h1.begin()));
  fs::remove_all(root);
}
