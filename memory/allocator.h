// A device's allocator: hands out Buffers charged to a category, enforces the device's capacity
// and keeps current and peak bytes per category and in total. Invariant: every Buffer returns
// its bytes to the allocator that made it, so the accounting is exact at any moment; the
// allocator must outlive its buffers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <string>

#include "memory/category.h"

namespace zest {

inline constexpr std::size_t kAllocationAlignment = 64;  // bytes; enough for AVX-512 loads
inline constexpr std::size_t kUnlimitedCapacity = std::numeric_limits<std::size_t>::max();

struct MemoryUsage {
  std::array<std::size_t, kCategoryCount> current{};
  std::array<std::size_t, kCategoryCount> peak{};  // per category, since the last reset
  std::size_t total_current = 0;
  std::size_t total_peak = 0;  // peak of the sum, not the sum of peaks
  std::size_t capacity = kUnlimitedCapacity;

  std::size_t current_of(Category c) const { return current[static_cast<std::size_t>(c)]; }
  std::size_t peak_of(Category c) const { return peak[static_cast<std::size_t>(c)]; }
};

class Allocator;

// Owns `bytes()` bytes of device memory, aligned to kAllocationAlignment. Move-only.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer() { reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  std::size_t bytes() const { return bytes_; }
  Category category() const { return category_; }
  bool empty() const { return bytes_ == 0; }

  // Returns the memory to its allocator now.
  void reset();

 private:
  friend class Allocator;
  Buffer(Allocator* owner, void* data, std::size_t bytes, Category category)
      : owner_(owner), data_(data), bytes_(bytes), category_(category) {}

  Allocator* owner_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Category category_ = Category::kWorkspace;
};

class Allocator {
 public:
  // `device_name` appears in messages ("cpu:2"); `capacity` in bytes; `advice` ends an
  // out-of-memory message (what the user can change; the device's advice when empty).
  Allocator(std::string device_name, std::size_t capacity, std::string advice = "");
  virtual ~Allocator() = default;

  // Throws OutOfMemory (with the bytes asked, the category, the use by category and the
  // capacity) when the allocation would pass the capacity or the device refuses it.
  // A zero-byte request gives an empty Buffer.
  Buffer allocate(std::size_t bytes, Category category);

  MemoryUsage usage() const;
  std::size_t capacity() const { return capacity_; }
  const std::string& device_name() const { return device_name_; }
  // Starts a new peak window: peaks become the current use.
  void reset_peaks();
  // Fault injection (debug.fault "fail_allocation"): the next allocation of `category` fails as
  // if the device were full, with the same OutOfMemory message.
  void fail_next_allocation(Category category);

 protected:
  // Returns null when the device has no memory left; may throw for other failures (the charge
  // is then undone). `bytes` is a multiple of the alignment. raw_free must not throw.
  virtual void* raw_allocate(std::size_t bytes) = 0;
  virtual void raw_free(void* data, std::size_t bytes) = 0;

 private:
  friend class Buffer;
  void deallocate(void* data, std::size_t bytes, Category category);
  [[noreturn]] void throw_out_of_memory(std::size_t bytes, Category category,
                                        const std::string& reason) const;

  const std::string device_name_;
  const std::size_t capacity_;
  const std::string advice_;
  mutable std::mutex mutex_;
  MemoryUsage usage_;
  std::optional<Category> fail_next_;  // guarded by mutex_
};

}  // namespace zest
