// Checkpoint files: names, the Fd wrapper, atomic small files, and the 64-byte header.
#include "checkpoint/format.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "checkpoint/json.hpp"
#include "zero/error.hpp"
#include "zero/util/files.hpp"

static_assert(std::endian::native == std::endian::little,
              "checkpoint shards store floats in host order and the format is little-endian");

namespace zero::ckpt {

using namespace detail;

namespace {

constexpr char kMagic[8] = {'Z', 'E', 'R', 'O', 'C', 'K', 'P', 'T'};

const char* kind_name(FileKind k) {
  return k == FileKind::metadata ? "metadata" : (k == FileKind::shard ? "shard" : "rank state");
}

// Which libzero release writes a format version other than this build's.
std::string writer_of(std::uint32_t version) {
  if (version == 1) return "libzero 0.1.0 (format 1, before XXH3 checksums)";
  if (version > kFormatVersion) return fmt::format("a libzero newer than this one (format {})", version);
  return fmt::format("no libzero release (format {}): the file is damaged", version);
}

}  // namespace

void detail::sys_fail(const std::string& what, const std::string& path, int err) {
  ZERO_THROW(
      fmt::format("checkpoint: cannot {} '{}': {}; check that the directory exists, is writable and has "
                  "free space",
                  what, path, std::strerror(err)));
}

void detail::file_fail(const std::string& path, const std::string& field, const std::string& problem) {
  ZERO_THROW(fmt::format("checkpoint file '{}': field '{}' {}; {}", path, field, problem, kDamaged));
}

std::uint64_t checksum(const void* data, std::size_t bytes) { return XXH3_64bits(data, bytes); }

std::string shard_file_name(int rank) { return fmt::format("shard_{:05d}.ckpt", rank); }
std::string shard_file_name(int rank, int tensor, int pipeline) {
  return fmt::format("shard_t{:02d}_p{:02d}_{:05d}.ckpt", tensor, pipeline, rank);
}

std::string GridMeta::describe() const { return fmt::format("TP {} x PP {}", tensor, pipeline); }
std::string rank_state_file_name(int rank) { return fmt::format("rank_state_{:05d}.ckpt", rank); }

std::string step_dir_name(std::int64_t step) { return fmt::format("step_{:08d}", step); }

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
  OpenedFile f = open_regular_file(path);
  if (f.fd >= 0) return Fd(f.fd, path);
  if (f.exists)
    ZERO_THROW(fmt::format("checkpoint file '{}': is {}, not a regular file (it would block or never end if read); {}",
                           path, f.type, kDamaged));
  ZERO_THROW(fmt::format("checkpoint file '{}': cannot open: {}; {}", path, std::strerror(f.error),
                         f.error == ENOENT ? kDamaged : "check its permissions"));
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
      ZERO_THROW(fmt::format("checkpoint file '{}': ends at byte {} while reading; the file is truncated; {}", path_,
                             offset, kDamaged));
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

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  if (::unlink(tmp_.c_str()) != 0 && errno != ENOENT) sys_fail("remove the stale", tmp_, errno);
  fd_ = Fd::create(tmp_);
}

