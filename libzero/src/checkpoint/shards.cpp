// Checkpoint shards: the writer (sections in unit order, then index and header) and the reader
// that checks every shard against the metadata on open and every section when it is read.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "checkpoint/format.hpp"
#include "checkpoint/json.hpp"
#include "zero/error.hpp"

namespace zero::ckpt {

using namespace detail;
namespace fs = std::filesystem;

namespace {
// The index: rank, world size, stage, units, moments (u32 each at 0..16), the grid position
// (format 3: tensor u16 at 20, pipeline u16 at 22; format 2: zero), the step (u64 at 24), then
// per unit its range, section offset and checksum.
constexpr std::uint64_t kShardIndexHead = 32;
constexpr std::uint64_t kShardIndexEntry = 32;
constexpr int kMaxGridCoord = 1 << 16;
constexpr std::uint64_t kMaxShardUnits = 1u << 24;  // as many as the metadata may list

// Refuses a shard whose index records another place than the one it was found in: data-parallel
// rank `rank` of grid position (tensor, pipeline), (0, 0) without a grid. A format 2 shard
// records its rank only (the position's word is zero there).
void check_place(const std::string& path, const std::string& index, std::uint32_t version, bool grid, int rank,
                 int tensor, int pipeline) {
  const auto* ix = reinterpret_cast<const unsigned char*>(index.data());
  const std::uint32_t rec_rank = get32(ix), word = get32(ix + 20);
  if (version < 3) {
    if (word != 0)
      file_fail(path, "index.reserved", fmt::format("= {}, expected 0 in a format {} shard", word, version));
    if (rec_rank != static_cast<std::uint32_t>(rank))
      file_fail(path, "index.rank",
                fmt::format("= {}, but the file lies in rank {}'s place: the shard was moved or swapped with another",
                            rec_rank, rank));
    return;
  }
  const int rt = static_cast<int>(word & 0xffffu), rp = static_cast<int>(word >> 16);
  if (rec_rank == static_cast<std::uint32_t>(rank) && rt == tensor && rp == pipeline) return;
  std::string own;  // the name it was written under, where that can be told
  if (rec_rank < (1u << 20)) {
    const int rr = static_cast<int>(rec_rank);
    own = fmt::format(" (it was written as {})",
                      grid || rt != 0 || rp != 0 ? shard_file_name(rr, rt, rp) : shard_file_name(rr));
  }
  ZERO_THROW(
      fmt::format("checkpoint file '{}': field '{}' records position (tensor {}, pipeline {}), data-parallel rank "
                  "{}, but the file was found in the place of position (tensor {}, pipeline {}), rank {}: the "
                  "shard was moved or swapped with another{}; put every shard back under the name it was "
                  "written as, or load an older checkpoint",
                  path, rt != tensor || rp != pipeline ? "index.position" : "index.rank", rt, rp, rec_rank, tensor,
                  pipeline, rank, own));
}
}  // namespace

std::uint64_t shard_file_bytes(std::size_t units, int moments, std::uint64_t elements) {
  return kHeaderBytes + kShardIndexHead + kShardIndexEntry * units +
         elements * static_cast<std::uint64_t>(1 + moments) * sizeof(float);
}

ShardWriter::ShardWriter(const std::string& path, int rank, int world, int stage, int moments, std::int64_t step,
                         std::vector<Range> ranges, int tensor, int pipeline)
    : path_(path),
      rank_(rank),
      world_(world),
      stage_(stage),
      moments_(moments),
      tensor_(tensor),
      pipeline_(pipeline),
      step_(step),
      ranges_(std::move(ranges)) {
  ZERO_CHECK(
      tensor >= 0 && tensor < kMaxGridCoord && pipeline >= 0 && pipeline < kMaxGridCoord,
      fmt::format("checkpoint: grid position (tensor {}, pipeline {}) of '{}' does not fit the shard index (each "
                  "coordinate below {})",
                  tensor, pipeline, path, kMaxGridCoord));
  fd_ = Fd::create(path);
  index_bytes_ = kShardIndexHead + kShardIndexEntry * ranges_.size();
  offset_ = index_bytes_;
}

void ShardWriter::add_section(const float* section) {
  ZERO_CHECK(next_ < static_cast<int>(ranges_.size()),
             fmt::format("ShardWriter: more sections than units for '{}'", path_));
  const Range& r = ranges_[static_cast<std::size_t>(next_)];
  std::size_t bytes = static_cast<std::size_t>(r.len) * static_cast<std::size_t>(1 + moments_) * sizeof(float);
  sums_.push_back(checksum(section, bytes));
  fd_.pwrite_all(section, bytes, kHeaderBytes + offset_);
  offset_ += bytes;
  ++next_;
}

ShardMeta ShardWriter::finish() {
  ZERO_CHECK(next_ == static_cast<int>(ranges_.size()),
             fmt::format("ShardWriter: '{}' finished after {} of {} sections", path_, next_, ranges_.size()));
  std::vector<unsigned char> index(static_cast<std::size_t>(index_bytes_), 0);
  put32(index.data(), static_cast<std::uint32_t>(rank_));
  put32(index.data() + 4, static_cast<std::uint32_t>(world_));
  put32(index.data() + 8, static_cast<std::uint32_t>(stage_));
  put32(index.data() + 12, static_cast<std::uint32_t>(ranges_.size()));
  put32(index.data() + 16, static_cast<std::uint32_t>(moments_));
  put32(index.data() + 20, static_cast<std::uint32_t>(tensor_) | (static_cast<std::uint32_t>(pipeline_) << 16));
  put64(index.data() + 24, static_cast<std::uint64_t>(step_));
  std::uint64_t off = index_bytes_;
  for (std::size_t u = 0; u < ranges_.size(); ++u) {
    unsigned char* e = index.data() + kShardIndexHead + kShardIndexEntry * u;
    put64(e, static_cast<std::uint64_t>(ranges_[u].begin));
    put64(e + 8, static_cast<std::uint64_t>(ranges_[u].len));
    put64(e + 16, off);
    put64(e + 24, sums_[u]);
    off += static_cast<std::uint64_t>(ranges_[u].len) * static_cast<std::uint64_t>(1 + moments_) * sizeof(float);
  }
  FileHeader h;
  h.kind = FileKind::shard;
  h.payload_bytes = offset_;
  h.index_bytes = index_bytes_;
  h.index_checksum = checksum(index.data(), index.size());
  unsigned char head[kHeaderBytes];
  encode_header(h, head);
  fd_.pwrite_all(index.data(), index.size(), kHeaderBytes);
  fd_.pwrite_all(head, kHeaderBytes, 0);
  fd_.sync();
  fd_.close();
  return ShardMeta{fs::path(path_).filename().string(), kHeaderBytes + offset_, h.index_checksum};
}

// ---------------------------------------------------------------- reader

struct Reader::Shard {
  struct Section {
    std::int64_t begin = 0, len = 0;
    std::uint64_t offset = 0, checksum = 0;
  };
  Fd fd;
  std::vector<Section> sections;
};

Reader::~Reader() = default;

Reader::Reader(const std::string& step_dir, int tensor, int pipeline)
    : Reader(step_dir, read_metadata_file(step_dir + "/" + kMetadataFile), tensor, pipeline) {}

Reader::Reader(const std::string& step_dir, const Metadata& meta, int tensor, int pipeline)
    : dir_(step_dir), meta_(meta) {
  if (meta_.grid.split()) {
    const PositionMeta& pos = meta_.position(tensor, pipeline);
    meta_.units = pos.units;
    meta_.shards = pos.shards;
  } else {
    ZERO_CHECK(tensor == 0 && pipeline == 0,
               fmt::format("checkpoint '{}' was saved without a tensor/pipeline grid; it has no position ({}, {})",
                           dir_, tensor, pipeline));
  }
  // A step directory holds its own step: files copied from another step would resume a run at a
  // step its name, `latest` and keep_last pruning all disagree with.
  fs::path name = fs::path(dir_).lexically_normal();
  if (name.filename().empty()) name = name.parent_path();
  const std::int64_t named = parse_step_dir_name(name.filename().string());
  if (named >= 0 && named != meta_.step)
    file_fail(dir_ + "/" + kMetadataFile, "step",
              fmt::format("= {}, but the directory is {}: the files belong to another step", meta_.step,
                          step_dir_name(named)));
  const std::size_t nu = meta_.units.size();
  const std::uint64_t stride = static_cast<std::uint64_t>(1 + meta_.moments) * sizeof(float);
  for (int r = 0; r < meta_.world; ++r) {
    const ShardMeta& sm = meta_.shards[static_cast<std::size_t>(r)];
    auto s = std::make_unique<Shard>();
    s->fd = Fd::open_read(dir_ + "/" + sm.file);
    const std::string& p = s->fd.path();
    FileHeader h = read_header(s->fd, FileKind::shard);
    // Where the shard belongs comes first: a shard moved from another place (two positions'
    // files swapped, by hand or by a tool that then rewrote the metadata's records) is named
    // as such, not as a size or checksum that differs, and never loads as this place's part.
    std::string index;
    if (h.index_bytes >= kShardIndexHead && h.index_bytes <= h.payload_bytes &&
        h.index_bytes <= kShardIndexHead + kShardIndexEntry * kMaxShardUnits) {
      index = read_index(s->fd, h);
      check_place(p, index, h.version, meta_.grid.split(), r, tensor, pipeline);
    }
    if (meta_.format_version >= 3 && h.version < 3)
      file_fail(p, "header.format_version",
                fmt::format("= {} in a checkpoint of format {}: the shard comes from an older checkpoint", h.version,
                            meta_.format_version));
    if (kHeaderBytes + h.payload_bytes != sm.bytes)
      file_fail(p, "header.payload_bytes",
                fmt::format("gives a file of {} bytes, but the metadata recorded {}: the shard does not belong to "
                            "this checkpoint",
                            kHeaderBytes + h.payload_bytes, sm.bytes));
    if (h.index_bytes != kShardIndexHead + kShardIndexEntry * nu)
      file_fail(
          p, "header.index_bytes",
          fmt::format("= {}, expected {} for {} units", h.index_bytes, kShardIndexHead + kShardIndexEntry * nu, nu));
    if (h.index_checksum != sm.index_checksum)
      file_fail(p, "header.index_checksum",
                fmt::format("= {}, but the metadata recorded {}: the shard does not belong to this checkpoint",
                            json::hex64(h.index_checksum), json::hex64(sm.index_checksum)));
    if (index.empty()) index = read_index(s->fd, h);
    auto* ix = reinterpret_cast<const unsigned char*>(index.data());
    auto expect32 = [&](std::size_t at, std::uint32_t want, const char* field) {
      if (get32(ix + at) != want)
        file_fail(p, field, fmt::format("= {}, expected {} (from the metadata)", get32(ix + at), want));
    };
    expect32(4, static_cast<std::uint32_t>(meta_.world), "index.world_size");
    expect32(8, static_cast<std::uint32_t>(meta_.stage), "index.stage");
    expect32(12, static_cast<std::uint32_t>(nu), "index.num_units");
    expect32(16, static_cast<std::uint32_t>(meta_.moments), "index.moments");
    if (get64(ix + 24) != static_cast<std::uint64_t>(meta_.step))
      file_fail(p, "index.step", fmt::format("= {}, but the metadata is for step {}", get64(ix + 24), meta_.step));
    std::uint64_t off = h.index_bytes;
    for (std::size_t u = 0; u < nu; ++u) {
      const unsigned char* e = ix + kShardIndexHead + kShardIndexEntry * u;
      std::string field = fmt::format("index.units[{}]", u);
      Shard::Section sec;
      std::uint64_t b = get64(e), l = get64(e + 8);
      const auto numel = static_cast<std::uint64_t>(meta_.units[u].numel);
      if (b > numel || l > numel - b)
        file_fail(p, field + ".range",
                  fmt::format("[{}, +{}) lies outside unit '{}' ({} elements)", b, l, meta_.units[u].name, numel));
      sec.begin = static_cast<std::int64_t>(b);
      sec.len = static_cast<std::int64_t>(l);
      sec.offset = get64(e + 16);
      sec.checksum = get64(e + 24);
      if (sec.offset != off)
        file_fail(p, field + ".offset",
                  fmt::format("= {}, expected {} (sections are stored back to back)", sec.offset, off));
      off += l * stride;
      if (off > h.payload_bytes)
        file_fail(p, field + ".offset",
                  fmt::format("runs past the end of the file (payload {} bytes)", h.payload_bytes));
      s->sections.push_back(sec);
    }
    if (off != h.payload_bytes)
      file_fail(p, "header.payload_bytes", fmt::format("= {}, but the sections end at {}", h.payload_bytes, off));
    shards_.push_back(std::move(s));
  }
  // The shards' ranges must tile each unit exactly: every element stored once.
  for (std::size_t u = 0; u < nu; ++u) {
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    for (const auto& s : shards_)
      if (s->sections[u].len > 0) ranges.emplace_back(s->sections[u].begin, s->sections[u].len);
    std::sort(ranges.begin(), ranges.end());
    std::int64_t at = 0;
    for (const auto& [b, l] : ranges) {
      if (b != at)
        ZERO_THROW(fmt::format("checkpoint '{}': field 'units[{}]' ('{}'): the shards {} at element {}; {}", dir_, u,
                               meta_.units[u].name, b < at ? "overlap" : "leave a gap", std::min(b, at), kDamaged));
      at = b + l;
    }
    if (at != meta_.units[u].numel)
      ZERO_THROW(fmt::format("checkpoint '{}': field 'units[{}]' ('{}'): the shards hold {} of {} elements; {}", dir_,
                             u, meta_.units[u].name, at, meta_.units[u].numel, kDamaged));
  }
}

void Reader::read_section(Shard& s, int unit, std::vector<float>& buf) {
  const auto& sec = s.sections[static_cast<std::size_t>(unit)];
  std::size_t n = static_cast<std::size_t>(sec.len) * static_cast<std::size_t>(1 + meta_.moments);
  buf.resize(n);
  s.fd.pread_all(buf.data(), n * sizeof(float), kHeaderBytes + sec.offset);
  std::uint64_t c = checksum(buf.data(), n * sizeof(float));
  if (c != sec.checksum)
    file_fail(s.fd.path(), fmt::format("index.units[{}].checksum", unit),
              fmt::format("(unit '{}') does not match its data (stored {}, computed {}): the section is corrupted",
                          meta_.units[static_cast<std::size_t>(unit)].name, json::hex64(sec.checksum), json::hex64(c)));
}

void Reader::read_runs(int unit, std::span<const Run> runs, std::span<float* const> out) {
  ZERO_CHECK(unit >= 0 && static_cast<std::size_t>(unit) < meta_.units.size(),
             fmt::format("checkpoint reader: bad request (unit {})", unit));
  ZERO_CHECK(out.size() <= static_cast<std::size_t>(1 + meta_.moments),
             fmt::format("checkpoint '{}' holds {} optimizer moment(s), not {}", dir_, meta_.moments, out.size() - 1));
  for (const Run& r : runs)
    ZERO_CHECK(r.from >= 0 && r.len >= 0 && r.to >= 0 && r.from <= kMaxElements && r.len <= kMaxElements,
               fmt::format("checkpoint reader: bad request (unit {}, range [{}, +{}))", unit, r.from, r.len));
  std::vector<float> buf;
  for (auto& s : shards_) {
    const auto& sec = s->sections[static_cast<std::size_t>(unit)];
    bool read = false;
    for (const Run& r : runs) {
      const std::int64_t lo = std::max(r.from, sec.begin), hi = std::min(r.from + r.len, sec.begin + sec.len);
      if (lo >= hi) continue;
      if (!read) read_section(*s, unit, buf);
      read = true;
      for (std::size_t k = 0; k < out.size(); ++k) {
        if (!out[k]) continue;
        const float* src = buf.data() + k * static_cast<std::size_t>(sec.len);
        std::copy(src + (lo - sec.begin), src + (hi - sec.begin), out[k] + r.to + (lo - r.from));
      }
    }
  }
}

void Reader::read_range(int unit, std::int64_t begin, std::int64_t len, std::span<float* const> out) {
  ZERO_CHECK(begin >= 0 && len >= 0 && begin <= kMaxElements && len <= kMaxElements,
             fmt::format("checkpoint reader: bad request (unit {}, range [{}, +{}))", unit, begin, len));
  for (float* o : out)
    if (o) std::fill(o, o + len, 0.0f);
  const Run r{begin, len, 0};
  read_runs(unit, {&r, 1}, out);
}

void Reader::verify_shard(int rank) {
  ZERO_CHECK(rank >= 0 && rank < meta_.world, fmt::format("checkpoint reader: no shard {}", rank));
  std::vector<float> buf;
  for (std::size_t u = 0; u < meta_.units.size(); ++u)
    read_section(*shards_[static_cast<std::size_t>(rank)], static_cast<int>(u), buf);
}

}  // namespace zero::ckpt
