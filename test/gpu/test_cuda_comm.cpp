// The CUDA backend's communicators (ZERO_TEST_COMM: nccl or mpi) on device buffers: every
// collective and reduction op in fp32 / bf16 / fp16 against exactly known results, in-place
// all-gather, broadcast from any root, groups, and the stream semantics of Work: a collective
// sees the compute-stream kernel that wrote its input just before the call, and compute-stream
// work enqueued after wait() sees its result, with no host synchronization in between; and
// point-to-point send/recv between device buffers in a ring; all-to-all; groups spanning two
// communicators, and a Work dropped inside its group; communicators split for sub-groups.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "spin_kernel.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"

using namespace zero;
using namespace zero::gputest;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

// Values that every dtype holds exactly, and whose sums over <= 4 ranks it holds exactly too.
float value(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 17) - 8) * 0.25f;
}

std::vector<char> filled(int rank, std::size_t n, DType t) {
  std::vector<float> f(n);
  for (std::size_t i = 0; i < n; ++i) f[i] = value(rank, i);
  return to_dtype(f, t);
}

float reduce_expect(std::size_t i, int world, ReduceOp op) {
  float s = 0.0f, mx = -1e30f;
  for (int r = 0; r < world; ++r) {
    s += value(r, i);
    mx = std::max(mx, value(r, i));
  }
  return op == ReduceOp::max ? mx : (op == ReduceOp::avg ? s / static_cast<float>(world) : s);
}

const char* op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : (op == ReduceOp::max ? "max" : "avg"); }

}  // namespace

TEST_CASE("all_reduce and reduce_scatter: every op and dtype", "[comm]") {
  auto b = backend("cuda", test_comm());
  Communicator& c = b->comm();
  const int world = c.size(), rank = c.rank();
  REQUIRE(world == ctx().world_size());
  for (DType t : kTypes)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      INFO(dtype_name(t) << " " << op_name(op) << " over " << world << " ranks via " << test_comm());
      const std::size_t n = 1003;
      Buffer buf = upload(*b, filled(rank, n, t));
      c.all_reduce(buf.get(), n, t, op);
      auto got = download<char>(*b, buf, n * dtype_size(t));
      for (std::size_t i = 0; i < n; ++i)
        REQUIRE(load_as_f32(got.data(), i, t) == round_to(t, reduce_expect(i, world, op)));

      const std::size_t block = 257;
      Buffer send = upload(*b, filled(rank, block * static_cast<std::size_t>(world), t));
      Buffer recv = b->alloc(block * dtype_size(t));
      c.reduce_scatter(send.get(), recv.get(), block, t, op);
      auto part = download<char>(*b, recv, block * dtype_size(t));
      for (std::size_t i = 0; i < block; ++i)
        REQUIRE(load_as_f32(part.data(), i, t) ==
                round_to(t, reduce_expect(static_cast<std::size_t>(rank) * block + i, world, op)));
    }
}

TEST_CASE("all_gather in place and out of place; broadcast from every root", "[comm]") {
  auto b = backend("cuda", test_comm());
  Communicator& c = b->comm();
  const int world = c.size(), rank = c.rank();
  for (DType t : kTypes) {
    const std::size_t block = 129, es = dtype_size(t);
    auto mine = filled(rank, block, t);
    Buffer send = upload(*b, mine);
    Buffer out = b->alloc(block * static_cast<std::size_t>(world) * es);
    c.all_gather(send.get(), out.get(), block, t);
    Buffer inplace = b->alloc(block * static_cast<std::size_t>(world) * es);
    b->from_host(inplace.as<char>() + static_cast<std::size_t>(rank) * block * es, mine.data(), mine.size());
    c.all_gather(inplace.as<char>() + static_cast<std::size_t>(rank) * block * es, inplace.get(), block, t);
    for (const Buffer* g : {&out, &inplace}) {
      auto all = download<char>(*b, *g, block * static_cast<std::size_t>(world) * es);
      for (int r = 0; r < world; ++r) {
        auto want = filled(r, block, t);
        REQUIRE(std::memcmp(all.data() + static_cast<std::size_t>(r) * block * es, want.data(), want.size()) == 0);
      }
    }
  }
  for (int root = 0; root < world; ++root) {
    std::vector<int> v(1000, rank == root ? 1000 + root : -1);
    Buffer buf = upload(*b, v);
    c.broadcast(buf.get(), v.size() * sizeof(int), root);
    auto got = download<int>(*b, buf, v.size());
    REQUIRE(std::all_of(got.begin(), got.end(), [&](int x) { return x == 1000 + root; }));
  }
  CHECK_THROWS_WITH(c.broadcast_async(nullptr, 4, world), Catch::Contains("not a rank"));
  CHECK(c.all_reduce_scalar(rank + 1.0, ReduceOp::sum) == world * (world + 1) / 2.0);
  c.barrier();
}

