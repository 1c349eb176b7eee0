#include "gpt/data.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "zero/error.hpp"
#include "zero/util/files.hpp"

namespace zero::gpt {

namespace fs = std::filesystem;

namespace {

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<std::uint16_t> encode_bytes(std::string_view text) {
  std::vector<std::uint16_t> t(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) t[i] = static_cast<unsigned char>(text[i]);
  return t;
}

std::string decode_bytes(std::span<const int> tokens) {
  std::string s;
  s.reserve(tokens.size());
  for (int t : tokens) s.push_back(static_cast<char>(static_cast<unsigned char>(t)));
  return s;
}

std::string find_shakespeare() {
  const std::string file = "tinyshakespeare.txt";
  std::vector<fs::path> tried;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    tried.push_back(exe.parent_path() / "data" / file);
    tried.push_back(exe.parent_path().parent_path() / "share" / "zero" / "data" / file);
  }
#ifdef ZERO_GPT_SOURCE_DATA_DIR
  tried.push_back(fs::path(ZERO_GPT_SOURCE_DATA_DIR) / file);
#endif
  for (const auto& p : tried)
    if (fs::is_regular_file(p, ec)) return p.string();
  std::string list;
  for (const auto& p : tried) list += "\n  " + p.string();
  ZERO_THROW("data: the embedded corpus " + file + " was not found; looked in:" + list +
             "\nGive its path instead: data.train: /path/to/" + file);
}

namespace {

void write_shard_file(const std::string& path, std::int32_t version, const void* tokens, std::size_t count,
                      std::size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  ZERO_CHECK(out, "write_shard: cannot create '" + path + "': " + std::strerror(errno));
  std::int32_t header[256] = {};
  header[0] = kShardMagic;
  header[1] = version;
  header[2] = static_cast<std::int32_t>(count);
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(static_cast<const char*>(tokens), static_cast<std::streamsize>(bytes));
  ZERO_CHECK(out, "write_shard: writing '" + path + "' failed (disk full?)");
}

void check_shard_count(const std::string& path, std::size_t count) {
  ZERO_CHECK(count <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()),
             fmt::format("write_shard: '{}' would hold {} tokens, more than the int32 count in the header allows "
                         "({}); split the tokens over several shards",
                         path, count, std::numeric_limits<std::int32_t>::max()));
}

}  // namespace

std::int32_t shard_version_for(std::int64_t vocab_size) {
  return vocab_size <= 65536 ? kShardVersionU16 : kShardVersionU32;
}

void write_shard(const std::string& path, std::span<const std::uint16_t> tokens) {
  check_shard_count(path, tokens.size());
  write_shard_file(path, kShardVersionU16, tokens.data(), tokens.size(), tokens.size_bytes());
}

void write_shard(const std::string& path, std::span<const std::uint32_t> tokens, std::int64_t vocab_size) {
  ZERO_CHECK(vocab_size >= 1 && vocab_size <= std::int64_t{1} << 32,
             fmt::format("write_shard: vocab_size {} for '{}' is outside [1, 2^32]", vocab_size, path));
  check_shard_count(path, tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i)
    ZERO_CHECK(tokens[i] < vocab_size, fmt::format("write_shard: token {} at position {} of '{}' is outside the "
                                                   "vocabulary (vocab_size {})",
                                                   tokens[i], i, path, vocab_size));
  if (shard_version_for(vocab_size) == kShardVersionU32) {
    write_shard_file(path, kShardVersionU32, tokens.data(), tokens.size(), tokens.size_bytes());
    return;
  }
  const std::vector<std::uint16_t> narrow(tokens.begin(), tokens.end());  // every token < 65536, checked above
  write_shard_file(path, kShardVersionU16, narrow.data(), narrow.size(), narrow.size() * sizeof(std::uint16_t));
}

