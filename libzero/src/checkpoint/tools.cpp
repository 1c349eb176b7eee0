// The offline side of checkpoints: listing, inspection, safetensors export and resharding.
// None of it needs MPI or an engine; the zero-ckpt tool is a command line over these.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/format.hpp"
#include "checkpoint/safetensors.hpp"
#include "runtime/strings.hpp"
#include "zero/checkpoint.hpp"
#include "zero/config.hpp"
#include "zero/error.hpp"
#include "zero/layout.hpp"

namespace zero {

namespace fs = std::filesystem;

std::string resolve_checkpoint(const std::string& root, const std::string& tag) { return ckpt::resolve(root, tag); }

std::vector<std::int64_t> list_checkpoints(const std::string& root) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::int64_t s = ckpt::parse_step_dir_name(e.path().filename().string());
    if (s >= 0 && e.is_directory()) steps.push_back(s);
  }
  if (ec) ZERO_THROW(fmt::format("checkpoint root '{}': cannot list it: {}; check the path", root, ec.message()));
  std::sort(steps.begin(), steps.end());
  return steps;
}

namespace {

// The grids a checkpoint resumes at, as far as the checkpoint can tell: the tensor sizes (up to
// 64) that divide every recorded split, block by block. The model may ask more (its heads).
std::string resumable_grids(const ckpt::ModelReader& whole) {
  std::vector<std::int64_t> extents;  // each split parameter's per-block extent
  const auto& units = whole.meta().units;
  for (std::size_t u = 0; u < units.size(); ++u)
    for (std::size_t k = 0; k < units[u].params.size(); ++k) {
      const ckpt::ParamMeta& sp = whole.saved_part(static_cast<int>(u), static_cast<int>(k));
      if (sp.split_axis >= 0 && !sp.replicated)
        extents.push_back(units[u].params[k].shape[static_cast<std::size_t>(sp.split_axis)] / sp.split_blocks);
    }
  std::vector<int> sizes;
  for (int t = 1; t <= 64; ++t)
    if (std::all_of(extents.begin(), extents.end(), [&](std::int64_t e) { return e % t == 0; })) sizes.push_back(t);
  const std::string tensor =
      extents.empty() ? std::string("TP 1, or any tensor size whose split the resuming model declares (none recorded)")
                      : fmt::format("TP {} (every recorded split divides; the model may allow fewer, by its heads)",
                                    fmt::join(sizes, ", "));
  return fmt::format("resumes at: {}; any pipeline size the model's layers allow; any data-parallel size and stage",
                     tensor);
}

// A client-state value: short text quoted, anything else by its size.
std::string client_value_text(const std::string& v) {
  bool text = std::all_of(v.begin(), v.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
  return text && v.size() <= 64 ? fmt::format("\"{}\"", v) : fmt::format("<{} bytes>", v.size());
}

// How a parameter lies over the tensor group, for listings: "" when whole.
std::string split_note(const ckpt::ParamMeta& p) {
  if (p.replicated) return "  replicated";
  if (p.split_axis < 0) return "";
  return fmt::format("  split axis {}{}", p.split_axis,
                     p.split_blocks > 1 ? fmt::format(" blocks {}", p.split_blocks) : "");
}

// One shard set (a whole checkpoint's, or one grid position's): units, then its files verified.
// Adds the files' bytes to `total`; returns false on any failure.
bool inspect_shards(ckpt::Reader& r, std::ostream& out, const std::string& indent, std::uint64_t& total) {
  const ckpt::Metadata& m = r.meta();
  std::int64_t params = 0;
  for (const auto& u : m.units) params += u.numel;
  out << m.units.size() << " units, " << params << " parameters:\n";  // after the caller's heading
  for (const auto& u : m.units) {
    out << indent << "  " << escape_bytes(u.name) << ": " << u.numel << " elements, slice " << u.slice << ", padding "
        << (u.slice * m.world - u.numel) << "\n";
    for (const auto& p : u.params)
      out << indent << "    " << escape_bytes(p.name) << " " << shape_text(p.shape) << " fp32 offset " << p.offset
          << split_note(p) << "\n";
  }
  bool ok = true;
  std::uint64_t bytes = 0;
  std::ostringstream files;
  for (int k = 0; k < m.world; ++k) {
    const auto& s = m.shards[static_cast<std::size_t>(k)];
    files << indent << "  " << s.file << "  " << s.bytes << " bytes  ";
    try {
      r.verify_shard(k);
      files << "checksums ok\n";
    } catch (const std::exception& e) {
      files << "FAILED: " << e.what() << "\n";
      ok = false;
    }
    bytes += s.bytes;
  }
  out << indent << "files (" << bytes << " bytes):\n" << files.str();
  total += bytes;
  return ok;
}

// Where the next step's learning rate comes from: the rate the loop set (Engine::set_lr, saved
// only then), or the config's schedule (scheduler.type; none: optimizer.params.lr).
std::string lr_source(const ckpt::Metadata& m) {
  if (m.loop_lr) return fmt::format("{} (set by the loop: Engine::set_lr)", *m.loop_lr);
  if (m.scheduler == to_string(SchedulerType::manual_lr))
    return "none set by the loop yet (scheduler.type ManualLR: the next step needs Engine::set_lr)";
  if (m.scheduler == to_string(SchedulerType::none))
    return "from the config (optimizer.params.lr; no scheduler, and the loop set none)";
  return fmt::format("from the config's schedule (scheduler.type {} at step {}; the loop set none)",
                     escape_bytes(m.scheduler), m.scheduler_step);
}

// One step directory: summary, then every file verified. Returns false on any failure.
bool inspect_one(const std::string& dir, std::ostream& out, bool show_config) {
  // The metadata is read with every check the loaders make (the grid's positions in agreement
  // among them: ckpt::position_disagreements, each disagreement on a line of the error). Every
  // position's shard set is then opened (and checked against the metadata) before printing; a
  // position that fails is reported and the others still listed, so two swapped positions are
  // both named.
  ckpt::Metadata m;
  std::vector<std::unique_ptr<ckpt::Reader>> readers;
  std::vector<std::string> failed;  // per position: why its shard set did not open
  try {
    m = ckpt::read_metadata_file(dir + "/" + ckpt::kMetadataFile);
  } catch (const std::exception& e) {
    out << "  FAILED: " << e.what() << "\n";
    return false;
  }
  for (int p = 0; p < m.grid.pipeline; ++p)
    for (int t = 0; t < m.grid.tensor; ++t) {
      try {
        readers.push_back(std::make_unique<ckpt::Reader>(dir, m, t, p));
        failed.emplace_back();
      } catch (const std::exception& e) {
        readers.push_back(nullptr);
        failed.emplace_back(e.what());
      }
    }
  if (!m.grid.split() && !readers[0]) {
    out << "  FAILED: " << failed[0] << "\n";
    return false;
  }
  out << "  step " << m.step << " (applied updates " << m.applied << "), saved by " << m.world << " rank(s) at stage "
      << m.stage << (m.grid.split() ? " in each grid position" : "") << "\n";
  out << "  compute dtype " << dtype_name(m.compute_dtype) << " (params not stored: rounded from the fp32 master), "
      << "optimizer " << m.optimizer << " (" << m.moments << " moment(s))\n";
  out << "  loss scaler: " << (m.scaler_dynamic ? "dynamic" : "static") << ", scale " << m.scaler.scale
      << ", hysteresis left " << m.scaler.hysteresis_left << ", iter " << m.scaler.iter << ", last overflow "
      << m.scaler.last_overflow_iter << "; scheduler " << escape_bytes(m.scheduler) << " at step " << m.scheduler_step
      << "\n";
  out << "  learning rate: " << lr_source(m) << "\n";
  out << "  client state:";
  if (m.client.empty()) out << " (empty)";
  for (const auto& [k, v] : m.client) out << "\n    " << escape_bytes(k) << " = " << client_value_text(v);
  out << "\n";
  bool ok = true;
  std::uint64_t total = 0;
  std::error_code ec;
  auto meta_bytes = fs::file_size(fs::path(dir) / ckpt::kMetadataFile, ec);
  total += meta_bytes;
  if (m.grid.split()) {
    out << "  grid " << m.grid.describe() << " x DP " << m.world << " (" << m.grid.tensor * m.grid.pipeline
        << " positions, " << m.grid.tensor * m.grid.pipeline * m.world << " ranks)\n";
    for (std::size_t i = 0; i < readers.size(); ++i) {
      const ckpt::PositionMeta& pos = m.positions[i];
      out << "  position tensor " << pos.tensor << ", pipeline " << pos.pipeline << ": ";
      if (!readers[i]) {
        out << "FAILED: " << failed[i] << "\n";
        ok = false;
        continue;
      }
      ok = inspect_shards(*readers[i], out, "    ", total) && ok;
    }
    // What the export tools read: the parts put back together (an error here is no damage).
    if (ok) {
      try {
        ckpt::ModelReader whole(dir);
        std::int64_t n = 0;
        for (const auto& u : whole.meta().units) n += u.numel;
        out << "  whole model (the grid's parts put together): " << whole.meta().units.size() << " units, " << n
            << " parameters\n";
        out << "  " << resumable_grids(whole) << "\n";
      } catch (const std::exception& e) {
        out << "  whole model: " << e.what() << "\n";
      }
    }
  } else {
    out << "  ";
    ok = inspect_shards(*readers[0], out, "  ", total);
    if (ok) out << "  " << resumable_grids(ckpt::ModelReader(dir)) << "\n";
  }
  out << "  " << ckpt::kMetadataFile << "  " << meta_bytes << " bytes  checksum ok\n";
  out << "  total " << total << " bytes: " << (ok ? "all checksums ok" : "VERIFICATION FAILED") << "\n";
  if (show_config) {
    out << "  config:\n";
    // Line by line, each line escaped: the saved config is text from the file like any other.
    for (std::size_t at = 0; at < m.config_yaml.size();) {
      std::size_t end = m.config_yaml.find('\n', at);
      if (end == std::string::npos) end = m.config_yaml.size();
      out << "    " << escape_bytes(std::string_view(m.config_yaml).substr(at, end - at)) << "\n";
      at = end + 1;
    }
  }
  return ok;
}

}  // namespace

bool inspect_checkpoint(const std::string& path, std::ostream& out, bool show_config) {
  if (fs::exists(fs::path(path) / ckpt::kMetadataFile)) {
    out << path << ":\n";
    return inspect_one(path, out, show_config);
  }
  std::vector<std::int64_t> steps = list_checkpoints(path);
  bool ok = true;
  std::string latest;
  try {
    latest = ckpt::read_latest(path);
    out << path << ": latest -> " << latest << "\n";
  } catch (const std::exception& e) {
    out << path << ": latest: " << e.what() << "\n";
    ok = !steps.empty() ? false : ok;
  }
  // A latest that names no directory makes every resume from this root fail.
  if (!latest.empty() && !std::binary_search(steps.begin(), steps.end(), ckpt::parse_step_dir_name(latest))) {
    out << path << ": FAILED: latest names " << latest << ", which does not exist; "
        << "write the name of a complete checkpoint into " << path << "/" << ckpt::kLatestFile
        << " (or pass a step as the tag)\n";
    ok = false;
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind(".tmp_step_", 0) == 0 || n.rfind(".trash_step_", 0) == 0)
      out << n << ": left by an interrupted save (ignored; the next save removes it)\n";
  }
  if (steps.empty()) out << "no checkpoints\n";
  for (auto s : steps) {
    std::string name = ckpt::step_dir_name(s);
    // A complete step newer than latest: a save whose pointer update failed (a full disk).
    const bool orphan = !latest.empty() && s > ckpt::parse_step_dir_name(latest);
    out << name << (name == latest ? " (latest)" : "")
        << (orphan ? fmt::format(" (newer than latest: a save that could not update 'latest'; to resume from it, "
                                 "write \"{}\" into {}/{}; the run's next save at this step replaces it)",
                                 name, path, ckpt::kLatestFile)
                   : std::string())
        << ":\n";
    ok = inspect_one(path + "/" + name, out, show_config) && ok;
  }
  return ok;
}