TEST_CASE("all_to_all: block j goes to rank j, in every dtype", "[comm]") {
  auto b = backend("cuda", test_comm());
  Communicator& c = b->comm();
  const int world = c.size(), rank = c.rank();
  const auto w = static_cast<std::size_t>(world);
  for (DType t : kTypes) {
    INFO(dtype_name(t) << " over " << world << " ranks via " << test_comm());
    const std::size_t count = 131, es = dtype_size(t);
    // Block j of rank r holds filled(r * world + j): each block says where it came from.
    std::vector<char> send_host;
    for (int j = 0; j < world; ++j) {
      const auto block = filled(rank * world + j, count, t);
      send_host.insert(send_host.end(), block.begin(), block.end());
    }
    Buffer send = upload(*b, send_host);
    Buffer recv = b->alloc(count * w * es);
    c.all_to_all(send.get(), recv.get(), count, t);
    auto got = download<char>(*b, recv, count * w * es);
    for (int j = 0; j < world; ++j) {
      const auto want = filled(j * world + rank, count, t);
      REQUIRE(std::memcmp(got.data() + static_cast<std::size_t>(j) * count * es, want.data(), want.size()) == 0);
    }
  }
}

TEST_CASE("point to point: a ring of sends and receives of device buffers in every dtype", "[comm]") {
  auto b = backend("cuda", test_comm());
  Communicator& c = b->comm();
  const int world = c.size(), rank = c.rank();
  if (world < 2) return;
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  for (DType t : kTypes) {
    INFO(dtype_name(t) << " over " << world << " ranks via " << test_comm());
    const std::size_t n = 777;
    Buffer send = upload(*b, filled(rank, n, t));
    Buffer recv = b->alloc(n * dtype_size(t));
    Work a, r;
    {
      // NCCL: a send and a receive toward each other must launch together, or both may wait.
      CommGroup g(c);
      r = c.recv_async(recv.get(), n, t, prev);
      a = c.send_async(send.get(), n, t, next);
      g.end();
    }
    r.wait();
    a.wait();
    auto got = download<char>(*b, recv, n * dtype_size(t));
    auto want = filled(prev, n, t);
    REQUIRE(std::memcmp(got.data(), want.data(), want.size()) == 0);
  }
  CHECK_THROWS_WITH(c.send_async(nullptr, 1, DType::f32, rank), Catch::Contains("not another rank"));
}

TEST_CASE("a group of collectives completes together; its Work waits only after group_end", "[comm]") {
  auto b = backend("cuda", test_comm());
  Communicator& c = b->comm();
  const int world = c.size(), rank = c.rank();
  const std::size_t n = 300;
  std::vector<Buffer> bufs;
  std::vector<Work> works;
  {
    CommGroup g(c);
    for (int k = 0; k < 5; ++k) {
      bufs.push_back(upload(*b, filled(rank + k, n, DType::bf16)));
      works.push_back(c.all_reduce_async(bufs.back().get(), n, DType::bf16, ReduceOp::sum));
    }
    if (test_comm() == "nccl") CHECK_THROWS_WITH(works[0].wait(), Catch::Contains("group"));
    g.end();
  }
  for (auto& w : works) w.wait();
  for (int k = 0; k < 5; ++k) {
    auto got = download<char>(*b, bufs[static_cast<std::size_t>(k)], n * 2);
    for (std::size_t i = 0; i < n; ++i) {
      float s = 0.0f;
      for (int r = 0; r < world; ++r) s += value(r + k, i);
      REQUIRE(load_as_f32(got.data(), i, DType::bf16) == s);
    }
  }
  // Nested groups launch at the outermost end; an empty group is fine; an unmatched end is not.
  c.group_begin();
  c.group_begin();
  Work w = c.all_reduce_async(bufs[0].get(), n, DType::bf16, ReduceOp::max);
  c.group_end();
  c.group_end();
  w.wait();
  { CommGroup empty(c); }
  if (test_comm() == "nccl") CHECK_THROWS_WITH(c.group_end(), Catch::Contains("group_begin"));
}

