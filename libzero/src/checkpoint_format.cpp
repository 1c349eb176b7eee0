// Checkpoint files: headers, metadata, shards, the checked reader, and the atomic commit.
#include "checkpoint_format.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "../../offload/src/checksum.hpp"
#include "checkpoint_json.hpp"
#include "zero/error.hpp"

static_assert(std::endian::native == std::endian::little,
              "checkpoint shards store floats in host order and the format is little-endian");

namespace zero::ckpt {

namespace fs = std::filesystem;

namespace {

// What to do about a file that fails a check.
const char* kDamaged =
    "the checkpoint is damaged or incomplete: load an older one (zero-ckpt inspect <root> lists and verifies them)";

[[noreturn]] void sys_fail(const std::string& what, const std::string& path, int err) {
  ZERO_THROW("checkpoint: cannot " + what + " '" + path + "': " + std::strerror(err) +
             "; check that the directory exists, is writable and has free space");
}

[[noreturn]] void file_fail(const std::string& path, const std::string& field, const std::string& problem) {
  ZERO_THROW("checkpoint file '" + path + "': field '" + field + "' " + problem + "; " + kDamaged);
}

void put32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint32_t get32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint64_t get64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

constexpr char kMagic[8] = {'Z', 'E', 'R', 'O', 'C', 'K', 'P', 'T'};
constexpr std::uint64_t kShardIndexHead = 32;
constexpr std::uint64_t kShardIndexEntry = 32;
constexpr std::uint64_t kMaxMetadataBytes = 1ull << 30;
constexpr std::int64_t kMaxElements = std::int64_t{1} << 50;

const char* kind_name(FileKind k) { return k == FileKind::metadata ? "metadata" : "shard"; }

}  // namespace

std::uint64_t checksum(const void* data, std::size_t bytes) {
  return offload::detail::checksum64(data, bytes);
}

std::string shard_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard_%05d.ckpt", rank);
  return buf;
}

std::string step_dir_name(std::int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::int64_t parse_step_dir_name(const std::string& name) {
  if (name.size() < 13 || name.size() > 23 || name.compare(0, 5, "step_") != 0) return -1;
  std::int64_t v = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return step_dir_name(v) == name ? v : -1;  // one spelling per step
}

// ---------------------------------------------------------------- Fd

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

void Fd::close() {
  if (fd_ < 0) return;
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) sys_fail("close", path_, errno);
}

Fd Fd::open_read(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    ZERO_THROW("checkpoint file '" + path + "': cannot open: " + std::strerror(err) +
               (err == ENOENT ? std::string("; ") + kDamaged : std::string("; check its permissions")));
  }
  return Fd(fd, path);
}

Fd Fd::create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) sys_fail("create", path, errno);
  return Fd(fd, path);
}

std::uint64_t Fd::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) sys_fail("stat", path_, errno);
  return static_cast<std::uint64_t>(st.st_size);
}

void Fd::pwrite_all(const void* data, std::size_t bytes, std::uint64_t offset) const {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd_, p, std::min<std::size_t>(bytes, 1u << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      sys_fail("write", path_, errno);
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
}

void Fd::pread_all(void* data, std::size_t bytes, std::uint64_t offset) const {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pread(fd_, p, std::min<std::size_t>(bytes, 1u << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      sys_fail("read", path_, errno);
    }
    if (n == 0)
      ZERO_THROW("checkpoint file '" + path_ + "': ends at byte " + std::to_string(offset) +
                 " while reading; the file is truncated; " + kDamaged);
    p += n;
    bytes -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
}

void Fd::sync() const {
  if (::fsync(fd_) != 0) sys_fail("fsync", path_, errno);
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) sys_fail("open the directory", dir, errno);
  Fd f(fd, dir);
  // Some filesystems cannot sync a directory (EINVAL); they also give no stronger guarantee.
  if (::fsync(fd) != 0 && errno != EINVAL) sys_fail("fsync the directory", dir, errno);
}

void write_file_atomic(const std::string& dir, const std::string& name, const std::string& content) {
  std::string tmp = dir + "/." + name + ".tmp";
  std::string dst = dir + "/" + name;
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) sys_fail("remove the stale", tmp, errno);
  Fd f = Fd::create(tmp);
  f.pwrite_all(content.data(), content.size(), 0);
  f.sync();
  f.close();
  if (::rename(tmp.c_str(), dst.c_str()) != 0) sys_fail("rename " + tmp + " to", dst, errno);
  fsync_dir(dir);
}