void for_each_checkpoint_tensor(const std::string& path, const std::string& tag,
                                const std::function<void(const CheckpointTensor&, std::span<const float>)>& fn) {
  ckpt::ModelReader r(ckpt::resolve(path, tag));
  std::vector<float> master;
  for (std::size_t i = 0; i < r.meta().units.size(); ++i) {
    const auto& u = r.meta().units[i];
    master.resize(static_cast<std::size_t>(u.numel));
    r.read_unit(static_cast<int>(i), master.data());
    for (const auto& p : u.params)
      fn({u.name, p.name, p.shape},
         std::span<const float>(master.data() + p.offset, static_cast<std::size_t>(p.numel)));
  }
}

void for_each_checkpoint_state(
    const std::string& path, const std::string& tag,
    const std::function<void(const CheckpointTensor&, std::span<const std::span<const float>>)>& fn) {
  ckpt::ModelReader r(ckpt::resolve(path, tag));
  const auto arrays = static_cast<std::size_t>(1 + r.meta().moments);
  std::vector<float> state;
  std::vector<float*> out(arrays);
  std::vector<std::span<const float>> views(arrays);
  for (std::size_t i = 0; i < r.meta().units.size(); ++i) {
    const auto& u = r.meta().units[i];
    const auto n = static_cast<std::size_t>(u.numel);
    state.resize(n * arrays);
    for (std::size_t k = 0; k < arrays; ++k) out[k] = state.data() + k * n;
    r.read_unit(static_cast<int>(i), out);
    for (const auto& p : u.params) {
      for (std::size_t k = 0; k < arrays; ++k)
        views[k] = std::span<const float>(out[k] + p.offset, static_cast<std::size_t>(p.numel));
      fn({u.name, p.name, p.shape}, views);
    }
  }
}

