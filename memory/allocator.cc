#include "memory/allocator.h"

#include <utility>

#include "base/byte_size.h"
#include "base/error.h"

namespace zest {

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    category_ = other.category_;
  }
  return *this;
}

void Buffer::reset() {
  if (owner_ && data_) owner_->deallocate(data_, bytes_, category_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Allocator::Allocator(std::string device_name, std::size_t capacity, std::string advice)
    : device_name_(std::move(device_name)), capacity_(capacity),
      advice_(advice.empty() ? "lower the micro-batch size or raise the stage, or give the device "
                               "more memory (world.device_memory)"
                             : std::move(advice)) {
  usage_.capacity = capacity;
}

namespace {
std::size_t round_up_to_alignment(std::size_t bytes) {
  return (bytes + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
}
}  // namespace

void Allocator::fail_next_allocation(Category category) {
  std::lock_guard lock(mutex_);
  fail_next_ = category;
}

Buffer Allocator::allocate(std::size_t bytes, Category category) {
  if (bytes == 0) return Buffer();
  const auto index = static_cast<std::size_t>(category);
  {
    std::lock_guard lock(mutex_);
    // Note: such a size would wrap around to a tiny block when rounded up to the alignment.
    if (bytes > kUnlimitedCapacity - (kAllocationAlignment - 1)) {
      throw_out_of_memory(bytes, category, "no device can hold that; ");
    }
    // Note: bytes are charged before the device is asked, so two threads racing for the last
    // bytes cannot both pass the capacity check.
    if (bytes > capacity_ - usage_.total_current) {
      throw_out_of_memory(bytes, category, "");
    }
    if (fail_next_ == category) {
      fail_next_.reset();
      throw_out_of_memory(bytes, category, "injected by debug.fault; ");
    }
    usage_.current[index] += bytes;
    usage_.total_current += bytes;
  }
  void* data = nullptr;
  try {
    data = raw_allocate(round_up_to_alignment(bytes));
  } catch (...) {
    // A device may fail otherwise than by having no memory (a CUDA error): the charge goes back.
    std::lock_guard lock(mutex_);
    usage_.current[index] -= bytes;
    usage_.total_current -= bytes;
    throw;
  }
  std::lock_guard lock(mutex_);
  if (!data) {
    usage_.current[index] -= bytes;
    usage_.total_current -= bytes;
    throw_out_of_memory(bytes, category, "the device refused the allocation; ");
  }
  if (usage_.current[index] > usage_.peak[index]) usage_.peak[index] = usage_.current[index];
  if (usage_.total_current > usage_.total_peak) usage_.total_peak = usage_.total_current;
  return Buffer(this, data, bytes, category);
}

void Allocator::deallocate(void* data, std::size_t bytes, Category category) {
  raw_free(data, round_up_to_alignment(bytes));
  std::lock_guard lock(mutex_);
  usage_.current[static_cast<std::size_t>(category)] -= bytes;
  usage_.total_current -= bytes;
}

MemoryUsage Allocator::usage() const {
  std::lock_guard lock(mutex_);
  return usage_;
}

void Allocator::reset_peaks() {
  std::lock_guard lock(mutex_);
  usage_.peak = usage_.current;
  usage_.total_peak = usage_.total_current;
}

void Allocator::throw_out_of_memory(std::size_t bytes, Category category,
                                    const std::string& reason) const {
  std::string message = "out of memory on " + device_name_ + ": asked " + format_bytes(bytes) +
                        " (" + std::to_string(bytes) + " bytes) for '" + category_name(category) +
                        "'; " + reason + "in use " + format_bytes(usage_.total_current);
  message += capacity_ == kUnlimitedCapacity ? " (no capacity set)"
                                             : " of " + format_bytes(capacity_) + " capacity";
  message += " [";
  bool first = true;
  for (Category c : all_categories()) {
    if (!first) message += ", ";
    first = false;
    message += std::string(category_name(c)) + " " + format_bytes(usage_.current_of(c));
  }
  message += "]; " + advice_;
  throw OutOfMemory(message);
}

}  // namespace zest
