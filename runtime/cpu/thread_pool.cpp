// The persistent pool behind the CPU reference ops: workers sleep on a condition variable between
// jobs; the calling thread and the workers claim the parts of a job one at a time under the mutex.
#include "runtime/cpu/thread_pool.h"

#include <algorithm>
#include <memory>
#include <system_error>

namespace qrig::cpu {

namespace {
// True while this thread executes a part of some pool job: nested parallel_for calls then run inline.
thread_local bool t_in_job = false;

struct InJobScope {
  bool saved;
  InJobScope() : saved(t_in_job) { t_in_job = true; }
  ~InJobScope() { t_in_job = saved; }
};

int resolve_count(int n) {
  if (n > 0) return n;
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(resolve_count(n_threads)) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) {
    try {
      workers_.emplace_back([this] { worker_loop(); });
    } catch (const std::system_error&) {  // out of threads: run with the ones we got
      n_threads_ = static_cast<int>(workers_.size()) + 1;
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_parts(std::unique_lock<std::mutex>& lock) {
  // The job's fields are read under the lock at claim time: a part is claimed only while its job is
  // current, and the job cannot end before every claimed part is done.
  while (fn_ != nullptr && next_part_ < parts_) {
    const int part = next_part_++;
    const RangeFn* fn = fn_;
    const int64_t n = n_;
    const int parts = parts_;
    lock.unlock();
    std::exception_ptr err;
    {
      InJobScope scope;
      try {
        (*fn)(n * part / parts, n * (part + 1) / parts);
      } catch (...) {
        err = std::current_exception();
      }
    }
    lock.lock();
    if (err && !error_) error_ = err;
    if (++done_parts_ == parts_) done_cv_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    run_parts(lock);
  }
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int64_t min_per_part) {
  if (n <= 0) return;
  if (min_per_part < 1) min_per_part = 1;
  int64_t parts64 = std::min<int64_t>(n_threads_, n / min_per_part);
  if (parts64 <= 1 || t_in_job) {
    InJobScope scope;
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  fn_ = &fn;
  n_ = n;
  parts_ = static_cast<int>(parts64);
  next_part_ = 0;
  done_parts_ = 0;
  error_ = nullptr;
  ++generation_;
  start_cv_.notify_all();
  run_parts(lock);
  done_cv_.wait(lock, [&] { return done_parts_ == parts_; });
  fn_ = nullptr;
  std::exception_ptr err = error_;
  error_ = nullptr;
  lock.unlock();
  if (err) std::rethrow_exception(err);
}

namespace {
std::mutex g_pool_mu;
std::shared_ptr<ThreadPool> g_pool;

std::shared_ptr<ThreadPool> global_pool() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool) g_pool = std::make_shared<ThreadPool>(0);
  return g_pool;
}
}  // namespace

int num_threads() { return global_pool()->size(); }

void set_num_threads(int n) {
  auto fresh = std::make_shared<ThreadPool>(n);
  std::shared_ptr<ThreadPool> old;
  {
    std::lock_guard<std::mutex> lock(g_pool_mu);
    old = std::move(g_pool);
    g_pool = std::move(fresh);
  }
  // `old` (if no op still holds it) joins its workers here, outside the lock.
}

void parallel_for(int64_t n, const RangeFn& fn, int64_t min_per_part) {
  if (n <= 0) return;
  if (t_in_job) {  // nested: no need to touch the global pool at all
    fn(0, n);
    return;
  }
  global_pool()->parallel_for(n, fn, min_per_part);
}

}  // namespace qrig::cpu
