// The CUDA attention kernel bodies (examples/gpt/cuda/attention_forward.cuh and
// attention_backward.cuh) run on the host, unchanged, over the warp emulator of their primitives
// (warp_emulator.hpp), against the double reference within the bounds of the GPU test
// (test/support/attention_reference.hpp; test/gpu/test_gpt_attention.cpp is this test's twin on
// the device, with the same cases and flow). First the emulator itself, against the PTX ISA's
// fragment tables written out again here: ldmatrix (plain and .trans) feeding mma m16n8k16 on
// small integers (exact in fp32), shfl_xor, the barriers, the grid, and the misuse it reports.
// Every case runs again under other thread schedules (emulator::Order), two of them with the warps
// a barrier interval apart: a missing barrier would change some bits. Grouped-query and ALiBi
// shapes are compared with the host kernels' double instantiation by relative norm.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "warp_emulator.hpp"  // first: the kernel bodies find the primitives here
#include "attention_reference.hpp"
#include "gpt/cuda/attention_backward.cuh"
#include "gpt/cuda/attention_forward.cuh"

namespace attn = zero::gpt::cuda::attn;
namespace at = zero::gpt::attention_test;
namespace emu = attn::emulator;
using Catch::Matchers::Contains;
using zero::gpt::cuda::bf16;

namespace {

constexpr int kLanes = 32;

// The scheduler's order for one scope.
class OrderScope {
 public:
  explicit OrderScope(emu::Order o) : saved_(emu::order()) { emu::set_order(o); }
  ~OrderScope() { emu::set_order(saved_); }
  OrderScope(const OrderScope&) = delete;
  OrderScope& operator=(const OrderScope&) = delete;

 private:
  emu::Order saved_;
};

std::uint32_t pack(float low, float high) {
  return std::uint32_t{zero::f32_to_bf16_bits(low)} | (std::uint32_t{zero::f32_to_bf16_bits(high)} << 16);
}
void put_bf16(unsigned char* smem, int element, float v) {
  const std::uint16_t b = zero::f32_to_bf16_bits(v);
  std::memcpy(smem + 2 * element, &b, 2);
}

// The self-test's operands: every element distinct, integers of at most 8 bits, so products and
// sums are exact in fp32 and a misplaced element changes the result.
float a_value(int i, int k) { return static_cast<float>(16 * i + k - 128); }  // A [16][16]
float b_value(int k, int n) { return static_cast<float>(16 * k + n - 100); }  // B [16 k][16 n]
float c_value(int i, int n) { return static_cast<float>(3 * i - 2 * n); }     // C [16][8]
double ab(int i, int n) {
  double s = 0;
  for (int k = 0; k < 16; ++k) s += static_cast<double>(a_value(i, k)) * b_value(k, n);
  return s;
}

// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (g = groupID = lane >> 2,
// t = threadID_in_group = lane % 4), element i of each operand, two bf16 per register low first:
//   A: row g for 0 <= i < 2 || 4 <= i < 6, else g + 8; col 2t + (i & 1), + 8 for i >= 4.
//   B: row 2t + (i & 1), + 8 for i >= 2; col g.      C/D: row g for i < 2, else g + 8; col 2t + (i & 1).
int a_row(int lane, int i) { return (i < 2 || (i >= 4 && i < 6)) ? lane / 4 : lane / 4 + 8; }
int a_col(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 4 ? 8 : 0); }
int b_row(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0); }
int b_col(int lane) { return lane / 4; }
int c_row(int lane, int i) { return i < 2 ? lane / 4 : lane / 4 + 8; }
int c_col(int lane, int i) { return (lane % 4) * 2 + (i & 1); }

struct LaneOut {
  std::uint32_t a[4], bn[4], bk[4];  // A; B from [n][k] rows (plain); B from [k][n] rows (.trans)
  float dn[2][4], dk[2][4];          // A.B, n-tiles 0 and 1, from each B load
  float dc[4];                       // C + A.B, n-tile 0
};

