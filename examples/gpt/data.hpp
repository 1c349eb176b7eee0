// Token data for the GPT trainer: tiny Shakespeare as bytes, any text file as bytes, or llm.c
// token shards.
//
// A TokenSet is a list of segments (one per shard, or one slice of a text); a sample is a
// window of T+1 tokens (inputs and the targets shifted by one) at stride T inside a segment,
// never straddling two. The DataLoader walks one global stream of samples: epoch e visits every
// sample once in the order of a seeded pseudo-random permutation, and micro-step m of rank r
// reads stream positions [(m * world + r) * B, +B). The stream depends only on the seed and the
// global micro-batch, so one rank with two micro-steps sees exactly the samples two ranks see in
// one, and no rank reads a sample another rank reads in the same step.
//
// llm.c shard format: 256 little-endian int32 (magic 20240520, version, token count, rest
// unused), then `count` little-endian tokens. The version says how wide a token is: version 1
// (llm.c's) holds uint16 tokens and the file is exactly 1024 + 2 * count bytes; version 2 holds
// uint32 tokens, for vocabularies past 65536 ids (Llama 3's 128K, BLOOM's 250,880), and the file
// is exactly 1024 + 4 * count bytes. Any other version is refused. Shards are memory-mapped and
// read in place at either width, so a 100 GB data set costs address space, not RAM.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zero::gpt {

inline constexpr std::int32_t kShardMagic = 20240520;
inline constexpr std::int32_t kShardVersionU16 = 1;  // llm.c's: uint16 tokens
inline constexpr std::int32_t kShardVersionU32 = 2;  // uint32 tokens
inline constexpr std::size_t kShardHeaderBytes = 256 * sizeof(std::int32_t);

// Byte-level tokenizer (vocabulary 256): a token is a byte.
std::vector<std::uint16_t> encode_bytes(std::string_view text);
std::string decode_bytes(std::span<const int> tokens);

// The embedded corpus (examples/data/tinyshakespeare.txt): next to the executable
// (<exe dir>/data/), in an installed tree (<exe dir>/../share/zero/data/), or in the source
// tree the binary was built from. Throws zero::Error listing the places tried.
std::string find_shakespeare();

// The shard version a model of `vocab_size` token ids needs: version 1 (uint16) up to 65536 ids,
// version 2 (uint32) past that.
std::int32_t shard_version_for(std::int64_t vocab_size);

// Writes an llm.c shard of uint16 tokens, version 1 (tests and tools).
void write_shard(const std::string& path, std::span<const std::uint16_t> tokens);
// Writes a shard for a model of `vocab_size` ids at the width shard_version_for(vocab_size)
// picks, so a vocabulary that fits uint16 still gives a file llm.c reads. A token >= vocab_size
// is a zero::Error, as is more than 2^31 - 1 tokens (the header's count is an int32).
void write_shard(const std::string& path, std::span<const std::uint32_t> tokens, std::int64_t vocab_size);

// A read-only memory map of a whole file (RAII, move-only).
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();
  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

// One segment's tokens, read in place: `width` bytes each, 2 (uint16) or 4 (uint32).
class TokenSpan {
 public:
  TokenSpan(const void* data, std::size_t size, int width) : data_(data), size_(size), width_(width) {}
  std::size_t size() const { return size_; }
  int width() const { return width_; }
  const void* data() const { return data_; }
  std::uint32_t operator[](std::size_t i) const {
    return width_ == 2 ? static_cast<const std::uint16_t*>(data_)[i] : static_cast<const std::uint32_t*>(data_)[i];
  }

 private:
  const void* data_;
  std::size_t size_;
  int width_;
};