// ---------------------------------------------------------------- header

void encode_header(const FileHeader& h, unsigned char out[kHeaderBytes]) {
  std::memset(out, 0, kHeaderBytes);
  std::memcpy(out, kMagic, 8);
  put32(out + 8, kFormatVersion);
  put32(out + 12, static_cast<std::uint32_t>(h.kind));
  put64(out + 16, h.payload_bytes);
  put64(out + 24, h.index_bytes);
  put64(out + 32, h.index_checksum);
  put64(out + 56, checksum(out, 56));
}

FileHeader read_header(const Fd& f, FileKind expect) {
  const std::string& p = f.path();
  std::uint64_t size = f.size();
  if (size < kHeaderBytes)
    file_fail(p, "header", "is truncated: the file has " + std::to_string(size) + " bytes, less than the " +
                               std::to_string(kHeaderBytes) + "-byte header");
  unsigned char h[kHeaderBytes];
  f.pread_all(h, kHeaderBytes, 0);
  if (std::memcmp(h, kMagic, 8) != 0) file_fail(p, "header.magic", "is not \"ZEROCKPT\": this is not a libzero checkpoint file");
  std::uint64_t stored = get64(h + 56), computed = checksum(h, 56);
  if (stored != computed)
    file_fail(p, "header.checksum", "does not match (stored " + json::hex64(stored) + ", computed " +
                                        json::hex64(computed) + "): the header is corrupted");
  std::uint32_t version = get32(h + 8);
  if (version != kFormatVersion)
    ZERO_THROW("checkpoint file '" + p + "': field 'header.format_version' = " + std::to_string(version) +
               ", but this build reads version " + std::to_string(kFormatVersion) +
               "; load it with the libzero version that wrote it");
  std::uint32_t kind = get32(h + 12);
  if (kind != static_cast<std::uint32_t>(expect))
    file_fail(p, "header.kind", "= " + std::to_string(kind) + ", expected " +
                                    std::to_string(static_cast<std::uint32_t>(expect)) + " (" + kind_name(expect) +
                                    "): the file is in the wrong place");
  for (int i = 40; i < 56; ++i)
    if (h[i] != 0) file_fail(p, "header.reserved", "is not zero");
  FileHeader r;
  r.kind = expect;
  r.payload_bytes = get64(h + 16);
  r.index_bytes = get64(h + 24);
  r.index_checksum = get64(h + 32);
  if (r.payload_bytes != size - kHeaderBytes)
    file_fail(p, "header.payload_bytes", "says the file has " + std::to_string(r.payload_bytes) +
                                             " payload bytes after the header, but it has " +
                                             std::to_string(size - kHeaderBytes) + ": the file is truncated or extended");
  if (r.index_bytes > r.payload_bytes)
    file_fail(p, "header.index_bytes", "= " + std::to_string(r.index_bytes) + " exceeds the payload (" +
                                           std::to_string(r.payload_bytes) + " bytes)");
  return r;
}

// Reads a file's index and checks it against the header's checksum.
static std::string read_index(const Fd& f, const FileHeader& h) {
  std::string index(static_cast<std::size_t>(h.index_bytes), '\0');
  f.pread_all(index.data(), index.size(), kHeaderBytes);
  std::uint64_t c = checksum(index.data(), index.size());
  if (c != h.index_checksum)
    file_fail(f.path(), "header.index_checksum", "does not match the " + std::string(kind_name(h.kind)) +
                                                     " index (stored " + json::hex64(h.index_checksum) + ", computed " +
                                                     json::hex64(c) + "): the file is corrupted");
  return index;
}

// ---------------------------------------------------------------- metadata

namespace {

const char* kMetaHint = "the metadata is damaged or was not written by libzero; load an older checkpoint";

DType dtype_from(const json::Field& f) {
  const std::string& s = f.str();
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    if (s == dtype_name(t)) return t;
  f.fail("= \"" + s + "\" is not one of fp32, bf16, fp16");
}

}  // namespace