// One block: A, B as [n][k] and B as [k][n] in shared memory (rows padded to 24 elements), each
// warp loads them with ldmatrix as the kernels do and multiplies.
std::vector<LaneOut> fragment_products() {
  constexpr int ld = 24, a_at = 0, bn_at = 16 * ld, bk_at = 32 * ld;
  std::vector<LaneOut> got(attn::kThreads);
  attn::run_grid({1, 1}, 48 * ld * sizeof(bf16), [&](const attn::Cta& c) {
    for (int e = c.thread; e < 256; e += attn::kThreads) {
      const int r = e / 16, col = e % 16;
      put_bf16(c.smem, a_at + r * ld + col, a_value(r, col));
      put_bf16(c.smem, bn_at + r * ld + col, b_value(col, r));  // row n, column k
      put_bf16(c.smem, bk_at + r * ld + col, b_value(r, col));  // row k, column n
    }
    attn::cta_sync();
    const auto* s = reinterpret_cast<const bf16*>(c.smem);
    const int lane = c.thread % kLanes, m = lane / 8;
    LaneOut& o = got[c.thread];
    // A: lanes 0-15 rows 0-15 at column 0, lanes 16-31 the same rows at column 8.
    attn::ldsm_x4(o.a, s + a_at + (lane % 16) * ld + 8 * (lane / 16));
    // Matrix m: n rows 8 (m / 2) .., k columns 8 (m % 2) ..  /  k rows 8 (m % 2) .., n columns 8 (m / 2) ..
    attn::ldsm_x4(o.bn, s + bn_at + (8 * (m / 2) + lane % 8) * ld + 8 * (m % 2));
    attn::ldsm_x4_t(o.bk, s + bk_at + (8 * (m % 2) + lane % 8) * ld + 8 * (m / 2));
    for (int j = 0; j < 2; ++j) {
      const std::uint32_t bn[2] = {o.bn[2 * j], o.bn[2 * j + 1]}, bk[2] = {o.bk[2 * j], o.bk[2 * j + 1]};
      for (int i = 0; i < 4; ++i) o.dn[j][i] = o.dk[j][i] = 0.0f;
      attn::mma_bf16(o.dn[j], o.a, bn);
      attn::mma_bf16(o.dk[j], o.a, bk);
    }
    for (int i = 0; i < 4; ++i) o.dc[i] = c_value(c_row(lane, i), c_col(lane, i));
    const std::uint32_t b0[2] = {o.bn[0], o.bn[1]};
    attn::mma_bf16(o.dc, o.a, b0);
  });
  return got;
}

void check_fragments(const std::vector<LaneOut>& got) {
  for (int thread = 0; thread < attn::kThreads; ++thread) {
    const int lane = thread % kLanes;
    INFO("thread " << thread << " (lane " << lane << ")");
    const LaneOut& o = got[thread];
    for (int r = 0; r < 4; ++r)  // register r holds a_{2r} (low) and a_{2r+1}
      CHECK(o.a[r] == pack(a_value(a_row(lane, 2 * r), a_col(lane, 2 * r)),
                           a_value(a_row(lane, 2 * r + 1), a_col(lane, 2 * r + 1))));
    for (int j = 0; j < 2; ++j) {
      const int n = 8 * j + b_col(lane);
      for (int r = 0; r < 2; ++r) {  // register r holds b_{2r}, b_{2r+1} of n-tile j
        const std::uint32_t want = pack(b_value(b_row(lane, 2 * r), n), b_value(b_row(lane, 2 * r + 1), n));
        CHECK(o.bn[2 * j + r] == want);
        CHECK(o.bk[2 * j + r] == want);
      }
      for (int i = 0; i < 4; ++i) {
        const double want = ab(c_row(lane, i), 8 * j + c_col(lane, i));
        CHECK(o.dn[j][i] == want);
        CHECK(o.dk[j][i] == want);
      }
    }
    for (int i = 0; i < 4; ++i)
      CHECK(o.dc[i] == c_value(c_row(lane, i), c_col(lane, i)) + ab(c_row(lane, i), c_col(lane, i)));
  }
}

}  // namespace

TEST_CASE("emulated ldmatrix and mma follow the PTX fragment tables", "[attention][emulator]") {
  SECTION("threads resumed in ascending order") {
    const std::uint64_t before = emu::collectives();
    check_fragments(fragment_products());
    // One cta_sync, then per warp 3 loads and 5 products, each one collective.
    CHECK(emu::collectives() - before == 1 + 4 * 8);
  }
  SECTION("threads resumed in descending order") {
    OrderScope order(emu::Order::descending);
    check_fragments(fragment_products());
  }
}

