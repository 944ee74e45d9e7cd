#include "engine/gather_ring.h"

#include <algorithm>

#include "base/error.h"

namespace zest {

std::size_t gather_ring_slots(const GatherRingSizing& sizing) {
  const std::size_t largest = std::max<std::size_t>(sizing.largest_unit, 1);
  const std::size_t one_set = 1 + sizing.most_borrowed;  // a unit computing and its borrowed units
  const std::size_t minimum = std::max(sizing.minimum_slots, 2 * one_set);
  const std::size_t ahead = (sizing.prefetch_elements + largest - 1) / largest;
  std::size_t slots =
      std::max(minimum, std::min(1 + ahead, sizing.unit_count + sizing.most_borrowed));
  const std::size_t limit = sizing.max_live_elements;
  if (limit == 0) return slots;
  if (limit < one_set * largest) {
    throw Error(ErrorKind::kConfig,
                "zero_optimization.stage3_max_live_parameters: " + std::to_string(limit) +
                    " is below what one computation needs: " + std::to_string(one_set) +
                    " unit(s) of up to " + std::to_string(largest) + " elements (" +
                    std::to_string(one_set * largest) + "); raise it or set 0 (no limit)");
  }
  return std::min(slots, limit / largest);
}

GatherRing::GatherRing(Device& device, std::size_t slot_elements, DType dtype, std::size_t slots)
    : dtype_(dtype) {
  // Note: one slot is correct but serial (each gather waits for the previous unit's compute);
  // the engine asks for fewer than two only under stage3_max_live_parameters.
  if (slots < 1) {
    throw Error(ErrorKind::kConfig, "stage 3 needs at least 1 gather slot, got 0");
  }
  for (std::size_t i = 0; i < slots; ++i) {
    Slot slot;
    slot.buffer = device.allocator().allocate(slot_elements * dtype_size(dtype), Category::kGather);
    slot.gathered = device.create_event();
    slot.unpinned = device.create_event();
    slots_.push_back(std::move(slot));
  }
}

GatherRing::Slot* GatherRing::find(int unit) {
  for (Slot& slot : slots_) {
    if (slot.resident == unit) return &slot;
  }
  return nullptr;
}

GatherRing::Slot& GatherRing::take_free_slot(int unit_index) {
  for (std::size_t tried = 0; tried < slots_.size(); ++tried) {
    Slot& slot = slots_[cursor_];
    cursor_ = (cursor_ + 1) % slots_.size();
    if (slot.pins == 0) return slot;
  }
  throw Error(ErrorKind::kInternal,
              "gather ring: every slot is pinned while gathering unit " +
                  std::to_string(unit_index) + "; raise the number of gather slots");
}

void* GatherRing::pin(const FlatUnit& unit, Stream& comm, Stream& compute,
                      Communicator& communicator) {
  Slot* slot = find(unit.index);
  if (!slot) {
    slot = &take_free_slot(unit.index);
    // The slot's previous unit may still be read by compute work already enqueued.
    comm.wait(*slot->unpinned);
    communicator.label_next(("gather " + unit.layout.unit_name()).c_str());
    communicator.all_gather(comm, unit.params.data(), slot->buffer.data(),
                            unit.layout.shard_length(), dtype_);
    comm.record(*slot->gathered);
    slot->resident = unit.index;
  }
  compute.wait(*slot->gathered);
  ++slot->pins;
  return slot->buffer.data();
}

void GatherRing::unpin(const FlatUnit& unit, Stream& compute) {
  Slot* slot = find(unit.index);
  if (!slot || slot->pins == 0) {
    throw Error(ErrorKind::kInternal, "gather ring: unit '" + unit.layout.unit_name() +
                                          "' unpinned without being pinned");
  }
  --slot->pins;
  compute.record(*slot->unpinned);
}

void GatherRing::clear() {
  for (Slot& slot : slots_) {
    slot.resident = -1;
    slot.pins = 0;
  }
}

std::size_t GatherRing::resident_count() const {
  std::size_t count = 0;
  for (const Slot& slot : slots_) count += slot.resident >= 0 ? 1 : 0;
  return count;
}

}  // namespace zest