std::string Metadata::to_json() const {
  using json::Value;
  Value d = Value::object();
  d.set("format", Value::string("libzero-checkpoint"));
  d.set("format_version", Value::integer(kFormatVersion));
  d.set("step", Value::integer(step));
  d.set("applied_steps", Value::integer(applied));
  d.set("world_size", Value::integer(world));
  d.set("stage", Value::integer(stage));
  d.set("compute_dtype", Value::string(std::string(dtype_name(compute_dtype))));
  d.set("master_dtype", Value::string("fp32"));
  d.set("optimizer", Value::string(optimizer));
  d.set("optimizer_moments", Value::integer(moments));
  Value cp = Value::object();
  cp.set("stored", Value::boolean(false));
  cp.set("derivation", Value::string("round-to-nearest-even of the fp32 master to compute_dtype"));
  d.set("compute_params", std::move(cp));
  Value ls = Value::object();
  ls.set("dynamic", Value::boolean(scaler_dynamic));
  ls.set("scale", Value::number(scaler.scale));
  ls.set("hysteresis_left", Value::integer(scaler.hysteresis_left));
  ls.set("iter", Value::integer(scaler.iter));
  ls.set("last_overflow_iter", Value::integer(scaler.last_overflow_iter));
  d.set("loss_scaler", std::move(ls));
  Value sc = Value::object();
  sc.set("type", Value::string(scheduler));
  sc.set("step", Value::integer(scheduler_step));
  d.set("scheduler", std::move(sc));
  Value us = Value::array();
  for (const auto& u : units) {
    Value uv = Value::object();
    uv.set("name", Value::string(u.name));
    uv.set("numel", Value::integer(u.numel));
    uv.set("slice", Value::integer(u.slice));
    uv.set("padded", Value::integer(u.slice * world));
    uv.set("padding", Value::integer(u.slice * world - u.numel));
    Value ps = Value::array();
    for (const auto& p : u.params) {
      Value pv = Value::object();
      pv.set("name", Value::string(p.name));
      Value shape = Value::array();
      for (auto s : p.shape) shape.push(Value::integer(s));
      pv.set("shape", std::move(shape));
      pv.set("dtype", Value::string("fp32"));
      pv.set("numel", Value::integer(p.numel));
      pv.set("offset", Value::integer(p.offset));
      ps.push(std::move(pv));
    }
    uv.set("params", std::move(ps));
    us.push(std::move(uv));
  }
  d.set("units", std::move(us));
  Value ss = Value::array();
  for (std::size_t r = 0; r < shards.size(); ++r) {
    Value sv = Value::object();
    sv.set("rank", Value::integer(static_cast<std::int64_t>(r)));
    sv.set("file", Value::string(shards[r].file));
    sv.set("bytes", Value::integer(static_cast<std::int64_t>(shards[r].bytes)));
    sv.set("index_checksum", Value::string(json::hex64(shards[r].index_checksum)));
    ss.push(std::move(sv));
  }
  d.set("shards", std::move(ss));
  Value cs = Value::object();
  for (const auto& [k, v] : client) cs.set(k, Value::string(v));
  d.set("client_state", std::move(cs));
  d.set("config_yaml", Value::string(config_yaml));
  return json::dump(d);
}

