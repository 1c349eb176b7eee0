// The GPT data path: llm.c shards, uint16 and uint32 (format checks naming the file), sample windows that respect
// shard boundaries, rank striping, the shuffle permutation, and the embedded corpus.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gpt/data.hpp"
#include "zero/error.hpp"

using namespace zero::gpt;
namespace fs = std::filesystem;

namespace {

// A scratch directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path =
        fs::temp_directory_path() / ("zero_gpt_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::vector<std::uint16_t> iota_tokens(std::size_t n, std::uint16_t first) {
  std::vector<std::uint16_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

void write_raw(const std::string& path, const std::vector<std::int32_t>& header, std::size_t token_bytes) {
  std::ofstream out(path, std::ios::binary);
  std::vector<std::int32_t> h(256, 0);
  std::copy(header.begin(), header.end(), h.begin());
  out.write(reinterpret_cast<const char*>(h.data()), 1024);
  std::string zeros(token_bytes, '\0');
  out.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
}

}  // namespace

TEST_CASE("shards are read in sorted order and windows never cross a shard", "[gpt][data]") {
  TempDir dir;
  // Written out of order; tokens encode (shard, position) so a window shows where it came from.
  write_shard(dir.file("train_001.bin"), iota_tokens(25, 1000));
  write_shard(dir.file("train_000.bin"), iota_tokens(33, 0));
  write_shard(dir.file("train_002.bin"), iota_tokens(4, 2000));  // too short for any window
  write_shard(dir.file("other.bin"), iota_tokens(50, 3000));     // not matched by the glob

  TokenSet set = TokenSet::from_shards(dir.file("train_*.bin"));
  REQUIRE(set.num_segments() == 3);
  CHECK(set.segment_name(0) == dir.file("train_000.bin"));
  CHECK(set.num_tokens() == 33 + 25 + 4);

  DataLoader::Options o;
  o.batch = 1;
  o.seq_len = 8;
  o.shuffle = false;
  DataLoader loader(set, o);
  // floor((33-1)/8) = 4 windows in shard 0, floor((25-1)/8) = 3 in shard 1, none in shard 2.
  REQUIRE(loader.num_samples() == 7);
  CHECK(loader.locate(3) == std::pair<int, std::int64_t>{0, 24});
  CHECK(loader.locate(4) == std::pair<int, std::int64_t>{1, 0});
  CHECK(loader.locate(6) == std::pair<int, std::int64_t>{1, 16});

  std::vector<std::int32_t> in(8), tg(8);
  for (int s = 0; s < 7; ++s) {
    loader.next(in.data(), tg.data());
    const int base = s < 4 ? 8 * s : 1000 + 8 * (s - 4);
    for (int t = 0; t < 8; ++t) {
      REQUIRE(in[static_cast<std::size_t>(t)] == base + t);
      REQUIRE(tg[static_cast<std::size_t>(t)] == base + t + 1);  // same shard, shifted by one
    }
  }
  // The stream wraps into the next epoch.
  loader.next(in.data(), tg.data());
  CHECK(in[0] == 0);
}

TEST_CASE("ranks read disjoint samples that together cover the epoch", "[gpt][data]") {
  auto set = TokenSet::from_tokens(iota_tokens(24 * 4 + 1, 0), "mem");
  for (int world : {1, 2, 3}) {
    std::vector<std::int64_t> seen;
    const int B = 2;
    for (int rank = 0; rank < world; ++rank) {
      DataLoader::Options o;
      o.batch = B;
      o.seq_len = 4;
      o.rank = rank;
      o.world = world;
      o.seed = 17;
      DataLoader loader(set, o);
      REQUIRE(loader.num_samples() == 24);
      const std::int64_t steps = 24 / (B * world);
      for (std::int64_t m = 0; m < steps; ++m)
        for (int j = 0; j < B; ++j) seen.push_back(loader.sample_at(m, j));
    }
    INFO("world " << world);
    std::set<std::int64_t> unique(seen.begin(), seen.end());
    CHECK(unique.size() == seen.size());  // disjoint
    CHECK(unique.size() == 24);           // covering
    CHECK(*unique.begin() == 0);
    CHECK(*unique.rbegin() == 23);
  }

  SECTION("the global stream does not depend on how it is split") {
    // One rank with micro-batch 4 reads what ranks 0 and 1 with micro-batch 2 read together.
    DataLoader::Options one;
    one.batch = 4;
    one.seq_len = 4;
    one.seed = 5;
    DataLoader whole(set, one);
    DataLoader::Options two = one;
    two.batch = 2;
    two.world = 2;
    for (std::int64_t m = 0; m < 10; ++m)
      for (int r = 0; r < 2; ++r) {
        two.rank = r;
        DataLoader part(set, two);
        for (int j = 0; j < 2; ++j) CHECK(part.sample_at(m, j) == whole.sample_at(m, 2 * r + j));
      }
  }
  SECTION("each epoch is reshuffled") {
    DataLoader::Options o;
    o.batch = 24;
    o.seq_len = 4;
    o.seed = 5;
    DataLoader loader(set, o);
    std::vector<std::int64_t> e0, e1;
    for (int j = 0; j < 24; ++j) {
      e0.push_back(loader.sample_at(0, j));
      e1.push_back(loader.sample_at(1, j));
    }
    CHECK(e0 != e1);
    std::sort(e1.begin(), e1.end());
    std::vector<std::int64_t> all(24);
    std::iota(all.begin(), all.end(), 0);
    CHECK(e1 == all);
  }
}

TEST_CASE("the shuffle permutation is a bijection for any size", "[gpt][data]") {
  for (std::uint64_t n : {1ull, 2ull, 3ull, 5ull, 64ull, 100ull, 1000ull, 4097ull}) {
    for (std::uint64_t key : {0ull, 1ull, 12345ull}) {
      IndexPermutation p(n, key);
      std::vector<bool> hit(n, false);
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint64_t v = p(i);
        REQUIRE(v < n);
        REQUIRE(!hit[v]);
        hit[v] = true;
      }
    }
  }
  // Different keys give different orders.
  IndexPermutation a(1000, 1), b(1000, 2);
  int same = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) same += a(i) == b(i);
  CHECK(same < 50);
}

