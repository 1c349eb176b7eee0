// The whole model of a checkpoint saved on a tensor x pipeline grid, put back together by the
// export tools' reader (for_each_checkpoint_tensor, ckpt::ModelReader), on a hand-made
// checkpoint with known values: TP 2 x PP 2, each position saved by 2 data-parallel ranks.
// Every whole tensor holds base + its flat index; each position's part is cut out of it by
// columns or rows written out literally here (not by the code under test), so a wrong
// concatenation order, block interleave or source shows as a wrong value. A tiny GPT-2 split as
// Megatron splits it (TP 2 x PP 2, tied embedding in both end parts) exports to Hugging Face
// files byte for byte equal to the unsplit model's.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "checkpoint/json.hpp"
#include "runtime/part_cut.hpp"
#include "zero/checkpoint.hpp"
#include "zero/dtype.hpp"
#include "zero/formats/hf.hpp"
#include "zero/plan/plan.hpp"
#include "zero/error.hpp"

using namespace zero;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string temp_dir() {
  std::string t = (fs::temp_directory_path() / "zero_grid_model_XXXXXX").string();
  std::vector<char> buf(t.begin(), t.end());
  buf.push_back('\0');
  REQUIRE(::mkdtemp(buf.data()) != nullptr);
  return buf.data();
}

// A whole 2-D tensor [rows, cols] holding base + flat index, and a part of it: the rows and
// columns listed, in that order.
struct Part {
  std::string name;
  std::vector<std::int64_t> rows, cols;
  float base;
  bool replicated = false;
  int axis = -1, blocks = 1;
};
std::vector<std::int64_t> range(std::int64_t b, std::int64_t e) {
  std::vector<std::int64_t> v;
  for (auto i = b; i < e; ++i) v.push_back(i);
  return v;
}

// Whole shapes: wte [4, 3] (vocabulary rows split), wpe [2, 3] replicated, qkv [2, 12] (3 blocks
// of 4 columns, each split), proj [4, 2] (rows split), ln [1, 3] replicated, head [3, 4]
// (columns split), lnf [1, 2] replicated.
float value(float base, std::int64_t r, std::int64_t c, int whole_cols) {
  return base + static_cast<float>(r * whole_cols + c);
}

struct UnitParts {
  std::string unit;
  std::vector<Part> parts;
};

// Position (t, p)'s units.
std::vector<UnitParts> position(int t, int p) {
  // qkv: rank 0 holds [q0 | k0 | v0] = whole columns 0,1 | 4,5 | 8,9; rank 1 the others.
  const std::vector<std::int64_t> qkv =
      t == 0 ? std::vector<std::int64_t>{0, 1, 4, 5, 8, 9} : std::vector<std::int64_t>{2, 3, 6, 7, 10, 11};
  // A replicated copy on tensor rank 1 differs, to show that rank 0's is the one taken.
  const float rep = t == 0 ? 0.0f : 0.5f;
  if (p == 0)
    return {{"embed",
             {{"wte", range(2 * t, 2 * t + 2), range(0, 3), 100, false, 0},
              {"wpe", range(0, 2), range(0, 3), 200 + rep, true}}},
            {"h.0",
             {{"qkv", range(0, 2), qkv, 300, false, 1, 3},
              {"proj", range(2 * t, 2 * t + 2), range(0, 2), 400, false, 0},
              {"ln", range(0, 1), range(0, 3), 500 + rep, true}}}};
  // The last pipeline part: a block, the head, and the tied embedding again (other values: the first
  // part's copy is the one taken) with a parameter of its own.
  return {{"h.1", {{"head", range(0, 3), range(2 * t, 2 * t + 2), 600, false, 1}}},
          {"embed",
           {{"wte", range(2 * t, 2 * t + 2), range(0, 3), 9100, false, 0},
            {"lnf", range(0, 1), range(0, 2), 700 + rep, true}}}};
}
int whole_cols(const std::string& name) {
  const std::map<std::string, int> cols = {{"wte", 3}, {"wpe", 3},  {"qkv", 12}, {"proj", 2},
                                           {"ln", 3},  {"head", 4}, {"lnf", 2}};
  return cols.at(name);
}

// A unit of one position as the test writes it: each parameter's metadata and its part's values.
struct TestParam {
  ckpt::ParamMeta meta;  // name, shape (the part's), split; numel and offset filled in
  std::vector<float> values;
};
struct TestUnit {
  std::string name;
  std::vector<TestParam> params;
};

