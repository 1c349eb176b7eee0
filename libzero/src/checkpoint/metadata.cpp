// Checkpoint metadata: the JSON document (written from Metadata, read back strictly) and its file.
#include <fmt/format.h>

#include <cmath>

#include "checkpoint/format.hpp"
#include "checkpoint/json.hpp"
#include "runtime/strings.hpp"
#include "zero/config.hpp"
#include "zero/optim.hpp"
#include "zero/error.hpp"

namespace zero::ckpt {

UnitMeta unit_meta(const UnitInfo& u, std::int64_t slice) {
  UnitMeta m{u.name, u.numel, slice, {}};
  for (const auto& p : u.params)
    m.params.push_back({p.name, p.shape, p.numel, p.offset, p.replicated, p.split_axis, p.split_blocks});
  return m;
}

using namespace detail;

namespace {

constexpr std::uint64_t kMaxMetadataBytes = 1ull << 30;
const char* kMetaHint = "the metadata is damaged or was not written by libzero; load an older checkpoint";
// 2^53: a count of steps no run reaches, exact in a double, and far from int64's end.
constexpr std::int64_t kMaxCounter = std::int64_t{1} << 53;

// How a parameter lies over the tensor group, for the cross-position checks.
std::string split_words(bool replicated, int axis, int blocks) {
  if (replicated) return "replicated";
  if (axis < 0) return "not split";
  return fmt::format("split along axis {}{}", axis, blocks > 1 ? fmt::format(" in {} blocks", blocks) : "");
}

// "(2 problems):" and each problem on a line of its own, for an error message.
std::string problem_lines(const std::vector<std::string>& problems) {
  std::string out = fmt::format("({} problem{}):", problems.size(), problems.size() == 1 ? "" : "s");
  for (const auto& p : problems) out += "\n    " + p;
  return out;
}

DType dtype_from(const json::Field& f) {
  const std::string& s = f.str();
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    if (s == dtype_name(t)) return t;
  f.fail(fmt::format("= \"{}\" is not one of fp32, bf16, fp16", s));
}

json::Json units_json(const std::vector<UnitMeta>& units, int world) {
  using json::Json;
  Json us = Json::array();
  for (const auto& u : units) {
    Json ps = Json::array();
    for (const auto& p : u.params) {
      Json pj = {{"name", p.name}, {"shape", p.shape}, {"dtype", "fp32"}, {"numel", p.numel}, {"offset", p.offset}};
      // Only when set, so checkpoints of unsplit models read as before.
      if (p.replicated) pj["replicated"] = true;
      if (p.split_axis >= 0) pj["split"] = {{"axis", p.split_axis}, {"blocks", p.split_blocks}};
      ps.push_back(std::move(pj));
    }
    us.push_back({{"name", u.name},
                  {"numel", u.numel},
                  {"slice", u.slice},
                  {"padded", u.slice * world},
                  {"padding", u.slice * world - u.numel},
                  {"params", std::move(ps)}});
  }
  return us;
}

// A list of per-rank files (the shards, the rank-state files): rank, canonical name, size and
// index checksum each.
json::Json file_list(const std::vector<ShardMeta>& files) {
  json::Json out = json::Json::array();
  for (std::size_t r = 0; r < files.size(); ++r)
    out.push_back({{"rank", r},
                   {"file", files[r].file},
                   {"bytes", files[r].bytes},
                   {"index_checksum", json::hex64(files[r].index_checksum)}});
  return out;
}

std::vector<UnitMeta> parse_units(json::Field us, int world) {
  std::vector<UnitMeta> units;
  if (us.size() == 0 || us.size() > (1u << 24)) us.fail("must list between 1 and 2^24 units");
  for (std::size_t i = 0; i < us.size(); ++i) {
    json::Field uf = us[i];
    uf.expect_keys({"name", "numel", "slice", "padded", "padding", "params"});
    UnitMeta u;
    u.name = uf.at("name").str();
    if (u.name.empty()) uf.at("name").fail("is empty");
    for (const auto& prev : units)
      if (prev.name == u.name) uf.at("name").fail(fmt::format("= \"{}\" repeats an earlier unit's name", u.name));
    u.numel = uf.at("numel").i64(1, kMaxElements);
    u.slice = uf.at("slice").i64(0, kMaxElements / world);
    if (u.slice * world < u.numel) uf.at("slice").fail(fmt::format("x world_size is smaller than numel ({})", u.numel));
    uf.at("padded").i64(u.slice * world, u.slice * world);
    uf.at("padding").i64(u.slice * world - u.numel, u.slice * world - u.numel);
    json::Field ps = uf.at("params");
    if (ps.size() == 0) ps.fail("is empty");
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < ps.size(); ++k) {
      json::Field pf = ps[k];
      pf.expect_keys({"name", "shape", "dtype", "numel", "offset"}, {"replicated", "split"});
      ParamMeta p;
      p.name = pf.at("name").str();
      if (p.name.empty()) pf.at("name").fail("is empty");
      for (const auto& prev : u.params)
        if (prev.name == p.name)
          pf.at("name").fail(fmt::format("= \"{}\" repeats an earlier parameter's name", p.name));
      if (pf.at("dtype").str() != "fp32") pf.at("dtype").fail("must be \"fp32\" (the master's type)");
      json::Field sh = pf.at("shape");
      if (sh.size() > 16) sh.fail("has more than 16 dimensions");
      std::int64_t n = 1;
      for (std::size_t j = 0; j < sh.size(); ++j) {
        std::int64_t dim = sh[j].i64(1, kMaxElements);
        if (n > kMaxElements / dim) sh.fail("has more than 2^50 elements");
        n *= dim;
        p.shape.push_back(dim);
      }
      p.numel = pf.at("numel").i64(n, n);
      p.offset = pf.at("offset").i64(offset, offset);
      if (pf.has("replicated")) p.replicated = pf.at("replicated").boolean();
      if (pf.has("split")) {
        json::Field sp = pf.at("split");
        sp.expect_keys({"axis", "blocks"});
        p.split_axis = static_cast<int>(sp.at("axis").i64(0, static_cast<std::int64_t>(p.shape.size()) - 1));
        p.split_blocks = static_cast<int>(sp.at("blocks").i64(1, p.shape[static_cast<std::size_t>(p.split_axis)]));
        if (p.shape[static_cast<std::size_t>(p.split_axis)] % p.split_blocks != 0)
          sp.at("blocks").fail(fmt::format("= {} does not divide the axis' extent {}", p.split_blocks,
                                           p.shape[static_cast<std::size_t>(p.split_axis)]));
        if (p.replicated) pf.at("split").fail("is given for a replicated parameter");
      }
      offset += n;
      if (offset > u.numel) pf.at("numel").fail(fmt::format("runs past the unit's numel ({})", u.numel));
      u.params.push_back(std::move(p));
    }
    if (offset != u.numel) uf.at("numel").fail(fmt::format("= {} but the parameters hold {}", u.numel, offset));
    units.push_back(std::move(u));
  }
  return units;
}

// `name(r)`: the one file name rank r's file may have (never a path out of the checkpoint).
template <class Name>
std::vector<ShardMeta> parse_file_list(json::Field ss, int world, const char* what, Name name) {
  std::vector<ShardMeta> shards;
  if (ss.size() != static_cast<std::size_t>(world))
    ss.fail(fmt::format("lists {} {} for world_size {}", ss.size(), what, world));
  for (std::size_t r = 0; r < ss.size(); ++r) {
    json::Field sf = ss[r];
    sf.expect_keys({"rank", "file", "bytes", "index_checksum"});
    sf.at("rank").i64(static_cast<std::int64_t>(r), static_cast<std::int64_t>(r));
    ShardMeta s;
    s.file = sf.at("file").str();
    const std::string want = name(static_cast<int>(r));
    if (s.file != want) sf.at("file").fail(fmt::format("= \"{}\", expected \"{}\"", s.file, want));
    s.bytes = static_cast<std::uint64_t>(sf.at("bytes").i64(kHeaderBytes));
    s.index_checksum = sf.at("index_checksum").hex64();
    shards.push_back(std::move(s));
  }
  return shards;
}

PositionMeta parse_position(json::Field pf, int world, int tensor, int pipeline) {
  pf.expect_keys({"tensor", "pipeline", "units", "shards"});
  PositionMeta p;
  p.tensor = static_cast<int>(pf.at("tensor").i64(tensor, tensor));
  p.pipeline = static_cast<int>(pf.at("pipeline").i64(pipeline, pipeline));
  p.units = parse_units(pf.at("units"), world);
  p.shards =
      parse_file_list(pf.at("shards"), world, "shards", [&](int r) { return shard_file_name(r, tensor, pipeline); });
  return p;
}

json::Json position_json(const PositionMeta& p, int world) {
  return {{"tensor", p.tensor},
          {"pipeline", p.pipeline},
          {"units", units_json(p.units, world)},
          {"shards", file_list(p.shards)}};
}

}  // namespace

