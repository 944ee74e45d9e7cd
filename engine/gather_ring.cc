#include "engine/gather_ring.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "base/error.h"
#include "engine/secondary_shard.h"

namespace zest {

std::size_t GatherRingLayout::elements() const {
  std::size_t total = 0;
  for (const SizeClass& size_class : classes) total += size_class.slots * size_class.slot_elements;
  return total;
}

bool GatherRingLayout::alone_in_class(int unit) const {
  return classes.at(static_cast<std::size_t>(class_of.at(static_cast<std::size_t>(unit)))).units == 1;
}

GatherRingLayout gather_ring_layout(const GatherRingSizing& sizing) {
  const std::size_t unit_count = sizing.unit_elements.size();
  GatherRingLayout layout;
  layout.class_of.assign(unit_count, -1);
  // Note: classes within a factor 2 waste under half of a slot on any unit, as an allocator's
  // power-of-two size classes do, and a language model's embedding (vocabulary × width, 5x a
  // GPT-2 block) gets a class of its own.
  std::vector<std::size_t> order(unit_count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return sizing.unit_elements[a] > sizing.unit_elements[b];
  });
  for (std::size_t u : order) {
    const std::size_t elements = std::max<std::size_t>(sizing.unit_elements[u], 1);
    if (layout.classes.empty() || 2 * elements <= layout.classes.back().slot_elements) {
      layout.classes.push_back({elements, 0, 0});
    }
    layout.class_of[u] = static_cast<int>(layout.classes.size() - 1);
    ++layout.classes.back().units;
  }
  // The units of each class one computation pins at once.
  std::vector<std::size_t> needed(layout.classes.size(), 0);
  for (std::size_t u = 0; u < unit_count; ++u) {
    std::vector<std::size_t> members(layout.classes.size(), 0);
    ++members[static_cast<std::size_t>(layout.class_of[u])];
    const std::vector<int> none;
    const std::vector<int>& borrowed = u < sizing.borrowed.size() ? sizing.borrowed[u] : none;
    const bool in_turn = u < sizing.borrows_in_turn.size() && sizing.borrows_in_turn[u];
    std::vector<std::size_t> lenders(layout.classes.size(), 0);
    for (int lender : borrowed) {
      if (lender >= 0 && static_cast<std::size_t>(lender) < unit_count) {
        ++lenders[static_cast<std::size_t>(layout.class_of[static_cast<std::size_t>(lender)])];
      }
    }
    for (std::size_t c = 0; c < lenders.size(); ++c) {
      members[c] += in_turn ? std::min<std::size_t>(lenders[c], 1) : lenders[c];
    }
    for (std::size_t c = 0; c < needed.size(); ++c) needed[c] = std::max(needed[c], members[c]);
  }
  std::size_t required = 0;
  std::size_t required_units = 0;
  for (std::size_t c = 0; c < layout.classes.size(); ++c) {
    GatherRingLayout::SizeClass& size_class = layout.classes[c];
    const std::size_t minimum = std::max(sizing.minimum_slots, 2 * needed[c]);
    const std::size_t ahead =
        (sizing.prefetch_elements + size_class.slot_elements - 1) / size_class.slot_elements;
    size_class.slots = std::min(size_class.units, std::max(minimum, 1 + ahead));
    required += needed[c] * size_class.slot_elements;
    required_units += needed[c];
  }
  const std::size_t limit = sizing.max_live_elements;
  if (limit == 0 || layout.classes.empty()) return layout;
  if (limit < required) {
    throw Error(ErrorKind::kConfig,
                "zero_optimization.stage3_max_live_parameters: " + std::to_string(limit) +
                    " is below what one computation needs: " + std::to_string(required_units) +
                    " unit(s) of up to " + std::to_string(layout.classes.front().slot_elements) +
                    " elements (" + std::to_string(required) + "); raise it or set 0 (no limit)");
  }
  // Below the prefetch's wish, the classes with the largest slots give up slots first, down to
  // what one computation needs.
  std::size_t total = layout.elements();
  for (std::size_t c = 0; c < layout.classes.size() && total > limit;) {
    GatherRingLayout::SizeClass& size_class = layout.classes[c];
    if (size_class.slots > needed[c]) {
      --size_class.slots;
      total -= size_class.slot_elements;
    } else {
      ++c;
    }
  }
  return layout;
}

GatherRing::GatherRing(Device& device, const GatherRingLayout& layout, DType dtype,
                       ShardFetch fetch_shard)
    : dtype_(dtype), fetch_shard_(std::move(fetch_shard)),
      class_of_(layout.class_of), cursor_(layout.classes.size(), 0) {
  for (std::size_t c = 0; c < layout.classes.size(); ++c) {
    // Note: one slot is correct but serial (each gather waits for the previous unit's compute);
    // a class with more than one unit has fewer than two only under stage3_max_live_parameters.
    if (layout.classes[c].slots < 1) {
      throw Error(ErrorKind::kConfig, "stage 3 needs at least 1 gather slot per size class, got 0");
    }
    for (std::size_t i = 0; i < layout.classes[c].slots; ++i) {
      Slot slot;
      slot.buffer = device.allocator().allocate(
          layout.classes[c].slot_elements * dtype_size(dtype_), Category::kGather);
      slot.size_class = c;
      slot.gathered = device.create_event();
      slot.unpinned = device.create_event();
      slots_.push_back(std::move(slot));
    }
  }
}