Metadata Metadata::parse(const std::string& text, const std::string& origin) {
  json::Value doc = json::parse(text, origin);
  json::Field d(doc, origin, "", kMetaHint);
  d.expect_keys({"format", "format_version", "step", "applied_steps", "world_size", "stage", "compute_dtype",
                 "master_dtype", "optimizer", "optimizer_moments", "compute_params", "loss_scaler", "scheduler",
                 "units", "shards", "client_state", "config_yaml"});
  Metadata m;
  if (d.at("format").str() != "libzero-checkpoint") d.at("format").fail("is not \"libzero-checkpoint\"");
  if (d.at("format_version").i64() != kFormatVersion)
    d.at("format_version").fail("is not " + std::to_string(kFormatVersion) + " (this build's format)");
  m.step = d.at("step").i64(0);
  m.applied = d.at("applied_steps").i64(0, m.step);
  m.world = static_cast<int>(d.at("world_size").i64(1, 1 << 20));
  m.stage = static_cast<int>(d.at("stage").i64(0, 3));
  m.compute_dtype = dtype_from(d.at("compute_dtype"));
  if (d.at("master_dtype").str() != "fp32") d.at("master_dtype").fail("must be \"fp32\"");
  m.optimizer = d.at("optimizer").str();
  int need = m.optimizer == "sgd" ? 1 : 2;
  if (m.optimizer != "adamw" && m.optimizer != "adam" && m.optimizer != "sgd")
    d.at("optimizer").fail("= \"" + m.optimizer + "\" is not one of adamw, adam, sgd");
  m.moments = static_cast<int>(d.at("optimizer_moments").i64(need, need));

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
  m.scaler.iter = ls.at("iter").i64(0);
  m.scaler.last_overflow_iter = ls.at("last_overflow_iter").i64(-1, m.scaler.iter);

  json::Field sc = d.at("scheduler");
  sc.expect_keys({"type", "step"});
  m.scheduler = sc.at("type").str();
  m.scheduler_step = sc.at("step").i64(m.applied, m.applied);

  json::Field us = d.at("units");
  if (us.size() == 0 || us.size() > (1u << 24)) us.fail("must list between 1 and 2^24 units");
  for (std::size_t i = 0; i < us.size(); ++i) {
    json::Field uf = us[i];
    uf.expect_keys({"name", "numel", "slice", "padded", "padding", "params"});
    UnitMeta u;
    u.name = uf.at("name").str();
    if (u.name.empty()) uf.at("name").fail("is empty");
    for (const auto& prev : m.units)
      if (prev.name == u.name) uf.at("name").fail("= \"" + u.name + "\" repeats an earlier unit's name");
    u.numel = uf.at("numel").i64(1, kMaxElements);
    u.slice = uf.at("slice").i64(0, kMaxElements / m.world);
    if (u.slice * m.world < u.numel)
      uf.at("slice").fail("x world_size is smaller than numel (" + std::to_string(u.numel) + ")");
    uf.at("padded").i64(u.slice * m.world, u.slice * m.world);
    uf.at("padding").i64(u.slice * m.world - u.numel, u.slice * m.world - u.numel);
    json::Field ps = uf.at("params");
    if (ps.size() == 0) ps.fail("is empty");
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < ps.size(); ++k) {
      json::Field pf = ps[k];
      pf.expect_keys({"name", "shape", "dtype", "numel", "offset"});
      ParamMeta p;
      p.name = pf.at("name").str();
      if (p.name.empty()) pf.at("name").fail("is empty");
      for (const auto& prev : u.params)
        if (prev.name == p.name) pf.at("name").fail("= \"" + p.name + "\" repeats an earlier parameter's name");
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
      offset += n;
      if (offset > u.numel) pf.at("numel").fail("runs past the unit's numel (" + std::to_string(u.numel) + ")");
      u.params.push_back(std::move(p));
    }
    if (offset != u.numel)
      uf.at("numel").fail("= " + std::to_string(u.numel) + " but the parameters hold " + std::to_string(offset));
    m.units.push_back(std::move(u));
  }

  json::Field ss = d.at("shards");
  if (ss.size() != static_cast<std::size_t>(m.world))
    ss.fail("lists " + std::to_string(ss.size()) + " shards for world_size " + std::to_string(m.world));
  for (std::size_t r = 0; r < ss.size(); ++r) {
    json::Field sf = ss[r];
    sf.expect_keys({"rank", "file", "bytes", "index_checksum"});
    sf.at("rank").i64(static_cast<std::int64_t>(r), static_cast<std::int64_t>(r));
    ShardMeta s;
    s.file = sf.at("file").str();
    // Only the canonical name: a path in here must never lead the reader outside the checkpoint.
    if (s.file != shard_file_name(static_cast<int>(r)))
      sf.at("file").fail("= \"" + s.file + "\", expected \"" + shard_file_name(static_cast<int>(r)) + "\"");
    s.bytes = static_cast<std::uint64_t>(sf.at("bytes").i64(kHeaderBytes));
    s.index_checksum = sf.at("index_checksum").hex64();
    m.shards.push_back(std::move(s));
  }

  json::Field cs = d.at("client_state");
  for (const auto& [k, v] : cs.members()) {
    json::Field vf(v, origin, "client_state." + k, kMetaHint);
    m.client[k] = vf.str();
  }
  m.config_yaml = d.at("config_yaml").str();
  return m;
}

