// The offline side of checkpoints: listing, inspection and safetensors export (resharding is in
// reshard.cpp). None of it needs MPI or an engine; the zero-ckpt tool is a command line over these.
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
  if (!m.tensor_records.empty()) {  // OneBitLamb's: the same at every world size and stage
    out << "  optimizer values per parameter:";
    for (const auto& [name, values] : m.tensor_records)
      out << " " << escape_bytes(name) << (values.empty() ? " (not set yet)" : "");
    out << "\n";
  }
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

}  // namespace zero
