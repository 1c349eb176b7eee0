// Collectives of the MPI communicator against a serial computation, for sizes 0, 1, odd and
// 2^20+3, every dtype and every reduce op, blocking and with several operations in flight.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "zero/comm.hpp"
#include "zero/context.hpp"

using namespace zero;

namespace {

Communicator& comm() { return Context::current()->comm(); }

// Value of element i on rank r: multiples of 1/8 below 32, exact in bf16/fp16 and whose sums
// over four ranks are exact in fp32, so the expected 16-bit results are unambiguous.
float value(int r, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 13) % 64) - 32) / 8.0f;
}

std::vector<std::uint16_t> storage(std::size_t n, DType t) {
  return std::vector<std::uint16_t>(n * dtype_size(t) / 2 + 1);
}

float serial(ReduceOp op, std::size_t i, int world) {
  float acc = op == ReduceOp::max ? value(0, i) : 0.0f;
  for (int r = 0; r < world; ++r) acc = op == ReduceOp::max ? std::max(acc, value(r, i)) : acc + value(r, i);
  return op == ReduceOp::avg ? acc / static_cast<float>(world) : acc;
}

const std::size_t kSizes[] = {0, 1, 37, (1u << 20) + 3};

}  // namespace

TEST_CASE("all_reduce: sum, avg and max for every dtype and size") {
  int world = comm().size(), rank = comm().rank();
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
      for (std::size_t n : kSizes) {
        auto buf = storage(n, t);
        for (std::size_t i = 0; i < n; ++i) store_from_f32(buf.data(), i, t, value(rank, i));
        comm().all_reduce(buf.data(), n, t, op);
        for (std::size_t i = 0; i < n; ++i) {
          float want = round_to(t, serial(op, i, world));
          float got = load_as_f32(buf.data(), i, t);
          if (got != want) {
            INFO("dtype " << dtype_name(t) << " n " << n << " i " << i);
            REQUIRE(got == want);
          }
        }
      }
}

TEST_CASE("16-bit sums are arithmetic, not bit-pattern sums, and round once") {
  // 1 + 2^-8 on every rank: exact per rank in fp16; the fp32 sum rounds once to fp16.
  int world = comm().size();
  std::vector<std::uint16_t> h(5, f32_to_f16_bits(1.0f + 0x1p-8f));
  comm().all_reduce(h.data(), h.size(), DType::f16, ReduceOp::sum);
  float want = round_to(DType::f16, static_cast<float>(world) * (1.0f + 0x1p-8f));
  for (auto b : h) REQUIRE(f16_bits_to_f32(b) == want);
  std::vector<std::uint16_t> b(3, f32_to_bf16_bits(-0.375f));
  comm().all_reduce(b.data(), b.size(), DType::bf16, ReduceOp::sum);
  for (auto x : b) REQUIRE(bf16_bits_to_f32(x) == -0.375f * static_cast<float>(world));
}

TEST_CASE("reduce_scatter and all_gather for every dtype and size") {
  int world = comm().size(), rank = comm().rank();
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (std::size_t n : kSizes) {
      std::size_t total = n * static_cast<std::size_t>(world);
      auto send = storage(total, t), recv = storage(n, t);
      for (std::size_t i = 0; i < total; ++i) store_from_f32(send.data(), i, t, value(rank, i));
      comm().reduce_scatter(send.data(), recv.data(), n, t, ReduceOp::sum);
      for (std::size_t i = 0; i < n; ++i) {
        std::size_t gi = static_cast<std::size_t>(rank) * n + i;
        float got = load_as_f32(recv.data(), i, t);
        if (got != round_to(t, serial(ReduceOp::sum, gi, world))) {
          INFO("dtype " << dtype_name(t) << " n " << n << " i " << i);
          REQUIRE(got == round_to(t, serial(ReduceOp::sum, gi, world)));
        }
      }
      // all_gather of each rank's block, out of place and in place.
      for (bool in_place : {false, true}) {
        auto full = storage(total, t);
        std::size_t es = dtype_size(t);
        char* own = reinterpret_cast<char*>(full.data()) + static_cast<std::size_t>(rank) * n * es;
        for (std::size_t i = 0; i < n; ++i)
          store_from_f32(in_place ? own : static_cast<void*>(recv.data()), i, t, value(rank, i));
        comm().all_gather(in_place ? own : static_cast<void*>(recv.data()), full.data(), n, t);
        for (int r = 0; r < world; ++r)
          for (std::size_t i = 0; i < n; ++i)
            if (load_as_f32(full.data(), static_cast<std::size_t>(r) * n + i, t) != value(r, i)) {
              INFO("dtype " << dtype_name(t) << " n " << n << " rank block " << r << " i " << i);
              REQUIRE(load_as_f32(full.data(), static_cast<std::size_t>(r) * n + i, t) == value(r, i));
            }
      }
    }
}