TEST_CASE("bad shards are errors that name the file", "[gpt][data]") {
  TempDir dir;
  SECTION("truncated: fewer tokens than the header says") {
    const std::string f = dir.file("cut.bin");
    write_raw(f, {kShardMagic, kShardVersionU16, 100}, 150);
    CHECK_THROWS_WITH(TokenSet::from_shards(f),
                      Catch::Contains(f) && Catch::Contains("header says 100 tokens") && Catch::Contains("1174 bytes"));
  }
  SECTION("truncated inside the header") {
    const std::string f = dir.file("stub.bin");
    std::ofstream(f, std::ios::binary) << "short";
    CHECK_THROWS_WITH(TokenSet::from_shards(f), Catch::Contains(f) && Catch::Contains("header"));
  }
  SECTION("wrong magic") {
    const std::string f = dir.file("magic.bin");
    write_raw(f, {20240521, kShardVersionU16, 10}, 20);
    CHECK_THROWS_WITH(TokenSet::from_shards(f), Catch::Contains(f) && Catch::Contains("magic 20240521"));
  }
  SECTION("unknown version") {
    const std::string f = dir.file("version.bin");
    write_raw(f, {kShardMagic, 3, 10}, 40);
    CHECK_THROWS_WITH(TokenSet::from_shards(f), Catch::Contains(f) && Catch::Contains("has version 3") &&
                                                    Catch::Contains("accepted are 1 (uint16 tokens") &&
                                                    Catch::Contains("2 (uint32 tokens)"));
  }
  SECTION("one bad shard among good ones") {
    write_shard(dir.file("a_000.bin"), iota_tokens(10, 0));
    write_raw(dir.file("a_001.bin"), {kShardMagic, 7, 10}, 20);
    CHECK_THROWS_WITH(TokenSet::from_shards(dir.file("a_*.bin")), Catch::Contains(dir.file("a_001.bin")));
  }
  SECTION("nothing matches") {
    CHECK_THROWS_WITH(TokenSet::from_shards(dir.file("none_*.bin")), Catch::Contains("no file matches"));
  }
  SECTION("a token outside the model's vocabulary") {
    const std::string f = dir.file("big.bin");
    write_shard(f, iota_tokens(20, 250));
    TokenSet set = TokenSet::from_shards(f);
    DataLoader::Options o;
    o.seq_len = 8;
    o.shuffle = false;
    o.vocab_size = 256;
    DataLoader loader(set, o);
    std::vector<std::int32_t> in(8), tg(8);
    CHECK_THROWS_WITH(loader.next(in.data(), tg.data()), Catch::Contains(f) && Catch::Contains("vocab_size 256"));
  }
}