std::string position_to_json(const PositionMeta& p, int world) {
  return json::dump_pretty(position_json(p, world), "checkpoint position");
}

PositionMeta position_from_json(const std::string& text, int world, int tensor, int pipeline,
                                const std::string& origin) {
  json::Json doc = json::parse(text, origin);
  return parse_position(json::Field(doc, origin, "", kMetaHint), world, tensor, pipeline);
}

const PositionMeta& Metadata::position(int tensor, int pipeline) const {
  ZERO_CHECK(tensor >= 0 && tensor < grid.tensor && pipeline >= 0 && pipeline < grid.pipeline &&
                 positions.size() == static_cast<std::size_t>(grid.tensor * grid.pipeline),
             fmt::format("checkpoint: position (tensor {}, pipeline {}) is outside its grid {}", tensor, pipeline,
                         grid.describe()));
  return positions[static_cast<std::size_t>(tensor + grid.tensor * pipeline)];
}

std::string Metadata::to_json() const {
  using json::Json;
  ZERO_CHECK(std::isfinite(scaler.scale), fmt::format("checkpoint: the loss scale {} is not finite", scaler.scale));
  Json d = Json::object();
  d["format"] = "libzero-checkpoint";
  d["format_version"] = kFormatVersion;
  d["step"] = step;
  d["applied_steps"] = applied;
  d["world_size"] = world;
  d["stage"] = stage;
  d["compute_dtype"] = dtype_name(compute_dtype);
  d["master_dtype"] = "fp32";
  d["optimizer"] = optimizer;
  d["optimizer_moments"] = moments;
  d["compute_params"] = {{"stored", false},
                         {"derivation", "round-to-nearest-even of the fp32 master to compute_dtype"}};
  d["loss_scaler"] = {{"dynamic", scaler_dynamic},
                      {"scale", scaler.scale},
                      {"hysteresis_left", scaler.hysteresis_left},
                      {"iter", scaler.iter},
                      {"last_overflow_iter", scaler.last_overflow_iter}};
  d["scheduler"] = {{"type", scheduler}, {"step", scheduler_step}};
  // Written only when the loop set a rate, so other checkpoints stay readable by older builds.
  if (loop_lr) {
    ZERO_CHECK(std::isfinite(*loop_lr), fmt::format("checkpoint: the learning rate {} is not finite", *loop_lr));
    d["scheduler"]["lr"] = *loop_lr;
  }
  if (grid.split()) {
    ZERO_CHECK(positions.size() == static_cast<std::size_t>(grid.tensor * grid.pipeline),
               fmt::format("checkpoint: {} positions for the grid {}", positions.size(), grid.describe()));
    Json ps = Json::array();
    for (const auto& p : positions) ps.push_back(position_json(p, world));
    d["grid"] = {{"tensor", grid.tensor}, {"pipeline", grid.pipeline}, {"positions", std::move(ps)}};
  } else {
    d["units"] = units_json(units, world);
    d["shards"] = file_list(shards);
  }
  if (!rank_state.empty()) {
    json::Json rs = {{"kind", rank_state_kind}, {"files", file_list(rank_state)}};
    if (!rank_state_layout.empty()) rs["layout"] = rank_state_layout;
    d["rank_state"] = std::move(rs);
  }
  if (!tensor_records.empty()) {
    Json tr = Json::object();
    for (const auto& [name, values] : tensor_records) {
      for (double v : values)
        ZERO_CHECK(std::isfinite(v), fmt::format("checkpoint: the optimizer's '{}' holds {}, not finite", name, v));
      tr[name] = values;
    }
    d["optimizer_tensors"] = std::move(tr);
  }
  // Values are opaque bytes (RNG states, data positions): hex keeps them intact in JSON text.
  Json& cs = d["client_state"] = Json::object();
  for (const auto& [k, v] : client) cs[k] = json::to_hex(v);
  d["config_yaml"] = config_yaml;
  return json::dump_pretty(d, "checkpoint metadata");
}