TEST_CASE("a collective on another communicator inside a group joins the group", "[comm][group]") {
  auto b = backend("cuda", test_comm());
  Communicator& c = b->comm();
  // A second device communicator over the same ranks, as hpZ's, MiCS's and qgZ's are made.
  std::unique_ptr<Communicator> other = b->group_comm(ctx().comm());
  REQUIRE(other != nullptr);
  const int world = c.size(), rank = c.rank();
  const std::size_t n = 1000;
  Buffer x = upload(*b, filled(rank, n, DType::f32));
  Buffer y = upload(*b, filled(rank + 1, n, DType::f32));
  Work wx, wy;
  {
    CommGroup g(c);
    wx = c.all_reduce_async(x.get(), n, DType::f32, ReduceOp::sum);
    // NCCL's group is the thread's: the other communicator's collective is launched at this
    // group's end too, so its Work cannot complete (or be waited on) before then either.
    wy = other->all_reduce_async(y.get(), n, DType::f32, ReduceOp::avg);
    if (test_comm() == "nccl") CHECK_THROWS_WITH(wy.wait(), Catch::Contains("still open"));
    g.end();
  }
  wy.wait();
  wx.wait();
  auto gx = download<float>(*b, x, n);
  auto gy = download<float>(*b, y, n);
  for (std::size_t i = 0; i < n; ++i) {
    float sx = 0.0f, sy = 0.0f;
    for (int r = 0; r < world; ++r) {
      sx += value(r, i);
      sy += value(r + 1, i);
    }
    REQUIRE(gx[i] == sx);
    REQUIRE(gy[i] == sy / static_cast<float>(world));
  }
}

TEST_CASE("a Work dropped inside its open group still orders later compute work", "[comm][group][streams]") {
  auto b = backend("cuda", test_comm());
  Communicator& c = b->comm();
  const int world = c.size(), rank = c.rank();
  const auto w = static_cast<std::size_t>(world);
  const std::size_t n = small_run() ? 4096 : 4u << 20;
  Buffer send = upload(*b, std::vector<float>(n, static_cast<float>(rank + 1)));
  Buffer all = b->alloc(n * w * sizeof(float));  // zero-filled
  Buffer acc = b->alloc(n * w * sizeof(float));
  // The collective, ordered after this, starts ~20 ms late: a consumer that does not wait for
  // it reads zeros.
  spin(static_cast<cudaStream_t>(b->compute_stream()));
  {
    CommGroup g(c);
    // Dropped at once: its destructor cannot wait while the group is open.
    (void)c.all_gather_async(send.get(), all.get(), n, DType::f32);
  }
  b->accumulate(acc.get(), all.get(), DType::f32, n * w);  // compute-stream kernel after the group
  auto got = download<float>(*b, acc, n * w);
  for (int r = 0; r < world; ++r)
    for (std::size_t i = 0; i < n; i += 977) {
      INFO("rank " << r << "'s block, element " << i);
      REQUIRE(got[static_cast<std::size_t>(r) * n + i] == static_cast<float>(r + 1));
    }
  REQUIRE(got[n * w - 1] == static_cast<float>(world));
}

TEST_CASE("collectives are ordered after the compute stream and before what follows wait()", "[comm][streams]") {
  auto b = backend("cuda", test_comm());
  Communicator& c = b->comm();
  const int world = c.size(), rank = c.rank();
  // Large enough that a missing event would let the collective read stale input or the
  // accumulate read an unfinished result.
  const std::size_t n = small_run() ? 4096 : 16u << 20;
  std::vector<float> src(n, static_cast<float>(rank + 1));
  Buffer wide = upload(*b, src);
  Buffer narrow = b->alloc(n * 2);  // zero-filled
  Buffer acc = b->alloc(n * 2);
  for (int iter = 0; iter < 3; ++iter) {
    // The producer starts ~20 ms late: a collective that does not wait for it reads zeros.
    spin(static_cast<cudaStream_t>(b->compute_stream()));
    b->convert(wide.get(), DType::f32, narrow.get(), DType::bf16, n);  // compute-stream kernel
    Work w = c.all_reduce_async(narrow.get(), n, DType::bf16, ReduceOp::sum);
    CHECK_NOTHROW(w.done());  // may or may not be finished: a query, not a wait
    w.wait();
    b->accumulate(acc.get(), narrow.get(), DType::bf16, n);  // compute-stream kernel after wait()
  }
  const float sum = static_cast<float>(world * (world + 1) / 2);
  auto got = download<char>(*b, acc, n * 2);
  for (std::size_t i = 0; i < n; i += 997) REQUIRE(load_as_f32(got.data(), i, DType::bf16) == 3.0f * sum);
  REQUIRE(load_as_f32(got.data(), n - 1, DType::bf16) == 3.0f * sum);
}

