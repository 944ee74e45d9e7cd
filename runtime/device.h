// A device: where a rank's memory lives and its work runs. It makes the streams and events of
// its kind and owns the allocator that charges every byte to a category. The engine only talks
// to this interface, so the CPU device and the CUDA device run the same engine code.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "memory/allocator.h"
#include "runtime/stream.h"

namespace zest {

class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceKind kind() const = 0;
  virtual const std::string& name() const = 0;  // "cpu:0", "cuda:3"
  virtual Allocator& allocator() = 0;
  // Host memory the device copies to and from in stream order (page-locked on CUDA): where an
  // offloaded optimizer's state lives. Its own capacity and accounting, apart from allocator().
  virtual Allocator& host_allocator() = 0;

  virtual std::unique_ptr<Stream> create_stream(const std::string& name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // A stream whose work runs on the host over host_allocator() memory (an offloaded
  // optimizer's), with CPU kernels, and its events; it may wait on this device's events and
  // they on its (Stream::wait). The CPU device's ordinary stream and event.
  virtual std::unique_ptr<Stream> create_host_stream(const std::string& name) = 0;
  virtual std::unique_ptr<Event> create_host_event() = 0;

  // Stream-ordered copy between device memory and host_allocator() memory, either way.
  virtual void copy(Stream& stream, void* destination, const void* source, std::size_t bytes) = 0;
  // Stream-ordered zero fill.
  virtual void fill_zero(Stream& stream, void* destination, std::size_t bytes) = 0;
};

}  // namespace zest