namespace {

std::int32_t header_int(const std::string& path, int i) {
  std::ifstream in(path, std::ios::binary);
  std::int32_t v = -1;
  in.seekg(static_cast<std::streamoff>(i) * 4);
  in.read(reinterpret_cast<char*>(&v), sizeof v);
  return v;
}

}  // namespace

TEST_CASE("uint32 shards (version 2) hold ids past 65535 and read back exactly", "[gpt][data]") {
  TempDir dir;
  // BLOOM's vocabulary: ids up to 250879, windows of T+1 = 5 at stride 4.
  const std::int64_t vocab = 250880;
  std::vector<std::uint32_t> tokens;
  for (std::uint32_t i = 0; i < 21; ++i) tokens.push_back(i % 2 == 0 ? 65530 + i * 5001 : i);
  tokens[20] = 250879;  // the largest id the vocabulary has
  const std::string f = dir.file("wide_000.bin");
  write_shard(f, tokens, vocab);
  CHECK(header_int(f, 0) == 20240520);
  CHECK(header_int(f, 1) == 2);
  CHECK(header_int(f, 2) == 21);
  CHECK(fs::file_size(f) == 1024 + 4 * 21);

  TokenSet set = TokenSet::from_shards(f);
  REQUIRE(set.num_segments() == 1);
  REQUIRE(set.num_tokens() == 21);
  const TokenSpan seg = set.segment(0);
  CHECK(seg.width() == 4);
  for (std::size_t i = 0; i < tokens.size(); ++i) REQUIRE(seg[i] == tokens[i]);
  CHECK(seg[2] == 75532);  // does not fit uint16

  DataLoader::Options o;
  o.seq_len = 4;
  o.shuffle = false;
  o.vocab_size = static_cast<int>(vocab);
  DataLoader loader(set, o);
  REQUIRE(loader.num_samples() == 5);
  std::vector<std::int32_t> in(4), tg(4);
  for (int s = 0; s < 5; ++s) {
    loader.next(in.data(), tg.data());
    for (std::size_t t = 0; t < 4; ++t) {
      REQUIRE(in[t] == static_cast<std::int32_t>(tokens[4 * static_cast<std::size_t>(s) + t]));
      REQUIRE(tg[t] == static_cast<std::int32_t>(tokens[4 * static_cast<std::size_t>(s) + t + 1]));
    }
  }
  CHECK(tg[3] == 250879);

  SECTION("a token past the model's vocabulary is refused as for uint16") {
    o.vocab_size = 128256;  // Llama 3's: 135544 (position 14, in sample 3) is the first outside it
    DataLoader small(set, o);
    std::vector<std::int32_t> in3(3 * 4), tg3(3 * 4);
    CHECK_NOTHROW(small.read(0, 3, in3.data(), tg3.data()));
    CHECK(tg3[11] == 125542);  // the largest id of samples 0-2
    CHECK_THROWS_WITH(small.read(3, 1, in.data(), tg.data()), Catch::Contains(f) &&
                                                                  Catch::Contains("token 135544 at position 14") &&
                                                                  Catch::Contains("vocab_size 128256"));
  }
  SECTION("the writer refuses a token outside the vocabulary it is given") {
    CHECK_THROWS_WITH(write_shard(dir.file("bad.bin"), tokens, 128256),
                      Catch::Contains("token 135544 at position 14") && Catch::Contains("vocab_size 128256"));
  }
  SECTION("uint16 and uint32 shards mix in one glob") {
    write_shard(dir.file("wide_001.bin"), iota_tokens(9, 60000));
    TokenSet both = TokenSet::from_shards(dir.file("wide_*.bin"));
    REQUIRE(both.num_segments() == 2);
    CHECK(both.segment(1).width() == 2);
    DataLoader mixed(both, o);
    REQUIRE(mixed.num_samples() == 5 + 2);
    std::vector<std::int32_t> in2(2 * 4), tg2(2 * 4);
    mixed.read(5, 2, in2.data(), tg2.data());
    for (std::size_t t = 0; t < 4; ++t) {
      CHECK(in2[t] == 60000 + static_cast<std::int32_t>(t));
      CHECK(tg2[4 + t] == 60005 + static_cast<std::int32_t>(t));
    }
  }
}

