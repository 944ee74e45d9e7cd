// ZeRO-3's gathered parameters: a fixed ring of slots, each big enough for the largest unit,
// allocated once (category gather) so that a step allocates nothing for gathers. A unit is
// gathered into a slot on the comm stream once the slot's previous user has finished computing;
// the compute stream waits for the gather. A slot still holding a unit is reused without
// gathering again (the last unit of forward is the first of backward).
// Invariant: a slot is never overwritten while a unit that acquired it has not released it.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "optim/flat_unit.h"
#include "runtime/communicator.h"
#include "runtime/device.h"

namespace zest {

class GatherRing {
 public:
  // `slots` must cover the units one computation holds at once (a unit plus its borrowed units)
  // plus one set ahead, or gathers cannot overlap compute.
  GatherRing(Device& device, std::size_t slot_elements, DType dtype, std::size_t slots);

  // Makes `unit`'s full flat parameters present and returns them (valid for `compute` work
  // enqueued after this call until release()).
  void* acquire(const FlatUnit& unit, Stream& comm, Stream& compute, Communicator& communicator);
  // The compute work enqueued so far is the last to read `unit`'s slot.
  void release(const FlatUnit& unit, Stream& compute);
  // Forgets what the slots hold (the shards changed, or the step ended).
  void clear();

  std::size_t slot_count() const { return slots_.size(); }
  // How many slots hold a unit now (for tests: zero between steps).
  std::size_t resident_count() const;

 private:
  struct Slot {
    Buffer buffer;
    int resident = -1;  // unit index, or -1
    int holders = 0;    // acquires not yet released
    std::unique_ptr<Event> gathered;
    std::unique_ptr<Event> released;
  };

  Slot* find(int unit);
  Slot& take_free_slot(int unit_index);

  DType dtype_;
  std::vector<Slot> slots_;
  std::size_t cursor_ = 0;  // round-robin: the least recently gathered slot comes next
};

}  // namespace zest
