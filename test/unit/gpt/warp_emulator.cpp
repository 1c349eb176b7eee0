// The host emulator of the attention kernels' warp primitives (warp_emulator.hpp): one fiber per
// emulated thread (ucontext), a round-robin scheduler on the calling OS thread, and the
// collective operations computed once every participant has arrived.
//
// Fragment layouts, from the PTX ISA (g = lane / 4, t = lane % 4; "low" = bits 0-15 of a .b32
// register, which holds the element listed first):
//   ldmatrix .m8n8 .b16: the addresses of matrix m's rows come from lanes 8m .. 8m+7 (x4); lane l
//     receives row l / 4, columns 2t and 2t + 1 of each matrix, matrix m in register m. With
//     .trans the matrix is read column-major: the 8 addresses are its columns, so lane l
//     receives (addressed line 2t, element g) low and (line 2t + 1, element g) high.
//   mma .m16n8k16 .bf16, A (16 x 16, a0..a7 in four registers, two per register):
//     row g for a0, a1, a4, a5, g + 8 otherwise; column 2t + (i & 1), + 8 for i >= 4.
//     So register 0: (g, 2t..), 1: (g + 8, 2t..), 2: (g, 2t + 8..), 3: (g + 8, 2t + 8..).
//   B (16 x 8, b0..b3 in two registers): row (k) 2t + (i & 1), + 8 for i >= 2; column (n) g.
//   C / D (16 x 8, four .f32): row g for c0, c1, g + 8 for c2, c3; column 2t + (i & 1).
#include "warp_emulator.hpp"

#include "zero/dtype.hpp"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>

namespace zero::gpt::cuda::attn {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpCount = kThreads / kWarpSize;
static_assert(kThreads % kWarpSize == 0, "whole warps");
constexpr std::size_t kStackBytes = 256 * 1024;
constexpr std::size_t kSmemAlign = 128;

enum class Op { none, cta_sync, warp_sync, shfl_xor, ldsm, ldsm_t, mma };

const char* op_name(Op op) {
  switch (op) {
    case Op::none: return "(nothing)";
    case Op::cta_sync: return "cta_sync";
    case Op::warp_sync: return "warp_sync";
    case Op::shfl_xor: return "shfl_xor";
    case Op::ldsm: return "ldsm_x4";
    case Op::ldsm_t: return "ldsm_x4_t";
    case Op::mma: return "mma_bf16";
  }
  return "?";
}

enum class State { runnable, waiting, done };

struct Fiber {
  ucontext_t context{};
  State state = State::done;
  Op op = Op::none;
  // The operands of the primitive the fiber waits at; the pointers are into its own stack,
  // which stays put while it waits. Results are written through them (value for shfl_xor).
  float value = 0.0f;
  int lane_mask = 0;
  const void* address = nullptr;
  std::uint32_t* regs = nullptr;
  const std::uint32_t* a = nullptr;
  const std::uint32_t* b = nullptr;
  float* d = nullptr;
};

// The fibers' stacks, mapped once for the process and reused by every block, each above a
// guard page so that an overflow faults instead of corrupting its neighbour.
class Stacks {
 public:
  Stacks() : page_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE))), each_(kStackBytes + page_) {
    void* p = mmap(nullptr, each_ * kThreads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<unsigned char*>(p);
    for (int t = 0; t < kThreads; ++t) mprotect(base_ + t * each_, page_, PROT_NONE);
  }
  ~Stacks() { munmap(base_, each_ * kThreads); }
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;
  void* stack(int t) const { return base_ + t * each_ + page_; }

 private:
  std::size_t page_, each_;
  unsigned char* base_ = nullptr;
};

Stacks& stacks() {
  static Stacks s;
  return s;
}

struct Machine {
  std::array<Fiber, kThreads> fibers;
  ucontext_t scheduler{};
  int current = -1;  // the fiber running now, -1 in the scheduler
  const std::function<void(const Cta&)>* body = nullptr;
  int block_x = 0, block_y = 0, grid_x = 0;
  unsigned char* smem = nullptr;
  std::size_t smem_bytes = 0;
  std::string error;          // misuse found by the scheduler (the first)
  std::exception_ptr thrown;  // or what a body threw (the first)
  int thrown_by = -1;
  bool failed() const { return !error.empty() || thrown; }
};

Machine* g_machine = nullptr;  // the grid being run
emulator::Order g_order = emulator::Order::ascending;
std::uint64_t g_collectives = 0;