TEST_CASE("the writer keeps uint16 (version 1) for a vocabulary that fits", "[gpt][data]") {
  CHECK(shard_version_for(256) == 1);
  CHECK(shard_version_for(50257) == 1);
  CHECK(shard_version_for(65536) == 1);
  CHECK(shard_version_for(65537) == 2);
  CHECK(shard_version_for(128256) == 2);
  TempDir dir;
  const std::vector<std::uint32_t> tokens = {0, 50256, 65535, 7, 42};
  const std::string f = dir.file("gpt2.bin");
  write_shard(f, tokens, 65536);
  CHECK(header_int(f, 1) == 1);
  CHECK(fs::file_size(f) == 1024 + 2 * 5);
  // Byte for byte what the uint16 writer (and llm.c) writes.
  const std::string g = dir.file("gpt2_u16.bin");
  write_shard(g, std::vector<std::uint16_t>{0, 50256, 65535, 7, 42});
  std::ifstream a(f, std::ios::binary), b(g, std::ios::binary);
  const std::string fa((std::istreambuf_iterator<char>(a)), {}), fb((std::istreambuf_iterator<char>(b)), {});
  CHECK(fa == fb);
  TokenSet set = TokenSet::from_shards(f);
  const TokenSpan seg = set.segment(0);
  CHECK(seg.width() == 2);
  REQUIRE(seg.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) CHECK(seg[i] == tokens[i]);
}

TEST_CASE("a truncated uint32 shard is refused", "[gpt][data]") {
  TempDir dir;
  SECTION("the size of a uint16 shard is not enough for version 2") {
    const std::string f = dir.file("half.bin");
    write_raw(f, {kShardMagic, kShardVersionU32, 100}, 200);  // 2 bytes a token: the uint16 size
    CHECK_THROWS_WITH(TokenSet::from_shards(f), Catch::Contains(f) && Catch::Contains("header says 100 tokens") &&
                                                    Catch::Contains("of 4 bytes (version 2)") &&
                                                    Catch::Contains("should be 1424 bytes") &&
                                                    Catch::Contains("it is 1224 bytes"));
  }
  SECTION("cut inside a token") {
    const std::string f = dir.file("cut.bin");
    write_raw(f, {kShardMagic, kShardVersionU32, 10}, 39);
    CHECK_THROWS_WITH(TokenSet::from_shards(f), Catch::Contains(f) && Catch::Contains("should be 1064 bytes") &&
                                                    Catch::Contains("it is 1063 bytes"));
  }
  SECTION("a whole file still reads") {
    const std::string f = dir.file("whole.bin");
    write_raw(f, {kShardMagic, kShardVersionU32, 10}, 40);
    CHECK(TokenSet::from_shards(f).num_tokens() == 10);
  }
}