Metadata Metadata::parse(const std::string& text, const std::string& origin) {
  json::Json doc = json::parse(text, origin);
  json::Field d(doc, origin, "", kMetaHint);
  // Units and shards are at the top, or per position under a grid (checked below).
  d.expect_keys(
      {"format", "format_version", "step", "applied_steps", "world_size", "stage", "compute_dtype", "master_dtype",
       "optimizer", "optimizer_moments", "compute_params", "loss_scaler", "scheduler", "client_state", "config_yaml"},
      {"units", "shards", "grid", "rank_state", "optimizer_tensors"});
  Metadata m;
  if (d.at("format").str() != "libzero-checkpoint") d.at("format").fail("is not \"libzero-checkpoint\"");
  m.format_version = static_cast<std::uint32_t>(d.at("format_version").i64());
  if (m.format_version < kOldestReadableFormat || m.format_version > kFormatVersion)
    d.at("format_version")
        .fail(fmt::format("= {} is not a format this build reads ({} to {})", m.format_version, kOldestReadableFormat,
                          kFormatVersion));
  // Counters are bounded where they are read, so no later arithmetic on them (step + 1, the
  // scaler's iter + 1, tokens = step x tokens per step in a double) can overflow.
  m.step = d.at("step").i64(0, kMaxCounter);
  m.applied = d.at("applied_steps").i64(0, m.step);
  m.world = static_cast<int>(d.at("world_size").i64(1, 1 << 20));
  m.stage = static_cast<int>(d.at("stage").i64(0, 3));
  m.compute_dtype = dtype_from(d.at("compute_dtype"));
  if (d.at("master_dtype").str() != "fp32") d.at("master_dtype").fail("must be \"fp32\"");
  m.optimizer = d.at("optimizer").str();
  // Each optimizer's arrays per element (zero/optim.hpp, optimizer_moments): Adafactor's depend
  // on whether it keeps a first moment.
  int lo = 0, hi = 0;
  std::string optimizers;
  for (OptimizerType t :
       {OptimizerType::adamw, OptimizerType::adam, OptimizerType::sgd, OptimizerType::lamb, OptimizerType::lion,
        OptimizerType::adafactor, OptimizerType::muon, OptimizerType::onebit_adam, OptimizerType::onebit_lamb}) {
    optimizers += fmt::format("{}{}", optimizers.empty() ? "" : ", ", to_string(t));
    if (m.optimizer != to_string(t)) continue;
    OptimizerConfig o;
    o.type = t;
    lo = hi = optimizer_moments(o);
    if (t == OptimizerType::adafactor) lo = 1, hi = 2;
    if (t == OptimizerType::onebit_lamb) lo = 2;  // saved before it kept its fresh variance
  }
  if (hi == 0) d.at("optimizer").fail(fmt::format("= \"{}\" is not one of {}", m.optimizer, optimizers));
  m.moments = static_cast<int>(d.at("optimizer_moments").i64(lo, hi));

  json::Field cp = d.at("compute_params");
  cp.expect_keys({"stored", "derivation"});
  if (cp.at("stored").boolean()) cp.at("stored").fail("is true, but this format version never stores compute params");
  (void)cp.at("derivation").str();

  json::Field ls = d.at("loss_scaler");
  ls.expect_keys({"dynamic", "scale", "hysteresis_left", "iter", "last_overflow_iter"});
  m.scaler_dynamic = ls.at("dynamic").boolean();
  m.scaler.scale = ls.at("scale").f64();
  if (!(m.scaler.scale > 0)) ls.at("scale").fail("must be positive");
  m.scaler.hysteresis_left = static_cast<int>(ls.at("hysteresis_left").i64(0, 1 << 30));
  m.scaler.iter = ls.at("iter").i64(0, kMaxCounter);
  m.scaler.last_overflow_iter = ls.at("last_overflow_iter").i64(-1, m.scaler.iter);

  json::Field sc = d.at("scheduler");
  sc.expect_keys({"type", "step"}, {"lr"});
  m.scheduler = sc.at("type").str();
  std::string names;
  bool known = false;
  for (SchedulerType t : {SchedulerType::none, SchedulerType::warmup_lr, SchedulerType::warmup_decay_lr,
                          SchedulerType::warmup_cosine_lr, SchedulerType::manual_lr}) {
    known = known || m.scheduler == to_string(t);
    optimizers += fmt::format("{}{}", optimizers.empty() ? "" : ", ", to_string(t));
  }
  if (!known) sc.at("type").fail(fmt::format("= \"{}\" is not one of {}", m.scheduler, names));
  m.scheduler_step = sc.at("step").i64(m.applied, m.applied);
  if (sc.has("lr")) {
    m.loop_lr = sc.at("lr").f64();
    if (!(*m.loop_lr >= 0 && std::isfinite(*m.loop_lr))) sc.at("lr").fail("must be a finite rate >= 0");
  }

  if (d.has("grid")) {
    json::Field g = d.at("grid");
    g.expect_keys({"tensor", "pipeline", "positions"});
    m.grid.tensor = static_cast<int>(g.at("tensor").i64(1, 1 << 20));
    m.grid.pipeline = static_cast<int>(g.at("pipeline").i64(1, 1 << 20));
    if (!m.grid.split()) g.fail("is 1 x 1; a checkpoint without model parallelism has no grid");
    json::Field ps = g.at("positions");
    if (ps.size() != static_cast<std::size_t>(m.grid.tensor) * static_cast<std::size_t>(m.grid.pipeline))
      ps.fail(fmt::format("lists {} positions for the grid {}", ps.size(), m.grid.describe()));
    for (std::size_t i = 0; i < ps.size(); ++i)
      m.positions.push_back(
          parse_position(ps[i], m.world, static_cast<int>(i) % m.grid.tensor, static_cast<int>(i) / m.grid.tensor));
    if (d.has("units") || d.has("shards")) d.fail("has both a grid and top-level units or shards");
    const std::vector<std::string> bad = position_disagreements(m);
    if (!bad.empty())
      ZERO_THROW(
          fmt::format("checkpoint file '{}': the positions of the grid {} disagree {}\n  every tensor rank of a "
                      "pipeline part must hold tensor rank 0's units and parameters (its own part of each); {}",
                      origin, m.grid.describe(), problem_lines(bad), kDamaged));
  } else {
    m.units = parse_units(d.at("units"), m.world);
    m.shards = parse_file_list(d.at("shards"), m.world, "shards", [](int r) { return shard_file_name(r); });
  }
  if (d.has("rank_state")) {
    json::Field rs = d.at("rank_state");
    rs.expect_keys({"kind", "files"}, {"layout"});
    m.rank_state_kind = rs.at("kind").str();
    if (m.rank_state_kind != "powersgd" && m.rank_state_kind != "qgz" && m.rank_state_kind != "onebit")
      rs.at("kind").fail("is not \"powersgd\", \"qgz\" or \"onebit\"");
    if (rs.has("layout")) m.rank_state_layout = rs.at("layout").str();
    m.rank_state = parse_file_list(rs.at("files"), m.world, "files", rank_state_file_name);
  }

  if (d.has("optimizer_tensors")) {
    json::Field tr = d.at("optimizer_tensors");
    if (m.grid.split()) tr.fail("is set with a grid; no optimizer with per-tensor records runs on one");
    std::size_t tensors = 0;
    for (const UnitMeta& u : m.units) tensors += u.params.size();
    for (const std::string& name : tr.keys()) {
      json::Field a = tr.at(name);
      if (a.size() != 0 && a.size() != tensors)
        a.fail(fmt::format("lists {} values, the units hold {} parameters", a.size(), tensors));
      std::vector<double>& v = m.tensor_records[name];
      for (std::size_t i = 0; i < a.size(); ++i) v.push_back(a[i].f64());
    }
  }

  json::Field cs = d.at("client_state");
  for (const auto& k : cs.keys()) m.client[k] = cs.at(k).hex_bytes();
  m.config_yaml = d.at("config_yaml").str();
  return m;
}