TEST_CASE("emulated shuffles, barriers and grid", "[attention][emulator]") {
  SECTION("shfl_xor reads lane ^ mask of its own warp") {
    std::vector<float> got(attn::kThreads * 7);
    attn::run_grid({1, 1}, 0, [&](const attn::Cta& c) {
      const int masks[6] = {1, 2, 4, 8, 16, 31};
      for (int k = 0; k < 6; ++k) got[c.thread * 7 + k] = attn::shfl_xor(c.thread + 0.5f, masks[k]);
      float s = static_cast<float>(c.thread % kLanes);  // butterfly sum over the warp
      for (int mask = 16; mask >= 1; mask /= 2) s += attn::shfl_xor(s, mask);
      got[c.thread * 7 + 6] = s;
    });
    const int masks[6] = {1, 2, 4, 8, 16, 31};
    for (int t = 0; t < attn::kThreads; ++t) {
      INFO("thread " << t);
      const int warp0 = t - t % kLanes;
      for (int k = 0; k < 6; ++k) CHECK(got[t * 7 + k] == warp0 + ((t % kLanes) ^ masks[k]) + 0.5f);
      CHECK(got[t * 7 + 6] == 496.0f);
    }
  }
  SECTION("cta_sync orders the block's shared writes before its reads, warp_sync the warp's") {
    std::vector<int> bad(attn::kThreads, 0);
    attn::run_grid({1, 1}, attn::kThreads * sizeof(int), [&](const attn::Cta& c) {
      int* slot = reinterpret_cast<int*>(c.smem);
      for (int round = 1; round <= 3; ++round) {
        slot[c.thread] = 1000 * round + c.thread;
        attn::cta_sync();
        const int other = (37 * c.thread + 11 * round) % attn::kThreads;
        bad[c.thread] += slot[other] != 1000 * round + other;
        attn::cta_sync();
      }
      const int lane = c.thread % kLanes, mate = c.thread - lane + (lane + 1) % kLanes;
      slot[c.thread] = -c.thread;
      attn::warp_sync();
      bad[c.thread] += slot[mate] != -mate;
    });
    for (int t = 0; t < attn::kThreads; ++t) CHECK(bad[t] == 0);
  }
  SECTION("every thread of every block once; shared memory 0xFF at each block's start") {
    constexpr int gx = 3, gy = 2;
    std::vector<int> seen(gx * gy * attn::kThreads, 0);
    int fresh = 0;
    attn::run_grid({gx, gy}, 64, [&](const attn::Cta& c) {
      if (c.grid_x == gx && c.block_x < gx && c.block_y < gy)
        ++seen[(c.block_y * gx + c.block_x) * attn::kThreads + c.thread];
      if (c.thread == 0) {
        bool all_ff = true;
        for (int k = 0; k < 64; ++k) all_ff = all_ff && c.smem[k] == 0xff;
        fresh += all_ff;
        std::memset(c.smem, 0, 64);  // the next block must not see this
      }
    });
    CHECK(fresh == gx * gy);
    for (int v : seen) CHECK(v == 1);
  }
  SECTION("an unwritten shared element reads as a bf16 NaN") {
    std::uint16_t bits = 0;
    attn::run_grid({1, 1}, 256, [&](const attn::Cta& c) {
      if (c.thread == 5) std::memcpy(&bits, c.smem + 32, 2);
    });
    CHECK(bits == 0xffff);
    CHECK(std::isnan(zero::bf16_bits_to_f32(bits)));
  }
  SECTION("a missing barrier shows as a difference between the two orders") {
    auto racy = [] {
      int seen = 0;
      attn::run_grid({1, 1}, 16, [&](const attn::Cta& c) {
        if (c.thread == 0) c.smem[0] = 1;  // warp 0 writes, warp 1 reads, no cta_sync between
        if (c.thread == 32) seen = c.smem[0];
      });
      return seen;
    };
    const int up = racy();
    OrderScope order(emu::Order::descending);
    CHECK(racy() != up);
  }
}