class TokenSet {
 public:
  // Shards matching a glob pattern, in sorted name order. Each file is checked (header magic,
  // version, size) and a bad one is a zero::Error naming it. Shards of both versions may mix.
  static TokenSet from_shards(const std::string& pattern);
  // A text file as bytes, split at 90%: the first part (validation = false) or the rest.
  static TokenSet from_text_file(const std::string& path, bool validation);
  // Tokens held in memory, one segment called `name`.
  static TokenSet from_tokens(std::vector<std::uint16_t> tokens, std::string name);
  static TokenSet from_tokens(std::vector<std::uint32_t> tokens, std::string name);

  int num_segments() const { return static_cast<int>(segments_.size()); }
  std::int64_t num_tokens() const;
  const std::string& segment_name(int i) const { return segments_[static_cast<std::size_t>(i)].name; }
  TokenSpan segment(int i) const {
    const auto& s = segments_[static_cast<std::size_t>(i)];
    return {s.tokens, static_cast<std::size_t>(s.count), s.width};
  }
  // What it is, for the log: "2 shards, 200000000 tokens (data/fineweb_train_*.bin)".
  const std::string& description() const { return description_; }

 private:
  struct Segment {
    std::string name;
    const void* tokens = nullptr;
    std::int64_t count = 0;
    int width = 2;  // bytes per token
  };
  std::vector<MappedFile> maps_;
  std::vector<std::uint16_t> owned_;
  std::vector<std::uint32_t> owned32_;
  std::vector<Segment> segments_;
  std::string description_;
  // The one segment of from_tokens, over owned_ or owned32_.
  void set_owned_segment(std::string name, const void* tokens, std::size_t count, int width);
};

// A bijection of [0, n) chosen by `key`: a 4-round Feistel network on the smallest even bit
// width covering n, cycle-walking the values >= n. O(1) memory whatever n is.
class IndexPermutation {
 public:
  IndexPermutation(std::uint64_t n, std::uint64_t key);
  std::uint64_t operator()(std::uint64_t i) const;

 private:
  std::uint64_t n_;
  int half_bits_ = 0;
  std::uint64_t mask_ = 0;
  std::uint64_t keys_[4] = {};
};

class DataLoader {
 public:
  struct Options {
    int batch = 1;     // B: sequences per rank per micro-step
    int seq_len = 64;  // T
    int rank = 0;
    int world = 1;
    std::uint64_t seed = 0;
    bool shuffle = true;     // false: samples in order (validation)
    int vocab_size = 65536;  // a token >= this is a zero::Error naming where it was found (either width)
  };
  // Throws zero::Error when the set holds no complete sample.
  DataLoader(const TokenSet& set, const Options& opt);

  std::int64_t num_samples() const { return total_; }
  // Samples one global micro-step consumes (B * world).
  std::int64_t samples_per_micro_step() const;
  // (segment, first token) of sample s.
  std::pair<int, std::int64_t> locate(std::int64_t sample) const;
  // The global sample this rank reads as item j of micro-step m.
  std::int64_t sample_at(std::int64_t micro_step, int j) const;

  // Fills inputs and targets (B*T each) with this rank's next micro-batch.
  void next(std::int32_t* inputs, std::int32_t* targets);
  // Fills inputs and targets (count*T each) with samples first .. first+count-1 in set order,
  // whatever the rank and shuffle (evaluation shares a fixed list of samples out itself).
  void read(std::int64_t first, int count, std::int32_t* inputs, std::int32_t* targets) const;
  // Throws zero::Error for a negative position or one whose sample index overflows.
  void seek(std::int64_t micro_step);
  std::int64_t micro_step() const { return micro_step_; }
  // Epoch of the stream position where the next micro-batch starts.
  std::int64_t epoch() const;

 private:
  const TokenSet* set_;
  Options opt_;
  std::vector<std::int64_t> first_sample_;  // per segment, prefix sums of sample counts
  std::int64_t total_ = 0;
  void copy_sample(std::int64_t sample, std::int32_t* inputs, std::int32_t* targets) const;
  std::int64_t micro_step_ = 0;
};

}  // namespace zero::gpt