AtomicFile::~AtomicFile() {
  if (fd_) {
    fd_ = Fd();
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::commit() {
  fd_.sync();
  fd_.close();
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    ZERO_THROW(fmt::format("cannot rename '{}' to '{}': {}; check the output directory is writable", tmp_, path_,
                           std::strerror(errno)));
}

void write_file_atomic(const std::string& dir, const std::string& name, const std::string& content) {
  std::string tmp = fmt::format("{}/.{}.tmp", dir, name);
  std::string dst = fmt::format("{}/{}", dir, name);
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) sys_fail("remove the stale", tmp, errno);
  try {
    Fd f = Fd::create(tmp);
    f.pwrite_all(content.data(), content.size(), 0);
    f.sync();
    f.close();
    if (::rename(tmp.c_str(), dst.c_str()) != 0) sys_fail("rename " + tmp + " to", dst, errno);
  } catch (...) {
    ::unlink(tmp.c_str());  // nothing half-written stays behind (on a full disk least of all)
    throw;
  }
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

void write_small_file(const std::string& path, FileKind kind, const std::string& index, const std::string& data) {
  FileHeader h;
  h.kind = kind;
  h.payload_bytes = index.size() + data.size();
  h.index_bytes = index.size();
  h.index_checksum = checksum(index.data(), index.size());
  unsigned char head[kHeaderBytes];
  encode_header(h, head);
  Fd f = Fd::create(path);
  f.pwrite_all(head, kHeaderBytes, 0);
  f.pwrite_all(index.data(), index.size(), kHeaderBytes);
  f.pwrite_all(data.data(), data.size(), kHeaderBytes + index.size());
  f.sync();
  f.close();
}

FileHeader read_header(const Fd& f, FileKind expect) {
  const std::string& p = f.path();
  std::uint64_t size = f.size();
  if (size < kHeaderBytes)
    file_fail(p, "header",
              fmt::format("is truncated: the file has {} bytes, less than the {}-byte header", size, kHeaderBytes));
  unsigned char h[kHeaderBytes];
  f.pread_all(h, kHeaderBytes, 0);
  if (std::memcmp(h, kMagic, 8) != 0)
    file_fail(p, "header.magic", "is not \"ZEROCKPT\": this is not a libzero checkpoint file");
  // The version comes before the checksum: another version may checksum its header differently.
  std::uint32_t version = get32(h + 8);
  if (version < kOldestReadableFormat || version > kFormatVersion)
    ZERO_THROW(
        fmt::format("checkpoint file '{}': field 'header.format_version' = {}: written by {}; this build reads "
                    "formats {} to {}. Load it with the libzero that wrote it (or convert it there to "
                    "safetensors with zero-ckpt export)",
                    p, version, writer_of(version), kOldestReadableFormat, kFormatVersion));
  std::uint64_t stored = get64(h + 56), computed = checksum(h, 56);
  if (stored != computed)
    file_fail(p, "header.checksum",
              fmt::format("does not match (stored {}, computed {}): the header is corrupted", json::hex64(stored),
                          json::hex64(computed)));
  std::uint32_t kind = get32(h + 12);
  if (kind != static_cast<std::uint32_t>(expect))
    file_fail(p, "header.kind",
              fmt::format("= {}, expected {} ({}): the file is in the wrong place", kind,
                          static_cast<std::uint32_t>(expect), kind_name(expect)));
  for (int i = 40; i < 56; ++i)
    if (h[i] != 0) file_fail(p, "header.reserved", "is not zero");
  FileHeader r;
  r.version = version;
  r.kind = expect;
  r.payload_bytes = get64(h + 16);
  r.index_bytes = get64(h + 24);
  r.index_checksum = get64(h + 32);
  if (r.payload_bytes != size - kHeaderBytes)
    file_fail(p, "header.payload_bytes",
              fmt::format("says the file has {} payload bytes after the header, but it has {}: the file is truncated "
                          "or extended",
                          r.payload_bytes, size - kHeaderBytes));
  if (r.index_bytes > r.payload_bytes)
    file_fail(p, "header.index_bytes",
              fmt::format("= {} exceeds the payload ({} bytes)", r.index_bytes, r.payload_bytes));
  return r;
}

std::string read_index(const Fd& f, const FileHeader& h) {
  std::string index(static_cast<std::size_t>(h.index_bytes), '\0');
  f.pread_all(index.data(), index.size(), kHeaderBytes);
  std::uint64_t c = checksum(index.data(), index.size());
  if (c != h.index_checksum)
    file_fail(f.path(), "header.index_checksum",
              fmt::format("does not match the {} index (stored {}, computed {}): the file is corrupted",
                          kind_name(h.kind), json::hex64(h.index_checksum), json::hex64(c)));
  return index;
}

ShardMeta write_rank_state_file(const std::string& path, const std::vector<float>& values) {
  const std::size_t bytes = values.size() * sizeof(float);
  FileHeader h;
  h.kind = FileKind::rank_state;
  h.payload_bytes = h.index_bytes = bytes;
  h.index_checksum = checksum(values.data(), bytes);
  unsigned char head[kHeaderBytes];
  encode_header(h, head);
  Fd f = Fd::create(path);
  f.pwrite_all(head, kHeaderBytes, 0);
  if (bytes > 0) f.pwrite_all(values.data(), bytes, kHeaderBytes);
  f.sync();
  f.close();
  return ShardMeta{std::filesystem::path(path).filename().string(), kHeaderBytes + bytes, h.index_checksum};
}

std::vector<float> read_rank_state_file(const std::string& path, const ShardMeta& expect) {
  Fd f = Fd::open_read(path);
  const FileHeader h = read_header(f, FileKind::rank_state);
  if (h.index_bytes != h.payload_bytes || h.payload_bytes % sizeof(float) != 0)
    file_fail(path, "header.index_bytes", "must equal payload_bytes, a whole number of fp32 values");
  if (kHeaderBytes + h.payload_bytes != expect.bytes || h.index_checksum != expect.index_checksum)
    file_fail(path, "header",
              fmt::format("does not match the metadata's record of it ({} bytes, checksum {}): the "
                          "file belongs to another checkpoint",
                          expect.bytes, json::hex64(expect.index_checksum)));
  const std::string payload = read_index(f, h);
  std::vector<float> out(payload.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), payload.data(), payload.size());
  return out;
}

}  // namespace zero::ckpt