TEST_CASE("the emulator reports misuse instead of hanging", "[attention][emulator]") {
  auto lane_of = [](const attn::Cta& c) { return c.thread % kLanes; };
  CHECK_THROWS_WITH(attn::run_grid({1, 1}, 0,
                                   [&](const attn::Cta& c) {
                                     if (lane_of(c) < 16)
                                       attn::warp_sync();
                                     else
                                       attn::shfl_xor(1.0f, 1);
                                   }),
                    Contains("diverged") && Contains("warp_sync") && Contains("shfl_xor"));
  CHECK_THROWS_WITH(attn::run_grid({2, 1}, 0,
                                   [&](const attn::Cta& c) {
                                     if (c.block_x == 1 && c.thread == 37) return;
                                     attn::warp_sync();
                                   }),
                    Contains("block (1, 0)") && Contains("warp 1") && Contains("exited"));
  CHECK_THROWS_WITH(attn::run_grid({1, 1}, 0,
                                   [&](const attn::Cta& c) {
                                     if (c.thread >= kLanes) attn::cta_sync();
                                   }),
                    Contains("cta_sync") && Contains("exited"));
  CHECK_THROWS_WITH(attn::run_grid({1, 1}, 0, [&](const attn::Cta&) { attn::shfl_xor(1.0f, 32); }),
                    Contains("lane mask 32"));
  std::uint32_t r[4];
  CHECK_THROWS_WITH(attn::run_grid({1, 1}, 1024,
                                   [&](const attn::Cta& c) {
                                     const auto* s = reinterpret_cast<const bf16*>(c.smem);
                                     attn::ldsm_x4(r, s + 8 * lane_of(c) + (lane_of(c) == 3 ? 4 : 0));
                                   }),
                    Contains("ldsm_x4: lane 3 of warp 0") && Contains("not 16-byte aligned"));
  CHECK_THROWS_WITH(attn::run_grid({1, 1}, 512,
                                   [&](const attn::Cta& c) {
                                     const auto* s = reinterpret_cast<const bf16*>(c.smem);
                                     attn::ldsm_x4_t(r, s + 8 * lane_of(c));      // lane 31: bytes 496..511
                                     attn::ldsm_x4_t(r, s + 8 * lane_of(c) + 8);  // lane 31 past the end
                                   }),
                    Contains("ldsm_x4_t: lane 31") && Contains("inside the block's 512 bytes"));
  CHECK_THROWS_WITH(attn::run_grid({1, 1}, 0,
                                   [&](const attn::Cta& c) {
                                     attn::warp_sync();
                                     if (c.thread == 77) throw std::runtime_error("boom");
                                     attn::cta_sync();
                                   }),
                    Contains("thread 77 threw: boom"));
  // Still usable afterwards.
  int ran = 0;
  attn::run_grid({1, 1}, 0, [&](const attn::Cta&) {
    attn::cta_sync();
    ++ran;
  });
  CHECK(ran == attn::kThreads);
}

// --- the attention kernels ---

