#include "runtime/shape_device.h"

#include "runtime/shape_stream.h"

namespace zest::shape {

ShapeDevice::ShapeDevice(int index, DeviceKind stands_for, std::size_t capacity,
                         std::size_t host_capacity)
    : stands_for_(stands_for),
      name_("shape:" + std::to_string(index)),
      allocator_(name_, capacity),
      host_allocator_(name_ + " host", host_capacity, 1) {}

std::unique_ptr<Stream> ShapeDevice::create_stream(const std::string& name) {
  return std::make_unique<ShapeStream>(name, stands_for_, allocator_);
}

std::unique_ptr<Event> ShapeDevice::create_event() { return std::make_unique<ShapeEvent>(); }

}  // namespace zest::shape