TEST_CASE("Work from a destroyed handle still completes before later compute work", "[comm]") {
  auto b = backend("cuda", test_comm());
  Communicator& c = b->comm();
  const std::size_t n = 1 << 16;
  Buffer buf = upload(*b, std::vector<float>(n, 1.0f));
  { Work dropped = c.all_reduce_async(buf.get(), n, DType::f32, ReduceOp::sum); }  // destructor waits
  auto got = download<float>(*b, buf, n);
  REQUIRE(got[0] == static_cast<float>(c.size()));
  REQUIRE(got[n - 1] == static_cast<float>(c.size()));
}

TEST_CASE("a collective on a compute stream under CUDA graph capture is refused, and later ones still work",
          "[comm][streams][graph]") {
  auto b = backend("cuda", test_comm());
  Communicator& c = b->comm();
  const std::size_t n = 1024;
  Buffer buf = upload(*b, std::vector<float>(n, 1.0f));
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  b->set_compute_stream(s);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  b->zero(buf.get(), 16);  // a captured kernel of the user's own is fine
  std::string message;
  try {
    c.all_reduce_async(buf.get(), n, DType::f32, ReduceOp::sum);
  } catch (const Error& e) {
    message = e.what();
  }
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);  // the refusal did not break the capture
  INFO(message);
  REQUIRE(message.find("all_reduce: the compute stream is being captured into a CUDA graph") != std::string::npos);
  REQUIRE(message.find("End the capture") != std::string::npos);
  REQUIRE(graph != nullptr);
  cudaGraphDestroy(graph);
  // Nothing of the refused collective was recorded: the next one (outside capture) completes.
  b->from_host(buf.get(), std::vector<float>(n, 1.0f).data(), n * sizeof(float));
  Work w = c.all_reduce_async(buf.get(), n, DType::f32, ReduceOp::sum);
  // Waiting on it under capture is refused the same way, and the wait can be made afterwards.
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE_THROWS_WITH(w.wait(), Catch::Contains("Work::wait(): the compute stream is being captured"));
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  if (graph) cudaGraphDestroy(graph);
  w.wait();
  auto got = download<float>(*b, buf, n);
  REQUIRE(got[0] == static_cast<float>(c.size()));
  REQUIRE(got[n - 1] == static_cast<float>(c.size()));
  b->set_compute_stream(nullptr);
  cudaStreamDestroy(s);
}

TEST_CASE("split_comm: the groups of a partition of the backend's ranks, split from its communicator", "[comm]") {
  auto b = backend("cuda", test_comm());
  const int world = ctx().world_size(), rank = ctx().rank();
  // Tensor groups of two consecutive ranks (of one where the world is odd) partition the ranks;
  // the data-parallel groups across them too.
  ProcessGroups groups(ctx(), GridSpec{.tensor = world % 2 == 0 ? 2 : 1});
  Communicator& pairs = groups.tensor();
  std::unique_ptr<Communicator> pair_dev = b->split_comm(pairs);
  REQUIRE((pair_dev == nullptr) == (pairs.size() == 1));
  if (pair_dev) {
    REQUIRE(pair_dev->size() == pairs.size());
    REQUIRE(pair_dev->rank() == pairs.rank());
    const std::size_t n = 1000;
    Buffer x = upload(*b, filled(rank, n, DType::bf16));
    pair_dev->all_reduce_async(x.get(), n, DType::bf16, ReduceOp::sum).wait();
    const auto got = download<char>(*b, x, n * 2);
    const int first = rank / 2 * 2;
    for (std::size_t i = 0; i < n; ++i) {
      INFO("element " << i);
      REQUIRE(load_as_f32(got.data(), i, DType::bf16) == value(first, i) + value(first + 1, i));
    }
  }
  // The other way across the same ranks: one group where the pairs make two of them, else none.
  std::unique_ptr<Communicator> across = b->split_comm(groups.data());
  REQUIRE((across == nullptr) == (groups.data().size() == 1));
}