void write_metadata_file(const std::string& path, const Metadata& m) {
  std::string payload = m.to_json();
  FileHeader h;
  h.kind = FileKind::metadata;
  h.payload_bytes = h.index_bytes = payload.size();
  h.index_checksum = checksum(payload.data(), payload.size());
  unsigned char head[kHeaderBytes];
  encode_header(h, head);
  Fd f = Fd::create(path);
  f.pwrite_all(head, kHeaderBytes, 0);
  f.pwrite_all(payload.data(), payload.size(), kHeaderBytes);
  f.sync();
  f.close();
}

Metadata read_metadata_file(const std::string& path) {
  Fd f = Fd::open_read(path);
  FileHeader h = read_header(f, FileKind::metadata);
  if (h.index_bytes != h.payload_bytes)
    file_fail(path, "header.index_bytes", "must equal payload_bytes in a metadata file");
  if (h.payload_bytes > kMaxMetadataBytes) file_fail(path, "header.payload_bytes", "is larger than 1 GiB");
  return Metadata::parse(read_index(f, h), path);
}

// ---------------------------------------------------------------- shard writer

ShardWriter::ShardWriter(const std::string& path, int rank, int world, int stage, int moments, std::int64_t step,
                         std::vector<Range> ranges)
    : fd_(Fd::create(path)),
      path_(path),
      rank_(rank),
      world_(world),
      stage_(stage),
      moments_(moments),
      step_(step),
      ranges_(std::move(ranges)) {
  index_bytes_ = kShardIndexHead + kShardIndexEntry * ranges_.size();
  offset_ = index_bytes_;
}

void ShardWriter::add_section(const float* section) {
  ZERO_CHECK(next_ < static_cast<int>(ranges_.size()), "ShardWriter: more sections than units for '" + path_ + "'");
  const Range& r = ranges_[static_cast<std::size_t>(next_)];
  std::size_t bytes = static_cast<std::size_t>(r.len) * static_cast<std::size_t>(1 + moments_) * sizeof(float);
  sums_.push_back(checksum(section, bytes));
  fd_.pwrite_all(section, bytes, kHeaderBytes + offset_);
  offset_ += bytes;
  ++next_;
}