namespace {

bf16* as_bf16(std::uint16_t* p) { return reinterpret_cast<bf16*>(p); }
const bf16* as_bf16(const std::uint16_t* p) { return reinterpret_cast<const bf16*>(p); }

struct Results {
  std::vector<std::uint16_t> out;   // [B,T,C] bf16
  std::vector<float> lse;           // [B,NH,T]
  std::vector<std::uint16_t> dqkv;  // [B,T,3C] bf16, dqkv0 + gradient
};

// The forward, then the backward on its out and lse (drow, dkdv, dq), as attention.cu launches
// them, on bf16 bits: qkv [B,T,(NH+2NKV)hs], dout [B,T,NH hs], dqkv0 like qkv. Outputs start as
// NaNs, so an element no thread writes fails the check.
template <int HS>
Results run_kernels(const zero::gpt::AttentionShape& s, const std::vector<std::uint16_t>& qkv,
                    const std::vector<std::uint16_t>& dout, const std::vector<std::uint16_t>& dqkv0) {
  const int B = s.B;
  const attn::Heads g{s.T, s.NH, s.NKV, s.alibi_heads, s.head0};
  const float scale = attn::scale_of(HS), scale_log2 = scale * attn::kLog2e;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::size_t n_rows = static_cast<std::size_t>(B) * s.NH * s.T;
  Results r{std::vector<std::uint16_t>(dout.size(), 0xffff), std::vector<float>(n_rows, nan), dqkv0};
  std::vector<float> drow(n_rows, nan);

  attn::run_grid(attn::forward_grid(B, g), attn::Smem<HS>::fwd_bytes, [&](const attn::Cta& cta) {
    attn::forward_cta<HS>(cta, as_bf16(r.out.data()), r.lse.data(), as_bf16(qkv.data()), g, scale_log2);
  });
  attn::run_grid(attn::drow_grid(B, g), attn::Smem<HS>::bwd_bytes, [&](const attn::Cta& cta) {
    attn::drow_cta<HS>(cta, drow.data(), as_bf16(dout.data()), as_bf16(r.out.data()), g, B);
  });
  attn::run_grid(attn::dkdv_grid(B, g), attn::Smem<HS>::bwd_bytes, [&](const attn::Cta& cta) {
    attn::dkdv_cta<HS>(cta, as_bf16(r.dqkv.data()), as_bf16(dout.data()), as_bf16(qkv.data()), r.lse.data(),
                       drow.data(), g, scale, scale_log2);
  });
  attn::run_grid(attn::dq_grid(B, g), attn::Smem<HS>::bwd_bytes, [&](const attn::Cta& cta) {
    attn::dq_cta<HS>(cta, as_bf16(r.dqkv.data()), as_bf16(dout.data()), as_bf16(qkv.data()), r.lse.data(), drow.data(),
                     g, scale, scale_log2);
  });
  return r;
}

Results run_kernels_for(const zero::gpt::AttentionShape& s, const std::vector<float>& qkv,
                        const std::vector<float>& dout, const std::vector<float>& dqkv0) {
  const std::vector<std::uint16_t> q = at::to_bits(qkv), d = at::to_bits(dout), d0 = at::to_bits(dqkv0);
  switch (s.hs) {
    case 32: return run_kernels<32>(s, q, d, d0);
    case 64: return run_kernels<64>(s, q, d, d0);
    case 128: return run_kernels<128>(s, q, d, d0);
    default: FAIL("head size " << s.hs << " has no kernel");
  }
  return {};
}

Results run_kernels_for(const at::Case& c) { return run_kernels_for(c.shape(), c.qkv, c.dout, c.dqkv0); }

void run_case(int B, int T, int C, int NH, std::uint64_t seed, float q_scale = 1.0f) {
  INFO("B=" << B << " T=" << T << " C=" << C << " NH=" << NH << " q_scale=" << q_scale);
  const at::Case c = at::make_case(B, T, C, NH, seed, q_scale);
  const at::Expect e = at::expect(c);
  const Results got = run_kernels_for(c);

  const at::Check co = at::check(at::from_bits(got.out), e.out, e.out_tol, "out");
  const at::Check cl = at::check(got.lse, e.lse, e.lse_tol, "lse");
  INFO("forward worst error / bound: out " << co.worst_ratio << ", lse " << cl.worst_ratio);
  INFO(co.first << " " << cl.first);
  CHECK(co.bad == 0);
  CHECK(cl.bad == 0);
  const at::Check cg = at::check(at::from_bits(got.dqkv), e.dqkv, e.dqkv_tol, "dqkv");
  INFO("backward worst error / bound: dqkv " << cg.worst_ratio << " " << cg.first);
  CHECK(cg.bad == 0);

  // The threads in other orders, the warps in step or a barrier interval apart: the same bits,
  // or some barrier is missing.
  for (const emu::Order o : {emu::Order::descending, emu::Order::warp_by_warp, emu::Order::warp_by_warp_reversed}) {
    INFO("scheduling order " << static_cast<int>(o));
    OrderScope order(o);
    const Results again = run_kernels_for(c);
    CHECK(got.out == again.out);
    CHECK(std::memcmp(got.lse.data(), again.lse.data(), got.lse.size() * sizeof(float)) == 0);
    CHECK(got.dqkv == again.dqkv);
  }
}

}  // namespace

TEST_CASE("emulated attention kernels match the double reference", "[attention]") {
  for (const at::KernelCase& k : at::kKernelCases) {
    DYNAMIC_SECTION(k.name) { run_case(k.B, k.T, k.C, k.NH, k.seed, k.q_scale); }
  }
}

// --- grouped-query and ALiBi attention ---

namespace {

// ||got - want|| / ||want|| over the elements [begin, end) of each row of width W.
double relative_error(const std::vector<float>& got, const std::vector<double>& want, std::size_t rows, std::size_t W,
                      std::size_t begin, std::size_t end, const std::vector<double>& base) {
  double num = 0, den = 0;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = begin; c < end; ++c) {
      const std::size_t k = r * W + c;
      const double w = want[k] - base[k], d = static_cast<double>(got[k]) - base[k] - w;
      num += d * d;
      den += w * w;
    }
  return std::sqrt(num / den);
}