// Writes a checkpoint of step 7 saved on a T x P grid (no grid when 1 x 1), each position's
// units (positions[t + T x p]) flat and cut into D data-parallel shards, moments -1.
void write_checkpoint(const std::string& root, int T, int P, int D,
                      const std::vector<std::vector<TestUnit>>& positions) {
  const std::int64_t step = 7;
  std::string tmp = ckpt::prepare(root, step, "test");
  ckpt::Metadata m;
  m.step = m.applied = m.scheduler_step = step;
  m.world = D;
  m.stage = 1;
  m.optimizer = "AdamW";
  m.scheduler = "none";
  m.grid = {T, P};
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < T; ++t) {
      ckpt::PositionMeta pos{t, p, {}, {}};
      std::vector<std::vector<float>> flat;
      for (const auto& u : positions[static_cast<std::size_t>(t + T * p)]) {
        ckpt::UnitMeta um{u.name, 0, 0, {}};
        std::vector<float> values;
        for (const auto& tp : u.params) {
          ckpt::ParamMeta pm = tp.meta;
          pm.numel = static_cast<std::int64_t>(tp.values.size());
          pm.offset = um.numel;
          values.insert(values.end(), tp.values.begin(), tp.values.end());
          um.numel += pm.numel;
          um.params.push_back(pm);
        }
        um.slice = (um.numel + D - 1) / D;
        pos.units.push_back(um);
        flat.push_back(values);
      }
      for (int d = 0; d < D; ++d) {
        std::vector<ckpt::ShardWriter::Range> ranges;
        for (const auto& u : pos.units) {
          const std::int64_t b = std::min<std::int64_t>(d * u.slice, u.numel);
          ranges.push_back({b, std::min(b + u.slice, u.numel) - b});
        }
        const std::string file = m.grid.split() ? ckpt::shard_file_name(d, t, p) : ckpt::shard_file_name(d);
        ckpt::ShardWriter w(tmp + "/" + file, d, D, 1, 2, step, ranges, t, p);
        for (std::size_t u = 0; u < pos.units.size(); ++u) {
          std::vector<float> section;
          const auto& r = ranges[u];
          for (int k = 0; k < 3; ++k)
            for (std::int64_t i = r.begin; i < r.begin + r.len; ++i)
              section.push_back(k == 0 ? flat[u][static_cast<std::size_t>(i)] : -1.0f);
          w.add_section(section.data());
        }
        pos.shards.push_back(w.finish());
      }
      if (m.grid.split()) {
        m.positions.push_back(std::move(pos));
      } else {
        m.units = std::move(pos.units);
        m.shards = std::move(pos.shards);
      }
    }
  ckpt::write_metadata_file(tmp + "/" + ckpt::kMetadataFile, m);
  ckpt::commit(root, tmp, step, 0, [](const char*) {});
}