ShardMeta ShardWriter::finish() {
  ZERO_CHECK(next_ == static_cast<int>(ranges_.size()),
             "ShardWriter: '" + path_ + "' finished after " + std::to_string(next_) + " of " +
                 std::to_string(ranges_.size()) + " sections");
  std::vector<unsigned char> index(static_cast<std::size_t>(index_bytes_), 0);
  put32(index.data(), static_cast<std::uint32_t>(rank_));
  put32(index.data() + 4, static_cast<std::uint32_t>(world_));
  put32(index.data() + 8, static_cast<std::uint32_t>(stage_));
  put32(index.data() + 12, static_cast<std::uint32_t>(ranges_.size()));
  put32(index.data() + 16, static_cast<std::uint32_t>(moments_));
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

Reader::Reader(const std::string& step_dir) : dir_(step_dir) {
  meta_ = read_metadata_file(dir_ + "/" + kMetadataFile);
  const std::size_t nu = meta_.units.size();
  const std::uint64_t stride = static_cast<std::uint64_t>(1 + meta_.moments) * sizeof(float);
  for (int r = 0; r < meta_.world; ++r) {
    const ShardMeta& sm = meta_.shards[static_cast<std::size_t>(r)];
    auto s = std::make_unique<Shard>();
    s->fd = Fd::open_read(dir_ + "/" + sm.file);
    const std::string& p = s->fd.path();
    FileHeader h = read_header(s->fd, FileKind::shard);
    if (kHeaderBytes + h.payload_bytes != sm.bytes)
      file_fail(p, "header.payload_bytes", "gives a file of " + std::to_string(kHeaderBytes + h.payload_bytes) +
                                               " bytes, but the metadata recorded " + std::to_string(sm.bytes) +
                                               ": the shard does not belong to this checkpoint");
    if (h.index_bytes != kShardIndexHead + kShardIndexEntry * nu)
      file_fail(p, "header.index_bytes", "= " + std::to_string(h.index_bytes) + ", expected " +
                                             std::to_string(kShardIndexHead + kShardIndexEntry * nu) + " for " +
                                             std::to_string(nu) + " units");
    if (h.index_checksum != sm.index_checksum)
      file_fail(p, "header.index_checksum", "= " + json::hex64(h.index_checksum) + ", but the metadata recorded " +
                                                json::hex64(sm.index_checksum) +
                                                ": the shard does not belong to this checkpoint");
    std::string index = read_index(s->fd, h);
    auto* ix = reinterpret_cast<const unsigned char*>(index.data());
    auto expect32 = [&](std::size_t at, std::uint32_t want, const char* field) {
      if (get32(ix + at) != want)
        file_fail(p, field, "= " + std::to_string(get32(ix + at)) + ", expected " + std::to_string(want) +
                                " (from the metadata)");
    };
    expect32(0, static_cast<std::uint32_t>(r), "index.rank");
    expect32(4, static_cast<std::uint32_t>(meta_.world), "index.world_size");
    expect32(8, static_cast<std::uint32_t>(meta_.stage), "index.stage");
    expect32(12, static_cast<std::uint32_t>(nu), "index.num_units");
    expect32(16, static_cast<std::uint32_t>(meta_.moments), "index.moments");
    expect32(20, 0, "index.reserved");
    if (get64(ix + 24) != static_cast<std::uint64_t>(meta_.step))
      file_fail(p, "index.step", "= " + std::to_string(get64(ix + 24)) + ", but the metadata is for step " +
                                     std::to_string(meta_.step));
    std::uint64_t off = h.index_bytes;
    for (std::size_t u = 0; u < nu; ++u) {
      const unsigned char* e = ix + kShardIndexHead + kShardIndexEntry * u;
      std::string field = "index.units[" + std::to_string(u) + "]";
      Shard::Section sec;
      std::uint64_t b = get64(e), l = get64(e + 8);
      const auto numel = static_cast<std::uint64_t>(meta_.units[u].numel);
      if (b > numel || l > numel - b)
        file_fail(p, field + ".range", "[" + std::to_string(b) + ", +" + std::to_string(l) +
                                           ") lies outside unit '" + meta_.units[u].name + "' (" +
                                           std::to_string(numel) + " elements)");
      sec.begin = static_cast<std::int64_t>(b);
      sec.len = static_cast<std::int64_t>(l);
      sec.offset = get64(e + 16);
      sec.checksum = get64(e + 24);
      if (sec.offset != off)
        file_fail(p, field + ".offset", "= " + std::to_string(sec.offset) + ", expected " + std::to_string(off) +
                                            " (sections are stored back to back)");
      off += l * stride;
      if (off > h.payload_bytes)
        file_fail(p, field + ".offset", "runs past the end of the file (payload " + std::to_string(h.payload_bytes) +
                                            " bytes)");
      s->sections.push_back(sec);
    }
    if (off != h.payload_bytes)
      file_fail(p, "header.payload_bytes", "= " + std::to_string(h.payload_bytes) + ", but the sections end at " +
                                               std::to_string(off));
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
        ZERO_THROW("checkpoint '" + dir_ + "': field 'units[" + std::to_string(u) + "]' ('" + meta_.units[u].name +
                   "'): the shards " + (b < at ? "overlap" : "leave a gap") + " at element " + std::to_string(std::min(b, at)) +
                   "; " + kDamaged);
      at = b + l;
    }
    if (at != meta_.units[u].numel)
      ZERO_THROW("checkpoint '" + dir_ + "': field 'units[" + std::to_string(u) + "]' ('" + meta_.units[u].name +
                 "'): the shards hold " + std::to_string(at) + " of " + std::to_string(meta_.units[u].numel) +
                 " elements; " + kDamaged);
  }
}