// The kernels on a shape with NKV < NH and/or ALiBi against the host kernels' double
// instantiation (the reference semantics of both). The per-element bounds of attention_reference
// assume NKV = NH without ALiBi, so this compares norms, as test_gpt_arch_ops does on the GPU: a
// key/value head taken from the wrong group or a misplaced slope moves an output by a good
// fraction of its norm, while the bf16 roundings of P, dS and the results stay near 2^-8.
void run_arch_case(const zero::gpt::AttentionShape& s, std::uint64_t seed) {
  INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV << " hs=" << s.hs
            << " alibi_heads=" << s.alibi_heads << " head0=" << s.head0);
  constexpr double kRel = 1e-2;
  const std::size_t rows = static_cast<std::size_t>(s.B) * s.T, W = s.qkv_width(), C = s.width();
  const std::vector<float> qkv = at::random_bf16(rows * W, seed, 1.0f);
  const std::vector<float> dout = at::random_bf16(rows * C, seed + 1, 1.0f);
  const std::vector<float> dqkv0 = at::random_bf16(rows * W, seed + 2, 0.5f);

  const std::vector<double> qkv_d(qkv.begin(), qkv.end()), dout_d(dout.begin(), dout.end());
  const std::vector<double> base(dqkv0.begin(), dqkv0.end());
  std::vector<double> out(rows * C, 0.0), att(static_cast<std::size_t>(s.B) * s.NH * s.T * s.T, 0.0);
  zero::gpt::host::attention_forward<double>(out.data(), att.data(), qkv_d.data(), s);
  std::vector<double> dqkv = base, datt(att.size(), 0.0);
  zero::gpt::host::attention_backward<double>(dqkv.data(), datt.data(), dout_d.data(), qkv_d.data(), att.data(), s);

  const Results got = run_kernels_for(s, qkv, dout, dqkv0);
  const std::vector<double> zero(out.size(), 0.0);
  CHECK(relative_error(at::from_bits(got.out), out, rows, C, 0, C, zero) < kRel);
  const std::size_t k0 = static_cast<std::size_t>(s.NH) * s.hs, v0 = k0 + static_cast<std::size_t>(s.NKV) * s.hs;
  const std::vector<float> g = at::from_bits(got.dqkv);
  CHECK(relative_error(g, dqkv, rows, W, 0, k0, base) < kRel);   // dq
  CHECK(relative_error(g, dqkv, rows, W, k0, v0, base) < kRel);  // dk: summed over the group's heads
  CHECK(relative_error(g, dqkv, rows, W, v0, W, base) < kRel);   // dv

  OrderScope order(emu::Order::warp_by_warp_reversed);
  const Results again = run_kernels_for(s, qkv, dout, dqkv0);
  CHECK(got.out == again.out);
  CHECK(got.dqkv == again.dqkv);
}

zero::gpt::AttentionShape arch_shape(int B, int T, int NH, int NKV, int hs, int alibi_heads = 0, int head0 = 0) {
  return {.B = B, .T = T, .NH = NH, .NKV = NKV, .hs = hs, .alibi_heads = alibi_heads, .head0 = head0};
}

}  // namespace

TEST_CASE("emulated grouped-query and ALiBi attention match the double host kernels", "[attention]") {
  SECTION("GQA: NH 4, NKV 2, hs 64, T 100") { run_arch_case(arch_shape(2, 100, 4, 2, 64), 31); }
  SECTION("GQA: NH 4, NKV 1, hs 32, T 130") { run_arch_case(arch_shape(1, 130, 4, 1, 32), 32); }
  SECTION("GQA: NH 2, NKV 1, hs 128, T 70") { run_arch_case(arch_shape(1, 70, 2, 1, 128), 36); }
  SECTION("ALiBi: 4 of 4 heads, hs 32, T 64") { run_arch_case(arch_shape(2, 64, 4, 4, 32, 4), 33); }
  SECTION("ALiBi: heads 2..5 of 8 (a tensor rank), hs 64, T 100") {
    run_arch_case(arch_shape(1, 100, 4, 4, 64, 8, 2), 34);
  }
  SECTION("GQA and ALiBi: NH 4, NKV 2, hs 64, T 90") { run_arch_case(arch_shape(1, 90, 4, 2, 64, 4), 37); }
}