namespace {

// Data must be a regular file (zero/util/files.hpp): mmap of a directory fails with the puzzling
// "No such device", so a directory gets its own hint.
[[noreturn]] void require_regular(const std::string& type, const std::string& path) {
  if (type == "a directory")
    ZERO_THROW("data: '" + path + "' is a directory; give a glob of its token shards ('" + path +
               "/*.bin'), a .txt file or 'shakespeare'");
  ZERO_THROW("data: '" + path + "' is not a regular file (" + type + "); copy the data into a file and give its path");
}

}  // namespace

MappedFile::MappedFile(const std::string& path) {
  const zero::OpenedFile f = zero::open_regular_file(path);
  ZERO_CHECK(f.exists, "data: cannot open '" + path + "': " + std::strerror(f.error) + "; check the path");
  if (f.fd < 0) require_regular(f.type, path);
  const int fd = f.fd;
  size_ = static_cast<std::size_t>(f.size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    ::close(fd);
    ZERO_CHECK(p != MAP_FAILED, "data: cannot map '" + path + "': " + std::strerror(e));
    data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

TokenSet TokenSet::from_shards(const std::string& pattern) {
  glob_t g{};
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  ZERO_CHECK(!files.empty(), "data: no file matches '" + pattern +
                                 "'; give a glob of llm.c .bin token shards, 'shakespeare' for "
                                 "the embedded corpus, or a .txt file");
  std::sort(files.begin(), files.end());

  TokenSet set;
  for (const auto& f : files) {
    MappedFile m(f);
    const std::string hint =
        "; an llm.c token shard is 256 int32 (magic 20240520, version, token count) then the tokens: uint16 for "
        "version 1, uint32 for version 2; regenerate the file or drop it from the glob";
    ZERO_CHECK(m.size() >= kShardHeaderBytes,
               fmt::format("data: shard '{}' is {} bytes, shorter than the 1024-byte header (truncated?){}", f,
                           m.size(), hint));
    std::int32_t header[256];
    std::memcpy(header, m.data(), sizeof header);
    ZERO_CHECK(header[0] == kShardMagic,
               fmt::format("data: shard '{}' has magic {}, expected {}{}", f, header[0], kShardMagic, hint));
    ZERO_CHECK(header[1] == kShardVersionU16 || header[1] == kShardVersionU32,
               fmt::format("data: shard '{}' has version {}; accepted are {} (uint16 tokens, llm.c's) and {} (uint32 "
                           "tokens){}",
                           f, header[1], kShardVersionU16, kShardVersionU32, hint));
    ZERO_CHECK(header[2] >= 0, fmt::format("data: shard '{}' has a negative token count {}{}", f, header[2], hint));
    const int width = header[1] == kShardVersionU32 ? 4 : 2;
    const std::size_t expect =
        kShardHeaderBytes + static_cast<std::size_t>(width) * static_cast<std::size_t>(header[2]);
    ZERO_CHECK(m.size() == expect,
               fmt::format("data: shard '{}' header says {} tokens of {} bytes (version {}), so the file should be {} "
                           "bytes, but it is {} bytes (truncated or partly written){}",
                           f, header[2], width, header[1], expect, m.size(), hint));
    Segment s;
    s.name = f;
    // The mapping is page-aligned and the header 1024 bytes, so uint32 tokens are aligned too.
    s.tokens = m.data() + kShardHeaderBytes;
    s.count = header[2];
    s.width = width;
    set.segments_.push_back(std::move(s));
    set.maps_.push_back(std::move(m));
  }
  set.description_ =
      fmt::format("{} shard{}, {} tokens ({})", files.size(), files.size() == 1 ? "" : "s", set.num_tokens(), pattern);
  return set;
}

TokenSet TokenSet::from_text_file(const std::string& path, bool validation) {
  const MappedFile text(path);
  std::vector<std::uint16_t> all = encode_bytes({reinterpret_cast<const char*>(text.data()), text.size()});
  // A fixed split: the first 90% trains, the last 10% validates.
  const std::size_t split = all.size() * 9 / 10;
  std::vector<std::uint16_t> part =
      validation ? std::vector<std::uint16_t>(all.begin() + static_cast<std::ptrdiff_t>(split), all.end())
                 : std::vector<std::uint16_t>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(split));
  TokenSet set = from_tokens(std::move(part), path + (validation ? " [last 10%]" : " [first 90%]"));
  set.description_ = fmt::format("{}, {} byte tokens", set.segments_[0].name, set.num_tokens());
  return set;
}

TokenSet TokenSet::from_tokens(std::vector<std::uint16_t> tokens, std::string name) {
  TokenSet set;
  set.owned_ = std::move(tokens);
  set.set_owned_segment(std::move(name), set.owned_.data(), set.owned_.size(), 2);
  return set;
}

TokenSet TokenSet::from_tokens(std::vector<std::uint32_t> tokens, std::string name) {
  TokenSet set;
  set.owned32_ = std::move(tokens);
  set.set_owned_segment(std::move(name), set.owned32_.data(), set.owned32_.size(), 4);
  return set;
}

void TokenSet::set_owned_segment(std::string name, const void* tokens, std::size_t count, int width) {
  Segment s;
  s.name = std::move(name);
  s.tokens = tokens;
  s.count = static_cast<std::int64_t>(count);
  s.width = width;
  description_ = fmt::format("{}, {} tokens", s.name, s.count);
  segments_.push_back(std::move(s));
}

std::int64_t TokenSet::num_tokens() const {
  std::int64_t n = 0;
  for (const auto& s : segments_) n += s.count;
  return n;
}

IndexPermutation::IndexPermutation(std::uint64_t n, std::uint64_t key) : n_(n) {
  int bits = 2;
  while (bits < 64 && (std::uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  mask_ = (std::uint64_t{1} << half_bits_) - 1;
  std::uint64_t k = key;
  for (auto& rk : keys_) rk = mix64(k += 0x9e3779b97f4a7c15ull);
}

std::uint64_t IndexPermutation::operator()(std::uint64_t i) const {
  std::uint64_t x = i;
  // The network permutes [0, 4^half_bits); walking the cycle from i until it lands back inside
  // [0, n) restricts it to a permutation of [0, n). The domain is < 4n, so walks are short.
  do {
    std::uint64_t l = x >> half_bits_, r = x & mask_;
    for (std::uint64_t k : keys_) {
      std::uint64_t t = l ^ (mix64(r ^ k) & mask_);
      l = r;
      r = t;
    }
    x = (l << half_bits_) | r;
  } while (x >= n_);
  return x;
}

DataLoader::DataLoader(const TokenSet& set, const Options& opt) : set_(&set), opt_(opt) {
  ZERO_CHECK(opt.batch >= 1 && opt.seq_len >= 1 && opt.world >= 1 && opt.rank >= 0 && opt.rank < opt.world,
             fmt::format("DataLoader: bad options (batch {}, seq_len {}, rank {}/{})", opt.batch, opt.seq_len, opt.rank,
                         opt.world));
  first_sample_.reserve(static_cast<std::size_t>(set.num_segments()) + 1);
  first_sample_.push_back(0);
  for (int i = 0; i < set.num_segments(); ++i) {
    const std::int64_t count = static_cast<std::int64_t>(set.segment(i).size());
    // Windows of T+1 tokens start at 0, T, 2T, ...: floor((count - 1) / T) of them fit.
    const std::int64_t n = count > opt.seq_len ? (count - 1) / opt.seq_len : 0;
    first_sample_.push_back(first_sample_.back() + n);
  }
  total_ = first_sample_.back();
  ZERO_CHECK(total_ > 0, fmt::format("data: {} holds no sequence of seq_len + 1 = {} tokens; use more data or a "
                                     "smaller model.seq_len",
                                     set.description(), opt.seq_len + 1));
}

std::int64_t DataLoader::samples_per_micro_step() const { return static_cast<std::int64_t>(opt_.batch) * opt_.world; }

std::pair<int, std::int64_t> DataLoader::locate(std::int64_t sample) const {
  ZERO_CHECK(sample >= 0 && sample < total_, fmt::format("DataLoader::locate: sample {} out of range", sample));
  auto it = std::upper_bound(first_sample_.begin(), first_sample_.end(), sample);
  const int seg = static_cast<int>(it - first_sample_.begin()) - 1;
  return {seg, (sample - first_sample_[static_cast<std::size_t>(seg)]) * opt_.seq_len};
}

std::int64_t DataLoader::sample_at(std::int64_t micro_step, int j) const {
  const std::int64_t pos = (micro_step * opt_.world + opt_.rank) * opt_.batch + j;
  const std::int64_t epoch = pos / total_, i = pos % total_;
  if (!opt_.shuffle) return i;
  IndexPermutation perm(static_cast<std::uint64_t>(total_),
                        mix64(opt_.seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(epoch)));
  return static_cast<std::int64_t>(perm(static_cast<std::uint64_t>(i)));
}

std::int64_t DataLoader::epoch() const { return (micro_step_ * opt_.world + opt_.rank) * opt_.batch / total_; }

void DataLoader::seek(std::int64_t micro_step) {
  // sample_at computes (micro_step * world + rank) * batch + j: keep it inside int64.
  const std::int64_t per = samples_per_micro_step();
  ZERO_CHECK(micro_step >= 0 && micro_step <= (std::numeric_limits<std::int64_t>::max() - per) / per - 1,
             fmt::format("DataLoader::seek: micro-step {} is outside [0, {}] for {} samples per micro-step", micro_step,
                         (std::numeric_limits<std::int64_t>::max() - per) / per - 1, per));
  micro_step_ = micro_step;
}

namespace {

// Checks the window of T+1 tokens at `tok` against the vocabulary, then copies inputs and targets.
template <class Token>
void copy_window(const Token* tok, int T, int vocab_size, std::int64_t start, const std::string& name, std::int32_t* in,
                 std::int32_t* tg) {
  for (int t = 0; t <= T; ++t) {
    if (static_cast<std::int64_t>(tok[t]) >= vocab_size)
      ZERO_THROW(
          fmt::format("data: token {} at position {} of '{}' is outside the model's vocabulary (vocab_size "
                      "{}); set model.vocab_size to the tokenizer's (50257 for GPT-2)",
                      tok[t], start + t, name, vocab_size));
  }
  for (int t = 0; t < T; ++t) {
    in[t] = static_cast<std::int32_t>(tok[t]);
    tg[t] = static_cast<std::int32_t>(tok[t + 1]);
  }
}

}  // namespace

void DataLoader::copy_sample(std::int64_t sample, std::int32_t* in, std::int32_t* tg) const {
  const int T = opt_.seq_len;
  auto [seg, start] = locate(sample);
  const TokenSpan span = set_->segment(seg);
  const auto first = static_cast<std::size_t>(start);
  if (span.width() == 4)
    copy_window(static_cast<const std::uint32_t*>(span.data()) + first, T, opt_.vocab_size, start,
                set_->segment_name(seg), in, tg);
  else
    copy_window(static_cast<const std::uint16_t*>(span.data()) + first, T, opt_.vocab_size, start,
                set_->segment_name(seg), in, tg);
}

void DataLoader::next(std::int32_t* inputs, std::int32_t* targets) {
  const std::size_t T = static_cast<std::size_t>(opt_.seq_len);
  for (int j = 0; j < opt_.batch; ++j)
    copy_sample(sample_at(micro_step_, j), inputs + static_cast<std::size_t>(j) * T,
                targets + static_cast<std::size_t>(j) * T);
  ++micro_step_;
}

void DataLoader::read(std::int64_t first, int count, std::int32_t* inputs, std::int32_t* targets) const {
  const std::size_t T = static_cast<std::size_t>(opt_.seq_len);
  for (int j = 0; j < count; ++j)
    copy_sample(first + j, inputs + static_cast<std::size_t>(j) * T, targets + static_cast<std::size_t>(j) * T);
}

}  // namespace zero::gpt