void Reader::read_section(Shard& s, int unit, std::vector<float>& buf) {
  const auto& sec = s.sections[static_cast<std::size_t>(unit)];
  std::size_t n = static_cast<std::size_t>(sec.len) * static_cast<std::size_t>(1 + meta_.moments);
  buf.resize(n);
  s.fd.pread_all(buf.data(), n * sizeof(float), kHeaderBytes + sec.offset);
  std::uint64_t c = checksum(buf.data(), n * sizeof(float));
  if (c != sec.checksum)
    file_fail(s.fd.path(), "index.units[" + std::to_string(unit) + "].checksum",
              "(unit '" + meta_.units[static_cast<std::size_t>(unit)].name + "') does not match its data (stored " +
                  json::hex64(sec.checksum) + ", computed " + json::hex64(c) + "): the section is corrupted");
}

void Reader::read_range(int unit, std::int64_t begin, std::int64_t len, float* master, float* m1, float* m2) {
  ZERO_CHECK(unit >= 0 && static_cast<std::size_t>(unit) < meta_.units.size() && begin >= 0 && len >= 0 &&
                 begin <= kMaxElements && len <= kMaxElements,
             "checkpoint reader: bad request (unit " + std::to_string(unit) + ", range [" + std::to_string(begin) +
                 ", +" + std::to_string(len) + "))");
  ZERO_CHECK(m2 == nullptr || meta_.moments >= 2,
             "checkpoint '" + dir_ + "' holds " + std::to_string(meta_.moments) + " optimizer moment(s), not 2");
  float* out[3] = {master, m1, m2};
  for (float* o : out)
    if (o) std::fill(o, o + len, 0.0f);
  std::vector<float> buf;
  for (auto& s : shards_) {
    const auto& sec = s->sections[static_cast<std::size_t>(unit)];
    std::int64_t lo = std::max(begin, sec.begin), hi = std::min(begin + len, sec.begin + sec.len);
    if (lo >= hi) continue;
    read_section(*s, unit, buf);
    for (int k = 0; k <= meta_.moments && k < 3; ++k) {
      if (!out[k]) continue;
      const float* src = buf.data() + static_cast<std::size_t>(k) * static_cast<std::size_t>(sec.len);
      std::copy(src + (lo - sec.begin), src + (hi - sec.begin), out[k] + (lo - begin));
    }
  }
}

void Reader::verify_shard(int rank) {
  ZERO_CHECK(rank >= 0 && rank < meta_.world, "checkpoint reader: no shard " + std::to_string(rank));
  std::vector<float> buf;
  for (std::size_t u = 0; u < meta_.units.size(); ++u)
    read_section(*shards_[static_cast<std::size_t>(rank)], static_cast<int>(u), buf);
}

// ---------------------------------------------------------------- directories

std::string read_latest(const std::string& root) {
  std::string path = root + "/" + kLatestFile;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT)
      ZERO_THROW("checkpoint root '" + root + "' has no 'latest' file: no checkpoint was completed there; "
                 "check the path, or pass a step number as the tag");
    sys_fail("open", path, err);
  }
  Fd f(fd, path);
  std::uint64_t size = f.size();
  if (size > 64) file_fail(path, "content", "is " + std::to_string(size) + " bytes; it should hold one directory name");
  std::string s(static_cast<std::size_t>(size), '\0');
  f.pread_all(s.data(), s.size(), 0);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (parse_step_dir_name(s) < 0)
    file_fail(path, "content", "= \"" + s + "\" is not a checkpoint directory name like step_00000010");
  return s;
}

static bool is_dir(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

std::string resolve(const std::string& root, const std::string& tag) {
  if (fs::exists(fs::path(root) / kMetadataFile)) {
    ZERO_CHECK(tag == "latest" || tag.empty(),
               "checkpoint: '" + root + "' is a step directory; tag '" + tag + "' applies to a checkpoint root");
    return root;
  }
  if (!is_dir(root))
    ZERO_THROW("checkpoint root '" + root + "' does not exist or is not a directory; check the path");
  std::string name;
  if (tag == "latest" || tag.empty()) {
    name = read_latest(root);
  } else if (parse_step_dir_name(tag) >= 0) {
    name = tag;
  } else {
    bool digits = !tag.empty() && tag.size() <= 18 && std::all_of(tag.begin(), tag.end(), [](char c) { return c >= '0' && c <= '9'; });
    ZERO_CHECK(digits, "checkpoint tag '" + tag + "' is neither \"latest\" nor a step number");
    name = step_dir_name(std::stoll(tag));
  }
  std::string dir = root + "/" + name;
  if (!is_dir(dir)) {
    std::string have;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec))
      if (parse_step_dir_name(e.path().filename().string()) >= 0) have += " " + e.path().filename().string();
    ZERO_THROW("checkpoint '" + dir + "' does not exist (" + (tag == "latest" || tag.empty() ? "named by 'latest'" : "tag " + tag) +
               "); available:" + (have.empty() ? std::string(" none") : have));
  }
  return dir;
}