void export_safetensors(const std::string& path, const std::string& out_file, DType dtype, const std::string& tag) {
  ckpt::ModelReader r(ckpt::resolve(path, tag));
  const ckpt::Metadata& m = r.meta();
  // Parameter names need be unique only within their unit (Layout): when some repeat across
  // units, every tensor is named "<unit>.<parameter>" instead, and the metadata says so.
  std::set<std::string> seen;
  bool repeated = false;
  for (const auto& u : m.units)
    for (const auto& p : u.params) repeated = !seen.insert(p.name).second || repeated;
  std::vector<safetensors::TensorSpec> tensors;
  for (const auto& u : m.units)
    for (const auto& p : u.params) tensors.push_back({repeated ? u.name + "." + p.name : p.name, dtype, p.shape});
  std::map<std::string, std::string> meta = {
      {"format", "pt"},  // what Hugging Face loaders look for
      {"libzero.step", fmt::format("{}", m.step)},
      {"libzero.source", "fp32 master weights" + std::string(dtype == DType::f32 ? "" : ", rounded to nearest even")},
      {"libzero.names", repeated ? "unit-qualified" : "parameter"},
  };
  safetensors::Writer w(out_file, std::move(tensors), meta);
  std::vector<float> master;
  std::vector<std::uint16_t> half;
  for (std::size_t i = 0; i < m.units.size(); ++i) {
    const auto& u = m.units[i];
    master.resize(static_cast<std::size_t>(u.numel));
    r.read_unit(static_cast<int>(i), master.data());
    for (const auto& p : u.params) {
      const float* src = master.data() + p.offset;
      if (dtype == DType::f32) {
        w.write_next(src, static_cast<std::size_t>(p.numel) * sizeof(float));
      } else {
        half.resize(static_cast<std::size_t>(p.numel));
        convert(src, DType::f32, half.data(), dtype, half.size());
        w.write_next(half.data(), half.size() * sizeof(std::uint16_t));
      }
    }
  }
  w.finish();
}