// The hand-made TP 2 x PP 2 model above, each position saved by 2 data-parallel ranks.
void write_grid_checkpoint(const std::string& root, bool leave_one_unmarked = false) {
  std::vector<std::vector<TestUnit>> positions;
  for (int p = 0; p < 2; ++p)
    for (int t = 0; t < 2; ++t) {
      positions.emplace_back();
      for (const auto& u : position(t, p)) {
        TestUnit tu{u.unit, {}};
        for (const auto& part : u.parts) {
          TestParam tp;
          tp.meta.name = part.name;
          tp.meta.shape = {static_cast<std::int64_t>(part.rows.size()), static_cast<std::int64_t>(part.cols.size())};
          tp.meta.replicated = part.replicated;
          tp.meta.split_axis = leave_one_unmarked && part.name == "proj" ? -1 : part.axis;
          tp.meta.split_blocks = part.blocks;
          for (auto r : part.rows)
            for (auto c : part.cols) tp.values.push_back(value(part.base, r, c, whole_cols(part.name)));
          tu.params.push_back(std::move(tp));
        }
        positions.back().push_back(std::move(tu));
      }
    }
  write_checkpoint(root, 2, 2, 2, positions);
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("a TP 2 x PP 2 checkpoint reads back as the whole model") {
  const std::string root = temp_dir();
  write_grid_checkpoint(root);
  struct Got {
    std::string unit;
    std::vector<std::int64_t> shape;
    std::vector<float> values;
  };
  std::map<std::string, Got> got;
  std::vector<std::string> order;
  for_each_checkpoint_tensor(root, "latest", [&](const CheckpointTensor& t, std::span<const float> v) {
    order.push_back(t.unit + "." + t.name);
    got[t.name] = {t.unit, t.shape, {v.begin(), v.end()}};
  });
  // Pipeline part order; the tied embedding is one unit, its lnf (only in the last part) appended.
  CHECK(order ==
        std::vector<std::string>{"embed.wte", "embed.wpe", "embed.lnf", "h.0.qkv", "h.0.proj", "h.0.ln", "h.1.head"});
  const std::map<std::string, std::pair<std::vector<std::int64_t>, float>> want = {
      {"wte", {{4, 3}, 100}}, {"wpe", {{2, 3}, 200}},  {"qkv", {{2, 12}, 300}}, {"proj", {{4, 2}, 400}},
      {"ln", {{1, 3}, 500}},  {"head", {{3, 4}, 600}}, {"lnf", {{1, 2}, 700}}};
  for (const auto& [name, w] : want) {
    INFO(name);
    const Got& g = got.at(name);
    REQUIRE(g.shape == w.first);
    const auto n = static_cast<std::size_t>(w.first[0] * w.first[1]);
    REQUIRE(g.values.size() == n);
    // The whole tensor holds base + flat index: every part back in its place, rank 0's copy of
    // the replicated ones, the first part's copy of the tied embedding.
    for (std::size_t i = 0; i < n; ++i) REQUIRE(g.values[i] == w.second + static_cast<float>(i));
  }

  // inspect: the grid, and per position its units and bytes, all verified.
  std::ostringstream listing;
  REQUIRE(inspect_checkpoint(root, listing));
  CHECK_THAT(listing.str(), Contains("grid TP 2 x PP 2 x DP 2 (4 positions, 8 ranks)") &&
                                Contains("position tensor 1, pipeline 1: 2 units") &&
                                Contains("qkv [2, 6] fp32 offset 0  split axis 1 blocks 3") &&
                                Contains("shard_t01_p01_00001.ckpt") && Contains("all checksums ok") &&
                                Contains("whole model (the grid's parts put together): 3 units, 67 parameters"));

  // The data-parallel size of each position can be changed offline; the whole model stays.
  reshard_checkpoint(root, root + "/dp3", 3);
  std::vector<float> again, before;
  for_each_checkpoint_tensor(root + "/dp3", "latest", [&](const CheckpointTensor&, std::span<const float> v) {
    again.insert(again.end(), v.begin(), v.end());
  });
  for_each_checkpoint_tensor(root, "latest", [&](const CheckpointTensor&, std::span<const float> v) {
    before.insert(before.end(), v.begin(), v.end());
  });
  CHECK(again == before);
  CHECK(ckpt::Reader(ckpt::resolve(root + "/dp3", "latest"), 1, 1).meta().world == 3);
  fs::remove_all(root);
}

TEST_CASE("grid metadata: written and read back, and read strictly") {
  const std::string root = temp_dir();
  write_grid_checkpoint(root);
  const std::string file = ckpt::resolve(root, "latest") + "/" + ckpt::kMetadataFile;
  const ckpt::Metadata m = ckpt::read_metadata_file(file);
  REQUIRE(m.grid.tensor == 2);
  REQUIRE(m.grid.pipeline == 2);
  REQUIRE(m.positions.size() == 4);
  REQUIRE(m.units.empty());
  const ckpt::PositionMeta& p = m.position(1, 0);
  REQUIRE(p.units[1].name == "h.0");
  CHECK(p.units[1].params[0].split_axis == 1);
  CHECK(p.units[1].params[0].split_blocks == 3);
  CHECK(p.units[1].params[2].replicated);
  CHECK(p.shards[1].file == "shard_t01_p00_00001.ckpt");
  CHECK(ckpt::Metadata::parse(m.to_json(), "again").to_json() == m.to_json());
  CHECK_THROWS_WITH(m.position(2, 0), Contains("outside its grid TP 2 x PP 2"));

  // Each change is refused with the field it concerns.
  auto refused = [&](const std::function<void(json::Json&)>& edit, const std::string& says) {
    json::Json doc = json::parse(m.to_json(), "test");
    edit(doc);
    CHECK_THROWS_WITH(ckpt::Metadata::parse(doc.dump(), "edited"), Contains(says));
  };
  refused([](json::Json& d) { d["grid"]["positions"].erase(3); }, "lists 3 positions for the grid TP 2 x PP 2");
  refused([](json::Json& d) { d["grid"]["positions"][1]["shards"][0]["file"] = "shard_00000.ckpt"; },
          "expected \"shard_t01_p00_00000.ckpt\"");
  refused([](json::Json& d) { d["grid"]["positions"][0]["tensor"] = 1; }, "grid.positions[0].tensor");
  refused([](json::Json& d) { d["grid"]["positions"][0]["units"][1]["params"][0]["split"]["blocks"] = 4; },
          "does not divide");
  refused([](json::Json& d) { d["grid"]["tensor"] = 1, d["grid"]["pipeline"] = 1; }, "is 1 x 1");
  refused([](json::Json& d) { d["units"] = d["grid"]["positions"][0]["units"]; }, "has both a grid and top-level");
  fs::remove_all(root);
}

namespace {

// The metadata of `step_dir` as JSON, and written back re-signed (a header over the new bytes):
// what a buggy tool or a hand edit leaves, every checksum passing.
json::Json read_metadata_json(const std::string& step_dir) {
  const std::string path = step_dir + "/" + ckpt::kMetadataFile;
  ckpt::Fd f = ckpt::Fd::open_read(path);
  return json::parse(ckpt::read_index(f, ckpt::read_header(f, ckpt::FileKind::metadata)), path);
}
void write_metadata_json(const std::string& step_dir, const json::Json& doc) {
  const std::string path = step_dir + "/" + ckpt::kMetadataFile;
  fs::remove(path);
  ckpt::write_small_file(path, ckpt::FileKind::metadata, json::dump_pretty(doc, "test metadata"));
}
void edit_metadata(const std::string& step_dir, const std::function<void(json::Json&)>& edit) {
  json::Json doc = read_metadata_json(step_dir);
  edit(doc);
  write_metadata_json(step_dir, doc);
}

// Every shard record of the metadata rewritten from the file now under its name (size, index
// checksum): what a tool that rebuilds the metadata from the files it finds writes.
void resign_shard_records(const std::string& step_dir) {
  edit_metadata(step_dir, [&](json::Json& d) {
    for (auto& pos : d["grid"]["positions"])
      for (auto& s : pos["shards"]) {
        ckpt::Fd f = ckpt::Fd::open_read(step_dir + "/" + s["file"].get<std::string>());
        const ckpt::FileHeader h = ckpt::read_header(f, ckpt::FileKind::shard);
        s["bytes"] = ckpt::kHeaderBytes + h.payload_bytes;
        s["index_checksum"] = json::hex64(h.index_checksum);
      }
  });
}

void swap_files(const std::string& dir, const std::string& a, const std::string& b) {
  fs::rename(dir + "/" + a, dir + "/swap.tmp");
  fs::rename(dir + "/" + b, dir + "/" + a);
  fs::rename(dir + "/swap.tmp", dir + "/" + b);
}

// Rewrites every file of `step_dir` as format 2 wrote it: header version 2 and, in a shard's
// index, the word that format 3 fills with the grid position left zero (index and header
// checksums, and the metadata's record of them, follow). Nothing else differs between them.
void downgrade_to_format_2(const std::string& step_dir) {
  auto resign = [](unsigned char* head, std::uint32_t version) {
    ckpt::detail::put32(head + 8, version);
    ckpt::detail::put64(head + 56, ckpt::checksum(head, 56));
  };
  std::map<std::string, std::uint64_t> sums;
  for (const auto& e : fs::directory_iterator(step_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("shard_", 0) != 0) continue;
    std::string bytes = file_bytes(e.path().string());
    auto* b = reinterpret_cast<unsigned char*>(bytes.data());
    const std::uint64_t index_bytes = ckpt::detail::get64(b + 24);
    ckpt::detail::put32(b + ckpt::kHeaderBytes + 20, 0);
    const std::uint64_t sum = ckpt::checksum(b + ckpt::kHeaderBytes, static_cast<std::size_t>(index_bytes));
    ckpt::detail::put64(b + 32, sum);
    resign(b, 2);
    sums[name] = sum;
    std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << bytes;
  }
  json::Json doc = read_metadata_json(step_dir);
  doc["format_version"] = 2;
  auto records = [&](json::Json& shards) {
    for (auto& s : shards) s["index_checksum"] = json::hex64(sums.at(s["file"].get<std::string>()));
  };
  if (doc.contains("grid"))
    for (auto& pos : doc["grid"]["positions"]) records(pos["shards"]);
  else
    records(doc["shards"]);
  const std::string text = json::dump_pretty(doc, "test metadata");
  ckpt::FileHeader h;
  h.kind = ckpt::FileKind::metadata;
  h.payload_bytes = h.index_bytes = text.size();
  h.index_checksum = ckpt::checksum(text.data(), text.size());
  unsigned char head[ckpt::kHeaderBytes];
  ckpt::encode_header(h, head);
  resign(head, 2);
  std::ofstream out(step_dir + "/" + ckpt::kMetadataFile, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(head), sizeof head);
  out << text;
}

std::vector<float> whole_values(const std::string& root) {
  std::vector<float> all;
  for_each_checkpoint_tensor(root, "latest", [&](const CheckpointTensor&, std::span<const float> v) {
    all.insert(all.end(), v.begin(), v.end());
  });
  return all;
}

}  // namespace

// Six ways the positions of a grid can disagree (position (tensor 1, pipeline 0) against tensor
// rank 0 of its pipeline part). The export tools and a resume always refused them; inspect said "all
// checksums ok". Now one check (ckpt::position_disagreements, run by Metadata::parse) refuses
// them for all: inspect, export, reshard and the reader a resume opens, each disagreement named.
TEST_CASE("inspect, export and resume refuse a grid whose positions disagree, naming each disagreement") {
  struct Case {
    const char* what;
    std::function<void(json::Json&)> edit;  // of grid.positions[1], position (tensor 1, pipeline 0)
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"a unit less",
       [](json::Json& p) { p["units"].erase(1); },
       {"field 'grid.positions[1].units' lists 1 units, position (tensor 0, pipeline 0) lists 2"}},
      {"a unit renamed",
       [](json::Json& p) { p["units"][1]["name"] = "h.9"; },
       {"grid.positions[1].units[1].name' = \"h.9\", position (tensor 0, pipeline 0) has \"h.0\""}},
      {"a parameter less",
       [](json::Json& p) {
         json::Json& u = p["units"][1];
         u["params"].erase(2);  // ln [1, 3]
         u["numel"] = 16;
         u["padding"] = 4;
       },
       {"grid.positions[1].units[1].params' lists 2 parameters for unit 'h.0', position (tensor 0, pipeline 0) "
        "lists 3"}},
      {"a parameter renamed",
       [](json::Json& p) { p["units"][1]["params"][1]["name"] = "proj2"; },
       {"grid.positions[1].units[1].params[1].name' = \"proj2\" (unit 'h.0'), position (tensor 0, pipeline 0) has "
        "\"proj\""}},
      {"another shape",
       [](json::Json& p) {
         p["units"][1]["params"][1]["shape"] = {4, 1};
       },
       {"grid.positions[1].units[1].params[1].shape' = [4, 1] for 'proj' of unit 'h.0', position (tensor 0, "
        "pipeline 0) has [2, 2]"}},
      {"another split",
       [](json::Json& p) { p["units"][1]["params"][0]["split"]["blocks"] = 1; },
       {"grid.positions[1].units[1].params[0]' 'qkv' of unit 'h.0' is split along axis 1, position (tensor 0, "
        "pipeline 0) has it split along axis 1 in 3 blocks"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string root = temp_dir();
    write_grid_checkpoint(root);
    const std::string step = ckpt::resolve(root, "latest");
    edit_metadata(step, [&](json::Json& d) { c.edit(d["grid"]["positions"][1]); });
    std::vector<std::string> says = c.says;
    says.push_back("the positions of the grid TP 2 x PP 2 disagree (1 problem)");
    says.push_back(step + "/metadata.ckpt");

    std::ostringstream listing;
    CHECK_FALSE(inspect_checkpoint(root, listing));
    INFO(listing.str());
    for (const auto& s : says) CHECK_THAT(listing.str(), Contains(s));
    CHECK_THAT(listing.str(), Contains("FAILED") && !Contains("all checksums ok"));
    // The export tools, reshard, and what load_checkpoint reads at every position.
    auto refused = [&](const std::function<void()>& fn) {
      try {
        fn();
        FAIL("accepted");
      } catch (const Error& e) {
        for (const auto& s : says) CHECK_THAT(std::string(e.what()), Contains(s));
      }
    };
    refused(
        [&] { for_each_checkpoint_tensor(root, "latest", [](const CheckpointTensor&, std::span<const float>) {}); });
    refused([&] { export_safetensors(root, root + "/x.safetensors", DType::f32, "latest"); });
    refused([&] { reshard_checkpoint(root, root + "/dp3", 3); });
    for (int p = 0; p < 2; ++p)
      for (int t = 0; t < 2; ++t) refused([&] { ckpt::Reader(step, t, p); });
    fs::remove_all(root);
  }

  // Several at once: each on its own line, none hiding another.
  const std::string root = temp_dir();
  write_grid_checkpoint(root);
  const std::string step = ckpt::resolve(root, "latest");
  edit_metadata(step, [&](json::Json& d) {
    d["grid"]["positions"][1]["units"][0]["name"] = "embed2";
    d["grid"]["positions"][1]["units"][1]["params"][1]["shape"] = {4, 1};
    d["grid"]["positions"][3]["units"][0]["params"][0]["replicated"] = true;
    d["grid"]["positions"][3]["units"][0]["params"][0].erase("split");
  });
  std::ostringstream listing;
  CHECK_FALSE(inspect_checkpoint(root, listing));
  INFO(listing.str());
  CHECK_THAT(
      listing.str(),
      Contains("disagree (3 problems)") &&
          Contains("\n    position (tensor 1, pipeline 0): field 'grid.positions[1].units[0].name'") &&
          Contains("\n    position (tensor 1, pipeline 0): field 'grid.positions[1].units[1].params[1].shape'") &&
          Contains("\n    position (tensor 1, pipeline 1): field 'grid.positions[3].units[0].params[0]' 'head' of "
                   "unit 'h.1' is replicated, position (tensor 0, pipeline 1) has it split along axis 1"));

  // The one function the readers share, on its own: nothing to say of a consistent grid.
  write_grid_checkpoint(root + "/good");
  CHECK(ckpt::position_disagreements(
            ckpt::read_metadata_file(ckpt::resolve(root + "/good", "latest") + "/" + ckpt::kMetadataFile))
            .empty());
  // A save never writes such a checkpoint (write_metadata_file runs the same check).
  ckpt::Metadata m = ckpt::read_metadata_file(ckpt::resolve(root + "/good", "latest") + "/" + ckpt::kMetadataFile);
  m.positions[1].units[1].params[1].shape = {4, 1};
  REQUIRE(ckpt::position_disagreements(m).size() == 1);
  CHECK_THROWS_WITH(ckpt::write_metadata_file(root + "/m.ckpt", m),
                    Contains("the tensor ranks of a pipeline part hold different units or parameters (1 problem)") &&
                        Contains("grid.positions[1].units[1].params[1].shape' = [4, 1]"));
  CHECK_FALSE(fs::exists(root + "/m.ckpt"));
  fs::remove_all(root);
}

// Each shard records the grid position it was written for: a shard found in another place (two
// positions' files swapped, and the metadata's records rewritten to match by a tool, so that every
// size and checksum agrees) is refused with the file, the position it records and the one it lies in.
TEST_CASE("a shard in another position's place is refused, naming the file and both positions") {
  const std::string root = temp_dir();
  write_grid_checkpoint(root);
  const std::string step = ckpt::resolve(root, "latest");
  const std::vector<float> before = whole_values(root);
  {
    ckpt::Reader r(step, 1, 0);  // recorded where it lies: every shard opens
    CHECK(r.meta().format_version == ckpt::kFormatVersion);
  }

  // Tensor ranks 0 and 1 of pipeline part 0 (the same units and part shapes: before, this loaded the
  // other rank's part silently).
  swap_files(step, "shard_t00_p00_00000.ckpt", "shard_t01_p00_00000.ckpt");
  resign_shard_records(step);
  const std::string said_00 =
      step +
      "/shard_t00_p00_00000.ckpt': field 'index.position' records position (tensor 1, pipeline 0), "
      "data-parallel rank 0, but the file was found in the place of position (tensor 0, pipeline 0), rank 0";
  const std::string said_10 =
      step +
      "/shard_t01_p00_00000.ckpt': field 'index.position' records position (tensor 0, pipeline 0), "
      "data-parallel rank 0, but the file was found in the place of position (tensor 1, pipeline 0), rank 0";
  CHECK_THROWS_WITH(ckpt::Reader(step, 0, 0), Contains(said_00) &&
                                                  Contains("(it was written as shard_t01_p00_00000.ckpt)") &&
                                                  Contains("moved or swapped"));
  CHECK_THROWS_WITH(ckpt::Reader(step, 1, 0), Contains(said_10));
  CHECK_THROWS_WITH(whole_values(root), Contains(said_00));
  CHECK_THROWS_WITH(reshard_checkpoint(root, root + "/dp3", 3), Contains(said_00));
  std::ostringstream listing;
  CHECK_FALSE(inspect_checkpoint(root, listing));
  INFO(listing.str());
  CHECK_THAT(listing.str(), Contains(said_00) && Contains(said_10) && Contains("VERIFICATION FAILED") &&
                                Contains("position tensor 1, pipeline 1: 2 units"));  // the others still listed
  // Put back: loads as before.
  swap_files(step, "shard_t00_p00_00000.ckpt", "shard_t01_p00_00000.ckpt");
  resign_shard_records(step);
  CHECK(whole_values(root) == before);

  // Across pipeline parts, and two data-parallel ranks of one position.
  swap_files(step, "shard_t00_p00_00001.ckpt", "shard_t00_p01_00001.ckpt");
  resign_shard_records(step);
  CHECK_THROWS_WITH(ckpt::Reader(step, 0, 1),
                    Contains("shard_t00_p01_00001.ckpt': field 'index.position' records position (tensor 0, pipeline "
                             "0), data-parallel rank 1, but the file was found in the place of position (tensor 0, "
                             "pipeline 1), rank 1"));
  swap_files(step, "shard_t00_p00_00001.ckpt", "shard_t00_p01_00001.ckpt");
  swap_files(step, "shard_t01_p01_00000.ckpt", "shard_t01_p01_00001.ckpt");
  resign_shard_records(step);
  CHECK_THROWS_WITH(ckpt::Reader(step, 1, 1),
                    Contains("shard_t01_p01_00000.ckpt': field 'index.rank' records position (tensor 1, pipeline 1), "
                             "data-parallel rank 1, but the file was found in the place of position (tensor 1, "
                             "pipeline 1), rank 0"));
  fs::remove_all(root);
}

// Checkpoints of format 2 (shards that record no position) load as before, grid or not, and give
// the same model; only where their shards lie is taken on trust.
TEST_CASE("format 2 checkpoints, whose shards record no position, still load") {
  const std::string root = temp_dir();
  write_grid_checkpoint(root);
  const std::vector<float> v3 = whole_values(root);
  const std::string step = ckpt::resolve(root, "latest");
  downgrade_to_format_2(step);
  CHECK(ckpt::read_metadata_file(step + "/" + ckpt::kMetadataFile).format_version == 2);
  CHECK(whole_values(root) == v3);
  std::ostringstream listing;
  CHECK(inspect_checkpoint(root, listing));
  INFO(listing.str());
  CHECK_THAT(listing.str(), Contains("all checksums ok"));
  for (int p = 0; p < 2; ++p)
    for (int t = 0; t < 2; ++t) CHECK(ckpt::Reader(step, t, p).meta().format_version == 2);
  // Resharded, it is written in this build's format, every shard with its position.
  reshard_checkpoint(root, root + "/dp3", 3);
  CHECK(whole_values(root + "/dp3") == v3);
  CHECK(ckpt::Reader(ckpt::resolve(root + "/dp3", "latest"), 1, 1).meta().format_version == ckpt::kFormatVersion);
  fs::remove_all(root);

  // Without a grid.
  const std::string flat = temp_dir();
  write_checkpoint(flat, 1, 1, 2, {{{"u", {{{"w", {3, 2}}, {1, 2, 3, 4, 5, 6}}}}}});
  const std::vector<float> f3 = whole_values(flat);
  downgrade_to_format_2(ckpt::resolve(flat, "latest"));
  CHECK(whole_values(flat) == f3);
  CHECK(f3 == std::vector<float>{1, 2, 3, 4, 5, 6});
  fs::remove_all(flat);
}

TEST_CASE("concat_parts interleaves blocks, and take_part takes them back") {
  // Two parts [1, 6] with 3 blocks: whole [a0 a1 b0 b1 | a2 a3 b2 b3 | a4 a5 b4 b5].
  const std::vector<float> a = {0, 1, 2, 3, 4, 5}, b = {10, 11, 12, 13, 14, 15};
  std::vector<float> whole(12), part(6);
  zero::concat_parts({a.data(), b.data()}, {1, 6}, 1, 3, whole.data());
  CHECK(whole == std::vector<float>{0, 1, 10, 11, 2, 3, 12, 13, 4, 5, 14, 15});
  zero::take_part(whole.data(), {1, 6}, 1, 3, 2, 1, part.data());
  CHECK(part == b);
  // Along rows, one block: the parts one after the other.
  zero::concat_parts({a.data(), b.data()}, {3, 2}, 0, 1, whole.data());
  CHECK(whole == std::vector<float>{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15});
  zero::take_part(whole.data(), {3, 2}, 0, 1, 2, 0, part.data());
  CHECK(part == a);
}

TEST_CASE("a grid checkpoint with a parameter neither split nor replicated cannot be put together") {
  const std::string root = temp_dir();
  write_grid_checkpoint(root, /*leave_one_unmarked=*/true);
  REQUIRE_THROWS_WITH(
      for_each_checkpoint_tensor(root, "latest", [](const CheckpointTensor&, std::span<const float>) {}),
      Contains("parameter 'proj' of unit 'h.0' is neither split nor replicated") && Contains("set_split"));
  fs::remove_all(root);
}

namespace {

// Part t of T of a whole 1-D or 2-D tensor cut along `axis` in `blocks` blocks, by index
// arithmetic of its own: along the axis, block b's extent n/blocks is cut into T runs of
// n/(blocks T), and part t takes run t of every block.
std::vector<float> cut(const std::vector<float>& whole, const std::vector<std::int64_t>& shape, int axis, int blocks,
                       int T, int t) {
  const std::int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
  const std::int64_t n = shape[static_cast<std::size_t>(axis)], run = n / blocks / T;
  auto keep = [&](std::int64_t k) { return (k % (n / blocks)) / run == t; };
  std::vector<float> part;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      if (keep(axis == 0 ? r : c)) part.push_back(whole[static_cast<std::size_t>(r * cols + c)]);
  return part;
}

}  // namespace

TEST_CASE("zero-ckpt export --format hf of a TP 2 x PP 2 GPT-2 equals the export of the unsplit model") {
  // A tiny GPT-2 split as Megatron splits it: QKV by output columns in 3 blocks, the MLP's
  // up-projection by columns, both down-projections by rows (their biases replicated),
  // LayerNorms and wpe replicated, wte by vocabulary rows; blocks h.0 in the first part, h.1
  // and ln_f on the last, which also holds the tied wte (other values: the first part's count).
  plan::GptShape c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 8, c.seq_len = 4, c.vocab_size = 100;
  const Layout whole = plan::gpt_layout(c);
  auto split_of = [](const std::string& name) -> std::pair<int, int> {  // {axis, blocks}; axis -1: replicated
    if (name == "wte.weight") return {0, 1};
    if (name.ends_with("c_attn.weight")) return {1, 3};
    if (name.ends_with("c_attn.bias")) return {0, 3};
    if (name.ends_with("mlp.c_fc.weight") || name.ends_with("mlp.c_fc.bias"))
      return {name.ends_with("weight") ? 1 : 0, 1};
    if (name.ends_with("c_proj.weight")) return {0, 1};
    return {-1, 1};
  };
  auto values_of = [](int unit, const ParamInfo& p) {
    std::vector<float> v(static_cast<std::size_t>(p.numel));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = 0.25f * static_cast<float>(unit) + 0.001f * static_cast<float>(p.offset + static_cast<std::int64_t>(i));
    return v;
  };
  auto part_of = [](const std::string& unit) { return unit == "embeddings" || unit == "h.0" ? 0 : 1; };

  std::vector<TestUnit> unsplit;
  std::vector<std::vector<TestUnit>> grid(4);
  for (int u = 0; u < whole.num_units(); ++u) {
    const UnitInfo& ui = whole.unit(u);
    TestUnit one{ui.name, {}};
    for (const auto& p : ui.params) one.params.push_back({{p.name, p.shape, 0, 0}, values_of(u, p)});
    unsplit.push_back(one);
    for (int t = 0; t < 2; ++t) {
      TestUnit part{ui.name, {}};
      for (const auto& p : ui.params) {
        const auto [axis, blocks] = split_of(p.name);
        TestParam tp{{p.name, p.shape, 0, 0}, values_of(u, p)};
        if (axis < 0) {
          tp.meta.replicated = true;
        } else {
          tp.values = cut(tp.values, p.shape, axis, blocks, 2, t);
          tp.meta.shape[static_cast<std::size_t>(axis)] /= 2;
          tp.meta.split_axis = axis;
          tp.meta.split_blocks = blocks;
        }
        part.params.push_back(std::move(tp));
      }
      grid[static_cast<std::size_t>(t + 2 * part_of(ui.name))].push_back(part);
      if (ui.name == "embeddings") {  // the last part's tied copy: wte only, other values
        TestUnit tied{ui.name, {part.params[0]}};
        for (auto& v : tied.params[0].values) v += 1000.0f;
        grid[static_cast<std::size_t>(t + 2)].push_back(tied);
      }
    }
  }
  // The last part holds the tied embedding after its own units, as a trainer appends it.
  for (int t = 0; t < 2; ++t) {
    auto& last = grid[static_cast<std::size_t>(t + 2)];
    std::rotate(last.begin(), last.begin() + 1, last.end());
  }

  const std::string root = temp_dir();
  write_checkpoint(root + "/whole", 1, 1, 1, {unsplit});
  write_checkpoint(root + "/grid", 2, 2, 2, grid);
  hf::ExportOptions o;
  o.n_head = c.n_head;
  o.vocab_size = c.vocab_size;
  hf::export_hf(root + "/whole", root + "/hf_whole", o);
  hf::export_hf(root + "/grid", root + "/hf_grid", o);
  const std::string a = file_bytes(root + "/hf_whole/model.safetensors"),
                    b = file_bytes(root + "/hf_grid/model.safetensors");
  CHECK(a.size() > 4 * static_cast<std::size_t>(plan::gpt_layout(c).num_params() - 28 * 8));  // the tensors are there
  CHECK(a == b);
  CHECK(file_bytes(root + "/hf_whole/config.json") == file_bytes(root + "/hf_grid/config.json"));
  fs::remove_all(root);
}