std::string prepare(const std::string& root, std::int64_t step, const char* who) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) sys_fail("create the checkpoint root", root, ec.value());
  std::string name = step_dir_name(step);
  if (is_dir(root + "/" + name) && fs::exists(fs::path(root) / kLatestFile)) {
    std::string latest;
    try {
      latest = read_latest(root);
    } catch (const Error&) {
      // A malformed latest points nowhere; the existing directory is not in use then.
    }
    bool save = std::string_view(who) == "save_checkpoint";
    ZERO_CHECK(latest != name, std::string(who) + ": '" + root + "/" + name + "' already exists and is the latest checkpoint" +
                                   (save ? ": the engine is at the step it was saved (or resumed) at. Skip this save, "
                                           "or train at least one step first"
                                         : "; write to another directory or delete it first"));
  }
  // Leftovers of saves that were interrupted (killed) part way.
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind(".tmp_step_", 0) == 0 || n.rfind(".trash_step_", 0) == 0) {
      std::error_code rm;
      fs::remove_all(e.path(), rm);
      if (rm) sys_fail("remove the leftover", e.path().string(), rm.value());
    }
  }
  if (ec) sys_fail("list", root, ec.value());
  std::string tmp = root + "/.tmp_" + name;
  fs::create_directory(tmp, ec);
  if (ec) sys_fail("create", tmp, ec.value());
  fsync_dir(root);
  return tmp;
}

static void move_to_trash_and_remove(const std::string& root, const std::string& name, bool strict) {
  std::string from = root + "/" + name, trash = root + "/.trash_" + name;
  std::error_code ec;
  fs::remove_all(trash, ec);
  if (::rename(from.c_str(), trash.c_str()) != 0) {
    if (strict) sys_fail("move aside", from, errno);
    std::fprintf(stderr, "%swarning: could not delete old checkpoint '%s': %s; delete it by hand\n",
                 rank_prefix().c_str(), from.c_str(), std::strerror(errno));
    return;
  }
  fs::remove_all(trash, ec);
  if (ec)
    std::fprintf(stderr, "%swarning: could not delete '%s': %s; delete it by hand\n", rank_prefix().c_str(),
                 trash.c_str(), ec.message().c_str());
}

void commit(const std::string& root, const std::string& tmp_dir, std::int64_t step, int keep_last,
            void (*fail_point)(const char*)) {
  const std::string name = step_dir_name(step);
  const std::string final_dir = root + "/" + name;
  fsync_dir(tmp_dir);
  fail_point("before_rename");
  // A directory of this step that latest does not name (prepare checked) is a leftover of an
  // abandoned run or of a save killed after its rename: replace it. Moving it aside first keeps
  // the rename below atomic; the latest checkpoint is untouched throughout.
  if (is_dir(final_dir)) move_to_trash_and_remove(root, name, true);
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) sys_fail("rename " + tmp_dir + " to", final_dir, errno);
  fsync_dir(root);
  fail_point("after_rename");
  write_file_atomic(root, kLatestFile, name + "\n");
  fail_point("after_latest");
  if (keep_last <= 0) return;
  // Keep the newest keep_last checkpoints up to this step. Later steps are a future this run
  // abandoned by resuming from an earlier one; they are replaced as the run reaches them.
  std::vector<std::int64_t> older;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::int64_t s = parse_step_dir_name(e.path().filename().string());
    if (s >= 0 && s <= step && e.is_directory()) older.push_back(s);
  }
  std::sort(older.rbegin(), older.rend());
  for (std::size_t i = static_cast<std::size_t>(keep_last); i < older.size(); ++i)
    move_to_trash_and_remove(root, step_dir_name(older[i]), false);
  fsync_dir(root);
}

}  // namespace zero::ckpt
