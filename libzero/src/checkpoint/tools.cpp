// The offline side of checkpoints: listing, inspection, safetensors export and resharding.
// None of it needs MPI or an engine; the zero-ckpt tool is a command line over these.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/format.hpp"
#include "checkpoint/safetensors.hpp"
#include "runtime/strings.hpp"
#include "zero/checkpoint.hpp"
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

// A client-state value: short text quoted, anything else by its size.
std::string client_value_text(const std::string& v) {
  bool text = std::all_of(v.begin(), v.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
  return text && v.size() <= 64 ? fmt::format("\"{}\"", v) : fmt::format("<{} bytes>", v.size());
}

// One step directory: summary, then every file verified. Returns false on any failure.
bool inspect_one(const std::string& dir, std::ostream& out, bool show_config) {
  std::unique_ptr<ckpt::Reader> r;
  try {
    r = std::make_unique<ckpt::Reader>(dir);
  } catch (const std::exception& e) {
    out << "  FAILED: " << e.what() << "\n";
    return false;
  }
  const ckpt::Metadata& m = r->meta();
  std::int64_t params = 0;
  for (const auto& u : m.units) params += u.numel;
  out << "  step " << m.step << " (applied updates " << m.applied << "), saved by " << m.world << " rank(s) at stage "
      << m.stage << "\n";
  out << "  compute dtype " << dtype_name(m.compute_dtype) << " (params not stored: rounded from the fp32 master), "
      << "optimizer " << m.optimizer << " (" << m.moments << " moment(s))\n";
  out << "  loss scaler: " << (m.scaler_dynamic ? "dynamic" : "static") << ", scale " << m.scaler.scale
      << ", hysteresis left " << m.scaler.hysteresis_left << ", iter " << m.scaler.iter << ", last overflow "
      << m.scaler.last_overflow_iter << "; scheduler " << escape_bytes(m.scheduler) << " at step " << m.scheduler_step << "\n";
  out << "  client state:";
  if (m.client.empty()) out << " (empty)";
  for (const auto& [k, v] : m.client) out << "\n    " << escape_bytes(k) << " = " << client_value_text(v);
  out << "\n  " << m.units.size() << " units, " << params << " parameters:\n";
  for (const auto& u : m.units) {
    out << "    " << escape_bytes(u.name) << ": " << u.numel << " elements, slice " << u.slice << ", padding "
        << (u.slice * m.world - u.numel) << "\n";
    for (const auto& p : u.params)
      out << "      " << escape_bytes(p.name) << " " << shape_text(p.shape) << " fp32 offset " << p.offset << "\n";
  }
  bool ok = true;
  std::uint64_t total = 0;
  std::error_code ec;
  auto meta_bytes = fs::file_size(fs::path(dir) / ckpt::kMetadataFile, ec);
  out << "  files:\n    " << ckpt::kMetadataFile << "  " << meta_bytes << " bytes  checksum ok\n";
  total += meta_bytes;
  for (int k = 0; k < m.world; ++k) {
    const auto& s = m.shards[static_cast<std::size_t>(k)];
    out << "    " << s.file << "  " << s.bytes << " bytes  ";
    try {
      r->verify_shard(k);
      out << "checksums ok\n";
    } catch (const std::exception& e) {
      out << "FAILED: " << e.what() << "\n";
      ok = false;
    }
    total += s.bytes;
  }
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

void export_safetensors(const std::string& path, const std::string& out_file, DType dtype, const std::string& tag) {
  ckpt::Reader r(ckpt::resolve(path, tag));
  const ckpt::Metadata& m = r.meta();
  std::vector<safetensors::TensorSpec> tensors;
  for (const auto& u : m.units)
    for (const auto& p : u.params) tensors.push_back({p.name, dtype, p.shape});
  std::map<std::string, std::string> meta = {
      {"format", "pt"},  // what Hugging Face loaders look for
      {"libzero.step", fmt::format("{}", m.step)},
      {"libzero.source", "fp32 master weights" + std::string(dtype == DType::f32 ? "" : ", rounded to nearest even")},
  };
  safetensors::Writer w(out_file, std::move(tensors), meta);
  std::vector<float> master;
  std::vector<std::uint16_t> half;
  for (std::size_t i = 0; i < m.units.size(); ++i) {
    const auto& u = m.units[i];
    master.resize(static_cast<std::size_t>(u.numel));
    r.read_range(static_cast<int>(i), 0, u.numel, master.data(), nullptr, nullptr);
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

void reshard_checkpoint(const std::string& path, const std::string& out_root, int world, int stage,
                        const std::string& tag) {
  ZERO_CHECK(world >= 1 && world <= (1 << 20), fmt::format("reshard: --world {} must be in [1, 2^20]", world));
  ZERO_CHECK(stage >= -1 && stage <= 3, fmt::format("reshard: --stage {} must be 0, 1, 2 or 3", stage));
  ckpt::Reader r(ckpt::resolve(path, tag));
  const ckpt::Metadata& old = r.meta();
  // The new slicing is the engine's: rebuild the layout and ask it.
  Layout layout;
  for (const auto& u : old.units) {
    std::vector<std::pair<std::string, Layout::Shape>> ps;
    for (const auto& p : u.params) ps.emplace_back(p.name, p.shape);
    layout.add_unit(u.name, std::move(ps));
  }
  ckpt::Metadata nm = old;
  nm.world = world;
  nm.stage = stage < 0 ? old.stage : stage;
  nm.shards.assign(static_cast<std::size_t>(world), {});
  // Per-rank state (PowerSGD's error buffers and Q) has no meaning at another slicing: dropped.
  nm.rank_state_kind.clear();
  nm.rank_state.clear();
  for (std::size_t i = 0; i < nm.units.size(); ++i) nm.units[i].slice = layout.slice_numel(static_cast<int>(i), world);

  // An offline tool never rolls a root back: into a root with newer steps it refuses.
  std::string tmp = ckpt::prepare(out_root, old.step, "reshard", /*refuse_older=*/true);
  try {
    // One new shard at a time, one unit at a time: memory is one new slice plus the old
    // section being cut, never a whole unit.
    std::vector<float> section;
    const int moments = old.moments;
    for (int k = 0; k < world; ++k) {
      std::vector<ckpt::ShardWriter::Range> ranges;
      for (const auto& u : nm.units) {
        std::int64_t b = std::min(static_cast<std::int64_t>(k) * u.slice, u.numel);
        ranges.push_back({b, std::min(b + u.slice, u.numel) - b});
      }
      ckpt::ShardWriter w(tmp + "/" + ckpt::shard_file_name(k), k, world, nm.stage, moments, old.step, ranges);
      for (std::size_t i = 0; i < nm.units.size(); ++i) {
        const auto len = ranges[i].len;
        section.resize(static_cast<std::size_t>(len) * static_cast<std::size_t>(1 + moments));
        r.read_range(static_cast<int>(i), ranges[i].begin, len, section.data(), section.data() + len,
                     moments >= 2 ? section.data() + 2 * len : nullptr);
        w.add_section(section.data());
      }
      nm.shards[static_cast<std::size_t>(k)] = w.finish();
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
