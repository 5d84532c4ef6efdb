// A small persistent thread pool for the CPU reference ops. Work is split into fixed contiguous
// ranges (part k of P covers [n*k/P, n*(k+1)/P)), so every output element is computed by exactly one
// thread and, as long as an op computes each element independently of the range it lands in, results
// are bit-identical whatever the thread count. Parts are claimed by whichever thread is free first
// (the caller included), so a job never waits for a worker the OS has not scheduled yet.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qrig::cpu {

using RangeFn = std::function<void(int64_t begin, int64_t end)>;

class ThreadPool {
 public:
  // n_threads counts the calling thread: a pool of n runs n-1 workers. n <= 0 means
  // std::thread::hardware_concurrency(); fewer if the system refuses to start more threads.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn on contiguous ranges covering [0, n), at most one range per thread and each range at
  // least min_per_part long (except when n itself is smaller). Runs fn(0, n) inline when only one part
  // results or when called from inside a pool job (nested calls do not deadlock). Concurrent calls
  // from different outside threads are serialized. The first exception thrown by fn is rethrown here
  // once every part has finished.
  void parallel_for(int64_t n, const RangeFn& fn, int64_t min_per_part = 1);

 private:
  void worker_loop();
  // Runs unclaimed parts of the current job until none is left; called and returns with mu_ held.
  void run_parts(std::unique_lock<std::mutex>& lock);

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one job at a time
  std::mutex mu_;       // guards everything below
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 0;
  int next_part_ = 0;   // first part nobody has claimed
  int done_parts_ = 0;  // parts finished
  std::exception_ptr error_;
};

// The process-wide pool used by the ops (created on first use).
int num_threads();
// Rebuilds the global pool with n threads (n <= 0: hardware_concurrency). Must not race with
// running ops.
void set_num_threads(int n);
void parallel_for(int64_t n, const RangeFn& fn, int64_t min_per_part = 1);

}  // namespace qrig::cpu