// Lanes as ranges: "0-15, 17".
std::string lane_list(const bool (&in)[kWarpSize]) {
  std::ostringstream os;
  bool first = true;
  for (int l = 0; l < kWarpSize; ++l) {
    if (!in[l]) continue;
    int e = l;
    while (e + 1 < kWarpSize && in[e + 1]) ++e;
    os << (first ? "" : ", ") << l;
    if (e > l) os << "-" << e;
    first = false;
    l = e;
  }
  return os.str();
}

void fiber_main(int t) {
  Machine& m = *g_machine;
  try {
    const Cta cta{t, m.block_x, m.block_y, m.grid_x, m.smem};
    (*m.body)(cta);
  } catch (...) {
    // Exceptions must not leave the fiber (its stack ends here): keep the first for run_grid.
    if (!m.failed()) {
      m.thrown = std::current_exception();
      m.thrown_by = t;
    }
  }
  m.fibers[t].state = State::done;
}  // back to the scheduler (uc_link)

Machine& running(const char* what) {
  if (g_machine == nullptr || g_machine->current < 0) {
    std::fprintf(stderr, "warp emulator: %s called outside run_grid\n", what);
    std::abort();
  }
  return *g_machine;
}

// Parks the calling fiber at `op` until the scheduler has computed the primitive.
Fiber& wait_at(Op op) {
  Machine& m = running(op_name(op));
  Fiber& f = m.fibers[m.current];
  f.op = op;
  f.state = State::waiting;
  swapcontext(&f.context, &m.scheduler);
  return f;
}

float low_value(std::uint32_t r) { return bf16_bits_to_f32(static_cast<std::uint16_t>(r & 0xffffu)); }
float high_value(std::uint32_t r) { return bf16_bits_to_f32(static_cast<std::uint16_t>(r >> 16)); }

// The collective of warp w, every lane at `op`; false (and m.error set) on misuse.
bool compute_warp(Machine& m, int w, Op op) {
  Fiber* lane = &m.fibers[w * kWarpSize];
  std::ostringstream err;
  switch (op) {
    case Op::warp_sync: return true;
    case Op::shfl_xor: {
      float got[kWarpSize];
      for (int l = 0; l < kWarpSize; ++l) {
        const int mask = lane[l].lane_mask;
        if (mask < 0 || mask >= kWarpSize) {
          err << "shfl_xor: lane " << l << " of warp " << w << " passes lane mask " << mask << ", not in 0..31";
          m.error = err.str();
          return false;
        }
        got[l] = lane[l ^ mask].value;
      }
      for (int l = 0; l < kWarpSize; ++l) lane[l].value = got[l];
      return true;
    }
    case Op::ldsm:
    case Op::ldsm_t: {
      // Every lane's address is the start of one 16-byte row (x4: all 32 are used).
      std::uint16_t rows[kWarpSize][8];
      const auto lo = reinterpret_cast<std::uintptr_t>(m.smem);
      for (int l = 0; l < kWarpSize; ++l) {
        const auto at = reinterpret_cast<std::uintptr_t>(lane[l].address);
        const bool aligned = at % 16 == 0;
        const bool inside = at >= lo && at - lo + 16 <= m.smem_bytes;
        if (!aligned || !inside) {
          err << op_name(op) << ": lane " << l << " of warp " << w << " passes ";
          if (at >= lo && at - lo < m.smem_bytes)
            err << "shared byte offset " << (at - lo);
          else
            err << "address " << lane[l].address;
          if (!aligned) err << ", not 16-byte aligned";
          if (!inside) err << ", not a 16-byte row inside the block's " << m.smem_bytes << " bytes of shared memory";
          m.error = err.str();
          return false;
        }
        std::memcpy(rows[l], lane[l].address, 16);
      }
      for (int l = 0; l < kWarpSize; ++l) {
        const int g = l / 4, t = l % 4;
        for (int mat = 0; mat < 4; ++mat) {
          const std::uint16_t(*r)[8] = &rows[8 * mat];  // the matrix's 8 addressed rows
          const std::uint32_t low = op == Op::ldsm ? r[g][2 * t] : r[2 * t][g];
          const std::uint32_t high = op == Op::ldsm ? r[g][2 * t + 1] : r[2 * t + 1][g];
          lane[l].regs[mat] = low | (high << 16);
        }
      }
      return true;
    }
    case Op::mma: {
      float A[16][16], B[16][8], D[16][8];
      for (int l = 0; l < kWarpSize; ++l) {
        const int g = l / 4, t = l % 4;
        const std::uint32_t* a = lane[l].a;
        const std::uint32_t* b = lane[l].b;
        const float* d = lane[l].d;
        const int ar[4] = {g, g + 8, g, g + 8}, ac[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int i = 0; i < 4; ++i) {
          A[ar[i]][ac[i]] = low_value(a[i]);
          A[ar[i]][ac[i] + 1] = high_value(a[i]);
        }
        for (int i = 0; i < 2; ++i) {
          B[2 * t + 8 * i][g] = low_value(b[i]);
          B[2 * t + 8 * i + 1][g] = high_value(b[i]);
        }
        D[g][2 * t] = d[0];
        D[g][2 * t + 1] = d[1];
        D[g + 8][2 * t] = d[2];
        D[g + 8][2 * t + 1] = d[3];
      }
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) {
          float s = 0.0f;  // bf16 x bf16 products are exact in fp32; the sum rounds in k order
          for (int k = 0; k < 16; ++k) s += A[i][k] * B[k][j];
          D[i][j] += s;
        }
      for (int l = 0; l < kWarpSize; ++l) {
        const int g = l / 4, t = l % 4;
        float* d = lane[l].d;
        d[0] = D[g][2 * t];
        d[1] = D[g][2 * t + 1];
        d[2] = D[g + 8][2 * t];
        d[3] = D[g + 8][2 * t + 1];
      }
      return true;
    }
    case Op::cta_sync:
    case Op::none: break;
  }
  m.error = "internal: no warp collective to compute";
  return false;
}