TEST_CASE("tokens held in memory may be uint32", "[gpt][data]") {
  TokenSet set = TokenSet::from_tokens(std::vector<std::uint32_t>{70000, 70001, 70002, 70003, 70004}, "wide");
  CHECK(set.segment(0).width() == 4);
  DataLoader::Options o;
  o.seq_len = 4;
  o.vocab_size = 70005;
  DataLoader loader(set, o);
  std::vector<std::int32_t> in(4), tg(4);
  loader.read(0, 1, in.data(), tg.data());
  CHECK(in == std::vector<std::int32_t>{70000, 70001, 70002, 70003});
  CHECK(tg == std::vector<std::int32_t>{70001, 70002, 70003, 70004});
}

TEST_CASE("the embedded corpus splits 90/10 and tokenizes as bytes", "[gpt][data]") {
  const std::string path = find_shakespeare();
  REQUIRE(fs::is_regular_file(path));
  TokenSet train = TokenSet::from_text_file(path, false);
  TokenSet val = TokenSet::from_text_file(path, true);
  const auto total = static_cast<std::int64_t>(fs::file_size(path));
  CHECK(train.num_tokens() == total * 9 / 10);
  CHECK(train.num_tokens() + val.num_tokens() == total);
  const std::string head = "First Citizen";
  const TokenSpan seg = train.segment(0);
  CHECK(seg.width() == 2);
  std::vector<int> ids;
  for (std::size_t i = 0; i < head.size(); ++i) ids.push_back(static_cast<int>(seg[i]));
  CHECK(decode_bytes(ids) == head);
  CHECK(encode_bytes("Az\n") == std::vector<std::uint16_t>{65, 122, 10});
}

TEST_CASE("data that is not a regular file is refused, not read", "[gpt][data]") {
  TempDir dir;
  // A FIFO with no writer: opening it for reading would block forever.
  const std::string fifo = dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(TokenSet::from_shards(fifo), Catch::Contains(fifo) && Catch::Contains("not a regular file"));
  CHECK_THROWS_WITH(TokenSet::from_text_file(fifo, false), Catch::Contains("not a regular file"));
  // A device would be read forever.
  CHECK_THROWS_WITH(TokenSet::from_text_file("/dev/zero", false),
                    Catch::Contains("/dev/zero") && Catch::Contains("not a regular file"));
  // A directory says so (mmap would fail with "No such device") and suggests a glob.
  write_shard(dir.file("a.bin"), iota_tokens(100, 0));
  CHECK_THROWS_WITH(TokenSet::from_shards(dir.path.string()),
                    Catch::Contains("is a directory") && Catch::Contains("/*.bin"));
  CHECK_THROWS_WITH(TokenSet::from_text_file(dir.path.string(), false), Catch::Contains("is a directory"));
  CHECK(TokenSet::from_shards(dir.file("*.bin")).num_tokens() == 100);
}

TEST_CASE("a data position outside int64 is refused", "[gpt][data]") {
  TokenSet set = TokenSet::from_tokens(iota_tokens(200, 0), "t");
  DataLoader::Options o;
  o.batch = 4;
  o.seq_len = 8;
  o.world = 2;
  DataLoader loader(set, o);
  CHECK_THROWS_WITH(loader.seek(-1), Catch::Contains("seek"));
  CHECK_THROWS_WITH(loader.seek(std::int64_t{1} << 61), Catch::Contains("seek"));
  loader.seek(1000);
  CHECK(loader.micro_step() == 1000);
}
