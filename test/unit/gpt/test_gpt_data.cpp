// The GPT data path: llm.c shards (format checks naming the file), sample windows that respect
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
    write_raw(f, {kShardMagic, kShardVersion, 100}, 150);
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
    write_raw(f, {20240521, kShardVersion, 10}, 20);
    CHECK_THROWS_WITH(TokenSet::from_shards(f), Catch::Contains(f) && Catch::Contains("magic 20240521"));
  }
  SECTION("wrong version") {
    const std::string f = dir.file("version.bin");
    write_raw(f, {kShardMagic, 2, 10}, 20);
    CHECK_THROWS_WITH(TokenSet::from_shards(f), Catch::Contains(f) && Catch::Contains("version 2"));
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

TEST_CASE("the embedded corpus splits 90/10 and tokenizes as bytes", "[gpt][data]") {
  const std::string path = find_shakespeare();
  REQUIRE(fs::is_regular_file(path));
  TokenSet train = TokenSet::from_text_file(path, false);
  TokenSet val = TokenSet::from_text_file(path, true);
  const auto total = static_cast<std::int64_t>(fs::file_size(path));
  CHECK(train.num_tokens() == total * 9 / 10);
  CHECK(train.num_tokens() + val.num_tokens() == total);
  const std::string head = "First Citizen";
  auto seg = train.segment(0);
  std::vector<int> ids(seg.begin(), seg.begin() + static_cast<std::ptrdiff_t>(head.size()));
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