enum class WarpState { finished, at_barrier, released, failed };

// After every fiber has stopped: the warp's lanes all at one primitive (computed and released,
// or at the block barrier), all finished, or misused.
WarpState settle_warp(Machine& m, int w) {
  Fiber* lane = &m.fibers[w * kWarpSize];
  bool done[kWarpSize] = {}, waiting[kWarpSize] = {};
  int n_done = 0;
  Op op = Op::none;
  int first = -1;
  for (int l = 0; l < kWarpSize; ++l) {
    if (lane[l].state == State::done) {
      done[l] = true;
      ++n_done;
      continue;
    }
    waiting[l] = true;
    if (first < 0) {
      first = l;
      op = lane[l].op;
    } else if (lane[l].op != op) {
      bool same[kWarpSize] = {}, other[kWarpSize] = {};
      for (int k = 0; k < kWarpSize; ++k) {
        if (lane[k].state != State::waiting) continue;
        (lane[k].op == op ? same : other)[k] = true;
      }
      std::ostringstream err;
      err << "warp " << w << " diverged: lanes " << lane_list(same) << " wait at " << op_name(op) << ", lanes "
          << lane_list(other) << " at " << op_name(lane[l].op) << " (lane " << l << ")";
      m.error = err.str();
      return WarpState::failed;
    }
  }
  if (n_done == kWarpSize) return WarpState::finished;
  if (n_done > 0) {
    std::ostringstream err;
    err << "warp " << w << ": lanes " << lane_list(waiting) << " wait at " << op_name(op) << " but lanes "
        << lane_list(done) << " have exited";
    m.error = err.str();
    return WarpState::failed;
  }
  if (op == Op::cta_sync) return WarpState::at_barrier;
  if (!compute_warp(m, w, op)) return WarpState::failed;
  ++g_collectives;
  for (int l = 0; l < kWarpSize; ++l) lane[l].state = State::runnable;
  return WarpState::released;
}

// One block, start to end (or to the first error).
void run_block(Machine& m) {
  for (int t = 0; t < kThreads; ++t) {
    Fiber& f = m.fibers[t];
    f = Fiber{};
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stacks().stack(t);
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &m.scheduler;
    makecontext(&f.context, reinterpret_cast<void (*)()>(&fiber_main), 1, t);
    f.state = State::runnable;
  }
  const bool up = g_order == emulator::Order::ascending || g_order == emulator::Order::warp_by_warp;
  const bool by_warp = g_order == emulator::Order::warp_by_warp || g_order == emulator::Order::warp_by_warp_reversed;
  // Runs every runnable fiber of warps first .. last - 1 to its next primitive (or its end).
  auto run_fibers = [&](int first, int last) {
    const int n = (last - first) * kWarpSize;
    for (int i = 0; i < n; ++i) {
      const int t = first * kWarpSize + (up ? i : n - 1 - i);
      Fiber& f = m.fibers[t];
      if (f.state != State::runnable) continue;
      f.op = Op::none;
      m.current = t;
      swapcontext(&m.scheduler, &f.context);
      m.current = -1;
      if (m.failed()) return false;
    }
    return true;
  };
  std::array<WarpState, kWarpCount> warps;
  warps.fill(WarpState::released);
  for (;;) {
    if (by_warp) {
      // One warp at a time, as far as it goes: the first (in order) that is neither at the
      // barrier nor finished runs until it is, so the others lag a whole barrier interval behind.
      int w = -1;
      for (int i = 0; i < kWarpCount && w < 0; ++i) {
        const int c = up ? i : kWarpCount - 1 - i;
        if (warps[c] == WarpState::released) w = c;
      }
      if (w >= 0) {
        if (!run_fibers(w, w + 1)) return;
        warps[w] = settle_warp(m, w);
        if (warps[w] == WarpState::failed) return;
        continue;
      }
    } else {
      if (!run_fibers(0, kWarpCount)) return;
      for (int w = 0; w < kWarpCount; ++w) {
        warps[w] = settle_warp(m, w);
        if (warps[w] == WarpState::failed) return;
      }
    }
    int finished = 0, at_barrier = 0, released = 0;
    for (const WarpState ws : warps) {
      finished += ws == WarpState::finished;
      at_barrier += ws == WarpState::at_barrier;
      released += ws == WarpState::released;
    }
    if (finished == kWarpCount) return;
    if (at_barrier == kWarpCount) {
      ++g_collectives;
      for (Fiber& f : m.fibers) f.state = State::runnable;
      warps.fill(WarpState::released);
    } else if (at_barrier > 0 && released == 0) {
      // The barrier can never complete: the other warps have exited.
      std::ostringstream err;
      err << "cta_sync: " << at_barrier << " of " << kWarpCount << " warps wait at it, the other " << finished
          << " have exited";
      m.error = err.str();
      return;
    }
  }
}

