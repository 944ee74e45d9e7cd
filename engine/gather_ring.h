// ZeRO-3's gathered parameters: a fixed ring of slots, each big enough for the largest unit,
// allocated once (category gather) so that a step allocates nothing for gathers. A unit is
// gathered into a slot on the comm stream once the slot's previous user has finished computing;
// the compute stream waits for the gather. A slot still holding a unit is reused without
// gathering again (the last unit of forward is the first of backward). Owns the slots' buffers
// and their events. Invariant: a slot is never overwritten while a unit pinned in it has not
// been unpinned.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/flat_unit.h"
#include "runtime/communicator.h"
#include "runtime/device.h"

namespace zest {

// How many slots the engine's ring has, from the stage-3 options (engine/engine.h): one set of
// units computing (a unit and the units it borrows) plus one set being gathered ahead at least;
// more when stage3_prefetch_bucket_size asks to gather further ahead, never more than there
// are units; at most stage3_max_live_parameters elements. The engine and the memory planner
// both size the ring here. Throws a kConfig Error when the limit is below one set.
struct GatherRingSizing {
  std::size_t minimum_slots = 2;       // EngineOptions::gather_slots
  std::size_t prefetch_elements = 0;   // stage3_prefetch_bucket_size
  std::size_t max_live_elements = 0;   // stage3_max_live_parameters; 0 = no limit
  std::size_t largest_unit = 0;        // elements of the longest flat unit (each slot's size)
  std::size_t most_borrowed = 0;       // the most units one unit borrows
  std::size_t unit_count = 0;
};
std::size_t gather_ring_slots(const GatherRingSizing& sizing);

class GatherRing {
 public:
  // `slots` must cover the units one computation holds at once (a unit plus its borrowed units)
  // plus one set ahead, or gathers cannot overlap compute.
  GatherRing(Device& device, std::size_t slot_elements, DType dtype, std::size_t slots);

  // Makes `unit`'s full flat parameters present, pins its slot and returns them (valid for
  // `compute` work enqueued after this call until unpin()).
  void* pin(const FlatUnit& unit, Stream& comm, Stream& compute, Communicator& communicator);
  // The compute work enqueued so far is the last to read `unit`'s slot.
  void unpin(const FlatUnit& unit, Stream& compute);
  // Forgets what the slots hold (the shards changed, or the step ended).
  void clear();

  std::size_t slot_count() const { return slots_.size(); }
  // How many slots hold a unit now (for tests: zero between steps).
  std::size_t resident_count() const;

 private:
  struct Slot {
    Buffer buffer;
    int resident = -1;  // unit index, or -1
    int pins = 0;       // pin() calls not yet unpinned
    std::unique_ptr<Event> gathered;
    std::unique_ptr<Event> unpinned;  // the last compute work that read the slot
  };

  Slot* find(int unit);
  Slot& take_free_slot(int unit_index);

  DType dtype_;
  std::vector<Slot> slots_;
  std::size_t cursor_ = 0;  // round-robin: the least recently gathered slot comes next
};

}  // namespace zest
