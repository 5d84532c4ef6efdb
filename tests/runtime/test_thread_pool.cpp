// Tests of the CPU thread pool: exact coverage of [0, n) with contiguous ranges, the part count
// limits, real use of several threads, inline nested calls and exception propagation.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/cpu/thread_pool.h"
#include "tests/runtime/cpu_test_util.h"

using namespace qrig::cpu;

namespace {
std::vector<std::pair<int64_t, int64_t>> ranges_of(ThreadPool& pool, int64_t n, int64_t min_per_part) {
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  pool.parallel_for(n, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    ranges.emplace_back(b, e);
  }, min_per_part);
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}
}  // namespace

TEST_CASE("thread pool covers [0, n) exactly once in contiguous ranges", "[runtime]") {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    REQUIRE(pool.size() == threads);
    for (int64_t n : {0, 1, 2, 3, 7, 1000}) {
      auto ranges = ranges_of(pool, n, 1);
      INFO("threads " << threads << " n " << n);
      if (n == 0) {
        CHECK(ranges.empty());
        continue;
      }
      REQUIRE(!ranges.empty());
      CHECK(static_cast<int64_t>(ranges.size()) == std::min<int64_t>(threads, n));
      int64_t next = 0;
      for (auto [b, e] : ranges) {
        CHECK(b == next);
        CHECK(e > b);
        next = e;
      }
      CHECK(next == n);
    }
  }
}

TEST_CASE("thousands of back-to-back jobs of varying sizes each run exactly once", "[runtime]") {
  // Workers that wake late for one job must never run a part of it against the next job's range.
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(16);
  for (int job = 0; job < 3000; ++job) {
    const int64_t n = 1 + job % 7;
    for (auto& h : hits) h = 0;
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[i + job % 9];
    });
    for (int64_t i = 0; i < 16; ++i) {
      const bool inside = i >= job % 9 && i < job % 9 + n;
      if (hits[i] != (inside ? 1 : 0)) FAIL("job " << job << " index " << i << " ran " << hits[i] << " times");
    }
  }
  SUCCEED();
}

TEST_CASE("thread pool respects the minimum part length", "[runtime]") {
  ThreadPool pool(4);
  CHECK(ranges_of(pool, 10, 4).size() == 2);  // 10 / 4 -> 2 parts
  CHECK(ranges_of(pool, 7, 4).size() == 1);   // a single part runs inline
  CHECK(ranges_of(pool, 100, 4).size() == 4);
}

TEST_CASE("thread pool really runs parts on several threads", "[runtime]") {
  ThreadPool pool(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  // Each part waits (up to 10 s) until both parts have started: only two threads can get there.
  std::atomic<int> started{0};
  bool timed_out = false;
  pool.parallel_for(2, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    ++started;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::lock_guard<std::mutex> lock(mu);
        timed_out = true;
        return;
      }
      std::this_thread::yield();
    }
  });
  CHECK_FALSE(timed_out);
  CHECK(ids.size() == 2);
  CHECK(ids.count(std::this_thread::get_id()) == 1);  // the caller takes part in its own job
}

TEST_CASE("nested parallel_for runs inline on the calling pool thread", "[runtime]") {
  ThreadPool pool(3);
  std::atomic<int> inner_calls{0}, mismatched{0};
  std::atomic<int64_t> covered{0};
  pool.parallel_for(6, [&](int64_t b, int64_t e) {
    const auto me = std::this_thread::get_id();
    pool.parallel_for(100, [&](int64_t ib, int64_t ie) {
      ++inner_calls;
      covered += ie - ib;
      if (std::this_thread::get_id() != me) ++mismatched;
    });
    // The global pool's entry point also runs inline from inside a job.
    parallel_for(50, [&](int64_t, int64_t) {
      if (std::this_thread::get_id() != me) ++mismatched;
    });
  });
  CHECK(inner_calls == 3);  // one inline call per outer part
  CHECK(covered == 300);
  CHECK(mismatched == 0);
}

TEST_CASE("exceptions thrown in any part reach the caller and the pool stays usable", "[runtime]") {
  ThreadPool pool(3);
  for (int64_t bad_part_start : {0, 4, 8}) {
    std::atomic<int> finished{0};
    REQUIRE_THROWS_WITH(pool.parallel_for(12, [&](int64_t b, int64_t) {
      if (b == bad_part_start) throw std::runtime_error("part failed");
      ++finished;
    }), "part failed");
    CHECK(finished == 2);  // the other parts ran to completion before the rethrow
  }
  std::atomic<int64_t> sum{0};
  pool.parallel_for(1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  CHECK(sum == 999 * 1000 / 2);
}

TEST_CASE("global pool size can be changed and restored", "[runtime]") {
  const int before = num_threads();
  CHECK(before >= 1);
  {
    test::ThreadCount scope(3);
    CHECK(num_threads() == 3);
    std::atomic<int> parts{0};
    parallel_for(30, [&](int64_t, int64_t) { ++parts; });
    CHECK(parts == 3);
  }
  CHECK(num_threads() == before);
  set_num_threads(0);
  CHECK(num_threads() == static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  set_num_threads(before);
}