namespace {

// Writes grid position (t, p)'s shards for `world` data-parallel ranks into tmp, one shard and
// one unit at a time (memory: one new slice plus what `read` holds): read(unit, begin, len, out)
// fills that slice of the unit's master (out[0]) and of each moment. Each shard written adds its
// bytes to `done` and calls progress(done). Returns the shards' records.
std::vector<ckpt::ShardMeta> write_position(
    const std::string& tmp, const std::vector<ckpt::UnitMeta>& units, const ckpt::Metadata& nm, int moments, int t,
    int p, const std::function<void(int, std::int64_t, std::int64_t, std::span<float* const>)>& read,
    std::uint64_t& done, const std::function<void(std::uint64_t)>& progress) {
  std::vector<ckpt::ShardMeta> shards;
  std::vector<float> section;
  std::vector<float*> out(static_cast<std::size_t>(1 + moments));
  for (int k = 0; k < nm.world; ++k) {
    std::vector<ckpt::ShardWriter::Range> ranges;
    for (const auto& u : units) {
      const std::int64_t b = std::min(static_cast<std::int64_t>(k) * u.slice, u.numel);
      ranges.push_back({b, std::min(b + u.slice, u.numel) - b});
    }
    const std::string file = nm.grid.split() ? ckpt::shard_file_name(k, t, p) : ckpt::shard_file_name(k);
    ckpt::ShardWriter w(tmp + "/" + file, k, nm.world, nm.stage, moments, nm.step, ranges, t, p);
    for (std::size_t i = 0; i < units.size(); ++i) {
      const auto len = ranges[i].len;
      section.resize(static_cast<std::size_t>(len) * out.size());
      for (std::size_t a = 0; a < out.size(); ++a) out[a] = section.data() + a * static_cast<std::size_t>(len);
      read(static_cast<int>(i), ranges[i].begin, len, out);
      w.add_section(section.data());
      done += section.size() * sizeof(float);
    }
    shards.push_back(w.finish());
    if (progress) progress(done);
  }
  return shards;
}

// Puts a written position into the new metadata: its place in the grid's list, or the units and
// shards of a checkpoint without a grid.
void place_position(ckpt::Metadata& nm, ckpt::PositionMeta pos) {
  if (!nm.grid.split()) {
    nm.units = std::move(pos.units);
    nm.shards = std::move(pos.shards);
    return;
  }
  nm.positions.resize(static_cast<std::size_t>(nm.grid.tensor * nm.grid.pipeline));
  nm.positions[static_cast<std::size_t>(pos.tensor + nm.grid.tensor * pos.pipeline)] = std::move(pos);
}

// The units of a part on a grid of `tensors` tensor ranks (every tensor rank's part has the same
// shapes): `units` (whole or a saved pipeline part's), each parameter cut from its whole tensor by its
// saved split. Errors name the parameter.
Layout part_layout(const ckpt::ModelReader& whole, const std::vector<ckpt::UnitMeta>& units, int tensors) {
  Layout layout;
  const auto& wu = whole.meta().units;
  for (const auto& u : units) {
    const auto at = static_cast<int>(
        std::find_if(wu.begin(), wu.end(), [&](const ckpt::UnitMeta& w) { return w.name == u.name; }) - wu.begin());
    std::vector<std::pair<std::string, Layout::Shape>> ps;
    std::vector<const ckpt::ParamMeta*> saved;
    for (const auto& q : u.params) {
      const auto& wps = wu[static_cast<std::size_t>(at)].params;
      const auto k = static_cast<int>(
          std::find_if(wps.begin(), wps.end(), [&](const ckpt::ParamMeta& w) { return w.name == q.name; }) -
          wps.begin());
      const ckpt::ParamMeta& sp = whole.saved_part(at, k);
      Layout::Shape shape = wps[static_cast<std::size_t>(k)].shape;
      if (tensors > 1 && !sp.replicated) {
        ZERO_CHECK(sp.split_axis >= 0,
                   fmt::format("reshard: parameter '{}' of unit '{}' is neither split nor replicated, so it cannot "
                               "be cut for TP {}",
                               escape_bytes(q.name), escape_bytes(u.name), tensors));
        auto& d = shape[static_cast<std::size_t>(sp.split_axis)];
        ZERO_CHECK(d % (static_cast<std::int64_t>(tensors) * sp.split_blocks) == 0,
                   fmt::format("reshard: parameter '{}' of unit '{}' ({}) cannot be cut for TP {}: its axis {} ({}) "
                               "does not divide into {} block(s) of {} parts",
                               escape_bytes(q.name), escape_bytes(u.name), shape_text(shape), tensors, sp.split_axis, d,
                               sp.split_blocks, tensors));
        d /= tensors;
      }
      ps.emplace_back(q.name, std::move(shape));
      saved.push_back(&sp);
    }
    const int id = layout.add_unit(u.name, std::move(ps));
    for (std::size_t k = 0; k < saved.size(); ++k) {
      if (saved[k]->replicated) layout.set_replicated(id, u.params[k].name);
      if (saved[k]->split_axis >= 0)
        layout.set_split(id, u.params[k].name, saved[k]->split_axis, saved[k]->split_blocks);
    }
  }
  return layout;
}

// reshard_checkpoint onto another tensor x pipeline grid: every position's shards cut from the
// whole tensors (ModelReader::read_part), one unit's slice at a time.
void reshard_grid(const std::string& dir, const ckpt::Metadata& old, const std::string& tmp, ckpt::Metadata& nm,
                  int tensors, int parts, const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  // Adafactor keeps a matrix's row and column statistics in the first places of its own array:
  // they describe the whole matrix and cannot be cut (it runs at TP 1 only).
  ZERO_CHECK(old.optimizer != "Adafactor" || tensors == old.grid.tensor,
             fmt::format("reshard: '{}' holds Adafactor's state, whose row and column statistics belong to whole "
                         "matrices and cannot be cut from the grid {} for TP {} (Adafactor runs at TP 1 only)",
                         dir, old.grid.describe(), tensors));
  ckpt::ModelReader whole(dir);
  const int world = nm.world, moments = old.moments;
  const ckpt::GridMeta grid{tensors, parts};
  const std::string text = fmt::format("{} x DP {}", grid.describe(), world);
  nm.grid = grid.split() ? grid : ckpt::GridMeta{};
  nm.positions.clear();
  nm.units.clear();
  nm.shards.clear();
  std::uint64_t total = 0, done = 0;
  std::vector<Layout> layouts;
  for (int p = 0; p < parts; ++p)
    for (int t = 0; t < tensors; ++t) {
      // The saved part's units (the pipeline is kept), or the whole model's (cut to one part).
      const std::vector<ckpt::UnitMeta> units =
          parts == old.grid.pipeline ? ckpt::Reader(dir, old, 0, p).meta().units : whole.meta().units;
      layouts.push_back(part_layout(whole, units, tensors));
      for (int i = 0; i < layouts.back().num_units(); ++i)
        total += static_cast<std::uint64_t>(layouts.back().unit(i).numel) * static_cast<std::uint64_t>(1 + moments) *
                 sizeof(float);
    }
  for (int p = 0; p < parts; ++p)
    for (int t = 0; t < tensors; ++t) {
      const Layout& layout = layouts[static_cast<std::size_t>(t + tensors * p)];
      ckpt::PositionMeta pos{t, p, {}, {}};
      for (int i = 0; i < layout.num_units(); ++i)
        pos.units.push_back(ckpt::unit_meta(layout.unit(i), layout.slice_numel(i, world)));
      pos.shards = write_position(
          tmp, pos.units, nm, moments, t, p,
          [&](int i, std::int64_t begin, std::int64_t len, std::span<float* const> out) {
            whole.read_part(layout.unit(i), t, tensors, begin, len, out, text);
          },
          done,
          [&](std::uint64_t d) {
            if (progress) progress(d, total);
          });
      place_position(nm, std::move(pos));
    }
}

}  // namespace

