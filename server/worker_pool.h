// The request threads of the connection layer (server/connection_server.cpp): started on demand up to a
// maximum, so an idle server with a large --max-queue holds a handful of threads, not thousands; a task is
// refused (the caller answers 429) when every thread already has one.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qrig::server {

class WorkerPool {
 public:
  explicit WorkerPool(int max) : max_(std::max(1, max)) {}
  ~WorkerPool() { join(); }

  bool try_submit(std::function<void()> task) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped_ || busy_ + (int)queue_.size() >= max_) return false;
    queue_.push_back(std::move(task));
    if (waiting_ < (int)queue_.size() && (int)threads_.size() < max_) threads_.emplace_back([this] { loop(); });
    else cv_.notify_one();
    return true;
  }
  // Runs what is queued, then ends every thread.
  void join() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  int threads() const {
    std::lock_guard<std::mutex> lk(mu_);
    return (int)threads_.size();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      ++waiting_;
      cv_.wait(lk, [&] { return stopped_ || !queue_.empty(); });
      --waiting_;
      if (queue_.empty()) return;
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
      lk.unlock();
      task();
      task = nullptr;
      lk.lock();
      --busy_;
    }
  }
  const int max_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  int busy_ = 0, waiting_ = 0;
  bool stopped_ = false;
};

}  // namespace qrig::server