GatherRing::Slot* GatherRing::find(int unit) {
  for (Slot& slot : slots_) {
    if (slot.resident == unit) return &slot;
  }
  return nullptr;
}

GatherRing::Slot& GatherRing::take_free_slot(int unit_index) {
  const auto size_class = static_cast<std::size_t>(class_of_.at(static_cast<std::size_t>(unit_index)));
  std::vector<Slot*> members;
  for (Slot& slot : slots_) {
    if (slot.size_class == size_class) members.push_back(&slot);
  }
  std::size_t& cursor = cursor_[size_class];
  for (std::size_t tried = 0; tried < members.size(); ++tried) {
    Slot& slot = *members[cursor % members.size()];
    cursor = (cursor + 1) % members.size();
    if (slot.pins == 0 && !slot.holds_gradient) return slot;
  }
  throw Error(ErrorKind::kInternal,
              "gather ring: every slot of its size class is pinned while gathering unit " +
                  std::to_string(unit_index) + "; raise the number of gather slots");
}

void* GatherRing::pin(const FlatUnit& unit, Stream& comm, Stream& compute,
                      Communicator& communicator, SecondaryShard* secondary) {
  Slot* slot = find(unit.index);
  if (!slot) {
    slot = &take_free_slot(unit.index);
    // The slot's previous unit may still be read by work already enqueued.
    comm.wait(*slot->unpinned);
    if (fetch_shard_) {
      fetch_and_gather(unit, comm, communicator, slot->buffer.data());
    } else if (secondary) {
      secondary->gather(unit, comm, slot->buffer.data(), quantized_);
    } else if (quantized_) {
      communicator.label_next(("gather " + unit.layout.unit_name()).c_str());
      quantized_->all_gather(communicator, comm, unit.layout, unit.params.data(),
                             slot->buffer.data(), dtype_);
    } else {
      communicator.label_next(("gather " + unit.layout.unit_name()).c_str());
      communicator.all_gather(comm, unit.params.data(), slot->buffer.data(),
                              unit.layout.shard_length(), dtype_);
    }
    comm.record(*slot->gathered);
    slot->resident = unit.index;
  }
  compute.wait(*slot->gathered);
  ++slot->pins;
  return slot->buffer.data();
}

void GatherRing::fetch_and_gather(const FlatUnit& unit, Stream& comm,
                                  Communicator& communicator, void* slot) {
  const std::size_t shard = unit.layout.shard_length();
  const std::size_t shard_bytes = shard * dtype_size(dtype_);
  char* place = static_cast<char*>(slot) + static_cast<std::size_t>(communicator.rank()) * shard_bytes;
  // Note: the fetch is on the gathering stream, so it runs exactly as far ahead of compute as
  // the ring's gathers do, and the slot's rank-th shard is where the all-gather would put it.
  fetch_shard_(unit, comm, place);
  if (communicator.world_size() == 1) return;  // one rank: the shard is the whole unit
  communicator.label_next(("gather " + unit.layout.unit_name()).c_str());
  communicator.all_gather(comm, place, slot, shard, dtype_);
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

GatherRing::Slot& GatherRing::held_slot(const FlatUnit& unit) {
  Slot* slot = find(unit.index);
  if (!slot) {
    throw Error(ErrorKind::kInternal, "gather ring: unit '" + unit.layout.unit_name() +
                                          "' holds no slot for its gradient");
  }
  return *slot;
}

void* GatherRing::hold_gradient(const FlatUnit& unit, Device& device, Stream& compute) {
  Slot& slot = held_slot(unit);
  if (!slot.holds_gradient) {
    slot.holds_gradient = true;
    device.fill_zero(compute, slot.buffer.data(), unit.layout.flat_length() * dtype_size(dtype_));
  }
  return slot.buffer.data();
}

void GatherRing::gradient_reduced(const FlatUnit& unit, Stream& comm) {
  Slot& slot = held_slot(unit);
  slot.holds_gradient = false;
  slot.resident = -1;  // the gradient overwrote the parameters
  comm.record(*slot.unpinned);
}

void GatherRing::clear() {
  for (Slot& slot : slots_) {
    slot.resident = -1;
    slot.pins = 0;
    slot.holds_gradient = false;
  }
}

std::size_t GatherRing::resident_count() const {
  std::size_t count = 0;
  for (const Slot& slot : slots_) count += slot.resident >= 0 ? 1 : 0;
  return count;
}

}  // namespace zest