void reshard_checkpoint(const std::string& path, const std::string& out_root, int world, int stage,
                        const std::string& tag, int tensor, int pipeline,
                        const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  ZERO_CHECK(world >= 1 && world <= (1 << 20), fmt::format("reshard: --world {} must be in [1, 2^20]", world));
  ZERO_CHECK(stage >= -1 && stage <= 3, fmt::format("reshard: --stage {} must be 0, 1, 2 or 3", stage));
  ZERO_CHECK(tensor == -1 || (tensor >= 1 && tensor < (1 << 16)),
             fmt::format("reshard: --tp {} must be in [1, 65535]", tensor));
  const std::string dir = ckpt::resolve(path, tag);
  const ckpt::Metadata old = ckpt::read_metadata_file(dir + "/" + ckpt::kMetadataFile);
  const int tensors = tensor < 0 ? old.grid.tensor : tensor, parts = pipeline < 0 ? old.grid.pipeline : pipeline;
  ZERO_CHECK(
      parts == old.grid.pipeline || parts == 1,
      fmt::format("reshard: --pp {}: '{}' was saved on the grid {}; the offline tool keeps the pipeline "
                  "size or makes it 1 (how a model cuts its pipeline parts is the model's). Resume the job at PP {} "
                  "directly: a load onto another grid cuts the pipeline parts itself",
                  pipeline, dir, old.grid.describe(), pipeline));
  ckpt::Metadata nm = old;
  nm.world = world;
  nm.stage = stage < 0 ? old.stage : stage;
  // Per-rank state (PowerSGD's error buffers and Q) has no meaning at another slicing: dropped.
  nm.rank_state_kind.clear();
  nm.rank_state_layout.clear();
  nm.rank_state.clear();

  // An offline tool never rolls a root back: into a root with newer steps it refuses.
  std::string tmp = ckpt::prepare(out_root, old.step, "reshard", /*refuse_older=*/true);
  try {
    if (tensors != old.grid.tensor || parts != old.grid.pipeline) {
      reshard_grid(dir, old, tmp, nm, tensors, parts, progress);
    } else {
      // Each grid position (or the one shard set without a grid) is cut anew for `world`
      // data-parallel ranks; the grid stays as it was.
      for (int p = 0; p < old.grid.pipeline; ++p)
        for (int t = 0; t < old.grid.tensor; ++t) {
          ckpt::Reader r(dir, old, t, p);
          ckpt::PositionMeta pos{t, p, r.meta().units, {}};
          // The new slicing is the engine's: rebuild the layout and ask it.
          Layout layout;
          for (const auto& u : pos.units) {
            std::vector<std::pair<std::string, Layout::Shape>> ps;
            for (const auto& q : u.params) ps.emplace_back(q.name, q.shape);
            layout.add_unit(u.name, std::move(ps));
          }
          for (std::size_t i = 0; i < pos.units.size(); ++i)
            pos.units[i].slice = layout.slice_numel(static_cast<int>(i), world);
          // Memory: one new slice plus the old section being cut, never a whole unit.
          std::uint64_t done = 0;
          pos.shards = write_position(tmp, pos.units, nm, old.moments, t, p,
                                      [&](int i, std::int64_t begin, std::int64_t len, std::span<float* const> out) {
                                        r.read_range(i, begin, len, out);
                                      },
                                      done, {});
          place_position(nm, std::move(pos));
        }
    }
    ckpt::write_metadata_file(tmp + "/" + ckpt::kMetadataFile, nm);
    ckpt::commit(out_root, tmp, old.step, 0, [](const char*) {});
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace zero
