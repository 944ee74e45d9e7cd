// A Stream that says it belongs to a CUDA device and runs nothing: lets CPU-only tests check
// that a kernel's dispatch refuses a device it has no body for, before enqueuing anything.
#pragma once

#include <functional>
#include <string>

#include "runtime/stream.h"

namespace zest::testing {

class FakeCudaStream final : public Stream {
 public:
  const std::string& name() const override { return name_; }
  DeviceKind device_kind() const override { return DeviceKind::kCuda; }
  void enqueue(std::function<void()>) override { ++enqueued; }
  void record(Event&) override {}
  void wait(Event&) override {}
  void synchronize() override {}

  int enqueued = 0;

 private:
  std::string name_ = "fake-cuda";
};

}  // namespace zest::testing