struct AlignedDelete {
  void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{kSmemAlign}); }
};

}  // namespace

void cta_sync() { wait_at(Op::cta_sync); }

void warp_sync() { wait_at(Op::warp_sync); }

float shfl_xor(float v, int lane_mask) {
  Machine& m = running("shfl_xor");
  Fiber& f = m.fibers[m.current];
  f.value = v;
  f.lane_mask = lane_mask;
  return wait_at(Op::shfl_xor).value;
}

namespace {

void load_matrices(std::uint32_t (&r)[4], const bf16* row, Op op) {
  Machine& m = running(op_name(op));
  Fiber& f = m.fibers[m.current];
  f.address = row;
  f.regs = r;
  wait_at(op);
}

}  // namespace

void ldsm_x4(std::uint32_t (&r)[4], const bf16* row) { load_matrices(r, row, Op::ldsm); }

void ldsm_x4_t(std::uint32_t (&r)[4], const bf16* row) { load_matrices(r, row, Op::ldsm_t); }

void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  Machine& m = running("mma_bf16");
  Fiber& f = m.fibers[m.current];
  f.a = a;
  f.b = b;
  f.d = d;
  wait_at(Op::mma);
}

void run_grid(Grid grid, std::size_t smem_bytes, const std::function<void(const Cta&)>& body) {
  if (g_machine != nullptr) throw std::logic_error("warp emulator: run_grid called inside run_grid");
  if (grid.x < 0 || grid.y < 0) throw std::invalid_argument("warp emulator: negative grid");
  auto machine = std::make_unique<Machine>();
  Machine& m = *machine;
  std::unique_ptr<unsigned char[], AlignedDelete> smem(static_cast<unsigned char*>(
      ::operator new[](std::max<std::size_t>(smem_bytes, 1), std::align_val_t{kSmemAlign})));
  m.body = &body;
  m.grid_x = grid.x;
  m.smem = smem.get();
  m.smem_bytes = smem_bytes;
  stacks();  // mapped before the first fiber needs one
  struct Reset {
    ~Reset() { g_machine = nullptr; }
  } reset;
  g_machine = &m;
  for (int y = 0; y < grid.y; ++y) {
    for (int x = 0; x < grid.x; ++x) {
      std::memset(m.smem, 0xff, smem_bytes);
      m.block_x = x;
      m.block_y = y;
      run_block(m);
      if (!m.failed()) continue;
      std::ostringstream where;
      where << "warp emulator, block (" << x << ", " << y << ") of (" << grid.x << ", " << grid.y << ")";
      if (!m.error.empty()) throw std::runtime_error(where.str() + ": " + m.error);
      // A standard exception gets the place added; anything else (a test framework's own
      // failure, say) goes on as it is.
      try {
        std::rethrow_exception(m.thrown);
      } catch (const std::exception& e) {
        where << ", thread " << m.thrown_by << " threw: " << e.what();
        throw std::runtime_error(where.str());
      }
    }
  }
}

namespace emulator {
void set_order(Order order) { g_order = order; }
Order order() { return g_order; }
std::uint64_t collectives() { return g_collectives; }
}  // namespace emulator

}  // namespace zero::gpt::cuda::attn
