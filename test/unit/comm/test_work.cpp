// zero::Work, the handle of a pending collective: wait() completes it once, destroying an
// unfinished one waits, and replacing one waits for it first, passing on that wait's error (a
// failed or timed-out collective) as an exception the caller can catch, not std::terminate.
#include <catch2/catch.hpp>

#include <memory>

#include "zero/comm.hpp"
#include "zero/error.hpp"

namespace {

struct Counts {
  int waits = 0;
};

// A collective whose wait counts itself, and fails when told to.
class FakeWork final : public zero::Work::Impl {
 public:
  FakeWork(Counts& c, bool fail) : c_(c), fail_(fail) {}
  void wait() override {
    ++c_.waits;
    if (fail_) ZERO_THROW("collective 'all_reduce' failed on rank 1");
  }
  bool test() override { return true; }

 private:
  Counts& c_;
  bool fail_;
};

zero::Work fake(Counts& c, bool fail = false) { return zero::Work(std::make_unique<FakeWork>(c, fail)); }

}  // namespace

TEST_CASE("Work: wait once, destroying an unfinished one waits", "[comm][work]") {
  Counts c;
  {
    zero::Work w = fake(c);
    CHECK(w.pending());
    w.wait();
    w.wait();
    CHECK(!w.pending());
  }
  CHECK(c.waits == 1);
  { zero::Work w = fake(c); }
  CHECK(c.waits == 2);
}

TEST_CASE("Work: replacing a pending one waits for it and passes its error on", "[comm][work]") {
  Counts replaced, next;
  zero::Work w = fake(replaced);
  w = fake(next);
  CHECK(replaced.waits == 1);
  CHECK(next.waits == 0);

  Counts failing;
  zero::Work bad = fake(failing, true);
  CHECK_THROWS_WITH(bad = fake(next), Catch::Matchers::Contains("failed on rank 1"));
  // The replacement did not take: the failed one is still held, the new one was dropped (and
  // so waited for, as a dropped Work is).
  CHECK(bad.pending());
  CHECK(next.waits == 1);
}
