// The communicator interface the engine is written against: collectives with non-blocking forms
// (Work handles) and point-to-point transfers, each checked across ranks before it starts.
// What Work::wait() means, the checks and 16-bit sums: docs/architecture.md, note communicators.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "zero/dtype.hpp"

namespace zero {

enum class ReduceOp { sum, max, avg };

// Where the collectives this thread issues come from, for the collective check's messages and
// its agreement: the engine's call ("gather", "reduce", "step()", ...) and the unit, or a
// label of the loop's own. Both pointers must outlive the scope (string literals, layout names).
struct CommSite {
  const char* call = nullptr;         // null: a direct call on the communicator
  const std::string* unit = nullptr;  // the unit's name, or null
  bool eval = false;                  // issued in eval mode (a forward-only pass)
};
// The site in effect on this thread.
CommSite comm_site();
// Sets the site for its lifetime and restores the previous one.
class CommSiteScope {
 public:
  explicit CommSiteScope(CommSite s);
  CommSiteScope(const char* call, const std::string* unit = nullptr, bool eval = false)
      : CommSiteScope(CommSite{call, unit, eval}) {}
  ~CommSiteScope();
  CommSiteScope(const CommSiteScope&) = delete;
  CommSiteScope& operator=(const CommSiteScope&) = delete;