std::vector<std::string> position_disagreements(const Metadata& m) {
  std::vector<std::string> out;
  if (!m.grid.split() || m.positions.size() != static_cast<std::size_t>(m.grid.tensor * m.grid.pipeline)) return out;
  const auto T = static_cast<std::size_t>(m.grid.tensor);
  for (std::size_t p = 0; p < static_cast<std::size_t>(m.grid.pipeline); ++p) {
    const std::vector<UnitMeta>& first = m.positions[T * p].units;
    for (std::size_t t = 1; t < T; ++t) {
      const std::size_t i = t + T * p;
      const std::vector<UnitMeta>& other = m.positions[i].units;
      // Each line: the field, its value, tensor rank 0's; a mismatch higher up (a unit count,
      // a unit's name or parameter count) is reported alone, not as the cascade it causes.
      const std::string where =
          fmt::format("position (tensor {}, pipeline {}): field 'grid.positions[{}].units", t, p, i);
      const std::string rank0 = fmt::format("position (tensor 0, pipeline {})", p);
      if (other.size() != first.size()) {
        out.push_back(fmt::format("{}' lists {} units, {} lists {}", where, other.size(), rank0, first.size()));
        continue;
      }
      for (std::size_t u = 0; u < first.size(); ++u) {
        const UnitMeta &a = first[u], &b = other[u];
        const std::string uat = fmt::format("{}[{}]", where, u);
        if (a.name != b.name) {
          out.push_back(
              fmt::format("{}.name' = \"{}\", {} has \"{}\"", uat, escape_bytes(b.name), rank0, escape_bytes(a.name)));
          continue;
        }
        if (a.params.size() != b.params.size()) {
          out.push_back(fmt::format("{}.params' lists {} parameters for unit '{}', {} lists {}", uat, b.params.size(),
                                    escape_bytes(a.name), rank0, a.params.size()));
          continue;
        }
        for (std::size_t k = 0; k < a.params.size(); ++k) {
          const ParamMeta &x = a.params[k], &y = b.params[k];
          const std::string pat = fmt::format("{}.params[{}]", uat, k);
          if (x.name != y.name) {
            out.push_back(fmt::format("{}.name' = \"{}\" (unit '{}'), {} has \"{}\"", pat, escape_bytes(y.name),
                                      escape_bytes(a.name), rank0, escape_bytes(x.name)));
            continue;
          }
          const std::string what = fmt::format("'{}' of unit '{}'", escape_bytes(x.name), escape_bytes(a.name));
          if (x.shape != y.shape)
            out.push_back(fmt::format("{}.shape' = {} for {}, {} has {}", pat, shape_text(y.shape), what, rank0,
                                      shape_text(x.shape)));
          if (x.replicated != y.replicated || x.split_axis != y.split_axis || x.split_blocks != y.split_blocks)
            out.push_back(fmt::format("{}' {} is {}, {} has it {}", pat, what,
                                      split_words(y.replicated, y.split_axis, y.split_blocks), rank0,
                                      split_words(x.replicated, x.split_axis, x.split_blocks)));
        }
      }
    }
  }
  return out;
}

void write_metadata_file(const std::string& path, const Metadata& m) {
  // A save never writes what every reader refuses: a model whose tensor ranks describe different
  // units is found here, not at the resume.
  const std::vector<std::string> bad = position_disagreements(m);
  if (!bad.empty())
    ZERO_THROW(
        fmt::format("checkpoint '{}': the tensor ranks of a pipeline part hold different units or parameters "
                    "{}\n  every tensor rank must build the same Layout, its own part of each parameter "
                    "(Layout::set_split, set_replicated)",
                    path, problem_lines(bad)));
  write_small_file(path, FileKind::metadata, m.to_json());  // the index is the whole payload
}

Metadata read_metadata_file(const std::string& path) {
  Fd f = Fd::open_read(path);
  FileHeader h = read_header(f, FileKind::metadata);
  if (h.index_bytes != h.payload_bytes)
    file_fail(path, "header.index_bytes", "must equal payload_bytes in a metadata file");
  if (h.payload_bytes > kMaxMetadataBytes) file_fail(path, "header.payload_bytes", "is larger than 1 GiB");
  return Metadata::parse(read_index(f, h), path);
}

}  // namespace zero::ckpt