TEST_CASE("non-blocking forms complete independently and in any order") {
  int world = comm().size(), rank = comm().rank();
  std::vector<std::vector<float>> bufs(4, std::vector<float>(1001));
  std::vector<std::vector<std::uint16_t>> half(3, std::vector<std::uint16_t>(513));
  std::vector<Work> works;
  for (std::size_t k = 0; k < bufs.size(); ++k) {
    for (std::size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = value(rank, i + k);
    works.push_back(comm().all_reduce_async(bufs[k].data(), bufs[k].size(), DType::f32, ReduceOp::sum));
  }
  for (std::size_t k = 0; k < half.size(); ++k) {
    for (std::size_t i = 0; i < half[k].size(); ++i) half[k][i] = f32_to_bf16_bits(value(rank, i + 10 * k));
    works.push_back(comm().all_reduce_async(half[k].data(), half[k].size(), DType::bf16, ReduceOp::avg));
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();  // reverse order
  for (std::size_t k = 0; k < bufs.size(); ++k)
    for (std::size_t i = 0; i < bufs[k].size(); ++i) REQUIRE(bufs[k][i] == serial(ReduceOp::sum, i + k, world));
  for (std::size_t k = 0; k < half.size(); ++k)
    for (std::size_t i = 0; i < half[k].size(); ++i)
      REQUIRE(bf16_bits_to_f32(half[k][i]) == round_to(DType::bf16, serial(ReduceOp::avg, i + 10 * k, world)));
}

TEST_CASE("broadcast, barrier and scalar reductions") {
  int world = comm().size(), rank = comm().rank();
  for (int root = 0; root < world; ++root) {
    std::vector<std::int32_t> v(17, rank == root ? root * 100 + 7 : -1);
    comm().broadcast(v.data(), v.size() * sizeof(std::int32_t), root);
    for (auto x : v) REQUIRE(x == root * 100 + 7);
  }
  comm().barrier();
  REQUIRE(comm().all_reduce_scalar(rank + 0.5, ReduceOp::max) == world - 0.5);
  REQUIRE(comm().all_reduce_scalar(1.0, ReduceOp::sum) == world);
  REQUIRE(comm().all_reduce_scalar(rank, ReduceOp::avg) == Approx((world - 1) / 2.0));
  REQUIRE_THROWS_WITH(comm().broadcast(nullptr, 0, world), Catch::Contains("is not a rank"));
}

TEST_CASE("the collective check lets agreeing ranks through and records each rank's last collectives") {
  const std::string unit = "h.7";
  std::vector<float> v(5, 1.0f);
  {
    const CommSiteScope site("my eval", &unit);
    comm().all_reduce(v.data(), v.size(), DType::f32);
  }
  comm().broadcast(v.data(), sizeof(float), 0);
  REQUIRE(v[0] == static_cast<float>(comm().size()));
  const std::string recent = comm().recent_collectives();
  INFO(recent);
  // The last two, oldest first, with their sites; earlier ones may precede them.
  const auto a = recent.find("my eval(h.7): all_reduce of 5 fp32");
  const auto b = recent.find("a direct communicator call: broadcast from rank 0 of 4 bytes");
  REQUIRE(a != std::string::npos);
  REQUIRE(b != std::string::npos);
  REQUIRE(a < b);
  REQUIRE(recent.size() - b == std::string("a direct communicator call: broadcast from rank 0 of 4 bytes").size());
  REQUIRE(comm_site().call == nullptr);  // the scope restored the default site
}