 private:
  CommSite saved_;
};

// A pending collective. wait() completes it (idempotent); destroying an unfinished Work waits.
class Work {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;
  };
  Work() = default;
  explicit Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Work(Work&&) noexcept = default;
  // Waits for the collective it replaces first, so it throws what that wait throws (a failed
  // or timed-out collective, a wait inside a group still open): not noexcept, which would turn
  // such an error into std::terminate.
  Work& operator=(Work&& o) {
    if (this != &o) {
      wait();
      impl_ = std::move(o.impl_);
    }
    return *this;
  }
  ~Work() {
    if (impl_) try {
        impl_->wait();
      } catch (...) {
      }
  }
  void wait() {
    if (impl_) {
      impl_->wait();
      impl_.reset();
    }
  }
  bool done() {
    if (!impl_) return true;
    if (impl_->test()) {
      wait();
      return true;
    }
    return false;
  }
  bool pending() const { return impl_ != nullptr; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Bytes one rank has sent in collectives, inside its node and to other nodes (comm/topology.hpp
// says what a node is). Counted by the ring model that NCCL's and MPI's large-message algorithms
// follow, rank r sending to rank r+1 (mod size): an all-gather of s bytes per rank sends
// (size-1)s, a reduce-scatter of s result bytes per rank (size-1)s, an all-reduce of b bytes
// 2(size-1)ceil(b/size), a broadcast of b bytes b unless the next rank is the root. An all-to-all
// sends each block straight to its rank, so each block of s bytes counts toward that rank's side
// of the node boundary ((size-1)s in all); a point-to-point send of b bytes counts b, inside or
// across nodes by where the peer is (a receive counts nothing: the sender counts it). Payload
// bytes in the collective's dtype: the host communicator's fp32 staging of 16-bit sums is not
// counted.
// The ring model's bytes one rank sends in a collective over `size` ranks, elements of `esize`
// bytes: an all-gather of `count` elements per rank or a reduce-scatter of `count` result
// elements per rank, and an all-reduce of `count` elements. The communicators count with these,
// and zero-plan predicts with them (plan::step_traffic).
inline std::int64_t ring_gather_bytes(std::int64_t size, std::int64_t count, std::int64_t esize) {
  return (size - 1) * count * esize;
}
inline std::int64_t ring_all_reduce_bytes(std::int64_t size, std::int64_t count, std::int64_t esize) {
  return 2 * (size - 1) * ((count + size - 1) / size) * esize;
}

struct TrafficBytes {
  std::int64_t intra_node = 0;
  std::int64_t inter_node = 0;
  TrafficBytes& operator+=(const TrafficBytes& o) {
    intra_node += o.intra_node;
    inter_node += o.inter_node;
    return *this;
  }
  friend TrafficBytes operator-(TrafficBytes a, const TrafficBytes& b) {
    a.intra_node -= b.intra_node;
    a.inter_node -= b.inter_node;
    return a;
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: buf (count elements) becomes the reduction over ranks.
  virtual Work all_reduce_async(void* buf, std::size_t count, DType t, ReduceOp op) = 0;
  // send holds size()*recv_count elements; rank r receives the reduction of block r.
  virtual Work reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op) = 0;
  // send holds send_count elements; recv gets size()*send_count, rank r's block at r*send_count.
  // send may alias recv + rank()*send_count (in place).
  virtual Work all_gather_async(const void* send, void* recv, std::size_t send_count, DType t) = 0;
  // send holds size()*count elements, block j for rank j; recv (not overlapping send) gets
  // size()*count elements, block j from rank j. The elements are copied, never combined.
  virtual Work all_to_all_async(const void* send, void* recv, std::size_t count, DType t) = 0;
  virtual Work broadcast_async(void* buf, std::size_t bytes, int root) = 0;
  virtual Work barrier_async() = 0;

  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op = ReduceOp::sum) {
    all_reduce_async(buf, count, t, op).wait();
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op = ReduceOp::sum) {
    reduce_scatter_async(send, recv, recv_count, t, op).wait();
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, DType t) {
    all_gather_async(send, recv, send_count, t).wait();
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DType t) {
    all_to_all_async(send, recv, count, t).wait();
  }
  void broadcast(void* buf, std::size_t bytes, int root) { broadcast_async(buf, bytes, root).wait(); }
  void barrier() { barrier_async().wait(); }

  // Point to point (see the top of this file): `count` elements of t to / from `peer`, a rank of
  // this communicator other than this one. The receiver posts the same count and dtype. Not
  // collective: the other ranks do nothing. A send's buffer must stay unchanged, and a receive's
  // untouched, until its Work completes.
  virtual Work send_async(const void* buf, std::size_t count, DType t, int peer) = 0;
  virtual Work recv_async(void* buf, std::size_t count, DType t, int peer) = 0;
  void send(const void* buf, std::size_t count, DType t, int peer) { send_async(buf, count, t, peer).wait(); }
  void recv(void* buf, std::size_t count, DType t, int peer) { recv_async(buf, count, t, peer).wait(); }

  // Blocking reduction of one host double (grad norm partials, overflow flags, agreement on
  // errors), in double precision whatever the data dtype.
  virtual double all_reduce_scalar(double v, ReduceOp op) = 0;

  // The collective check for a collective this communicator is about to issue (see the top of
  // this file); every rank calls it with its own description. kind is a string literal; count
  // is in elements of t (bytes for byte payloads). Communicators over MPI implement it; device
  // communicators hand their statements to the host communicator that bootstrapped them,
  // which also counts their traffic (they span the same ranks).
  virtual void check_collective(const char* kind, std::size_t count, DType t, int root) {
    (void)kind, (void)count, (void)t, (void)root;
  }
  // A point-to-point call a device communicator over the same ranks is about to issue: recorded
  // for hang reports and counted as traffic (kind "send" or "recv"; no agreement is taken).
  virtual void note_p2p(const char* kind, std::size_t count, DType t, int peer) {
    (void)kind, (void)count, (void)t, (void)peer;
  }
  // What this rank has sent since the communicator was made (zeros where not counted).
  virtual TrafficBytes traffic() const { return {}; }
  // This rank's last collectives as the check saw them, for hang reports ("" where unknown).
  virtual std::string recent_collectives() const { return {}; }

  // Collectives started between group_begin() and group_end() may be launched together (NCCL
  // groups: one fused launch for a bucket of units instead of one per unit). Their Work handles
  // can be waited on only after group_end(). Groups nest; the outermost group_end() launches.
  // Communicators without grouping (MPI) treat both as no-ops.
  virtual void group_begin() {}
  virtual void group_end() {}
};

// Scoped communicator group: group_begin() now, group_end() at end() or scope exit (so a
// collective that throws inside the group does not leave it open).
class CommGroup {
 public:
  explicit CommGroup(Communicator& c) : comm_(&c) { comm_->group_begin(); }
  CommGroup(const CommGroup&) = delete;
  CommGroup& operator=(const CommGroup&) = delete;
  ~CommGroup() {
    if (comm_) try {
        comm_->group_end();
      } catch (...) {
      }
  }
  // Closes the group now, reporting errors (the destructor must swallow them).
  void end() {
    Communicator* c = comm_;
    comm_ = nullptr;
    if (c) c->group_end();
  }

 private:
  Communicator* comm_;
};

}  // namespace zero
