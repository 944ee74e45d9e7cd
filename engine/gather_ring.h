// ZeRO-3's gathered parameters: a ring of slots in size classes, allocated once (category
// gather) so that a step allocates nothing for gathers. Units within a factor 2 of each other
// share a class whose slots are the size of its largest unit, so an embedding many times a
// block's size gets slots of its own and the blocks' slots are block-sized: the ring holds what
// is in flight, not its count times the largest unit. A unit is gathered into a slot of its
// class on the comm stream once the slot's previous user has finished computing; the compute
// stream waits for the gather. A slot still holding a unit is reused without gathering again (the
// last unit of forward is the first of backward; a class of one unit keeps it for the step).
// A slot may also hold its unit's gradient in place of the parameters (hold_gradient), until the
// gradient has been reduced. Owns the slots' buffers and their events. Invariant: a slot is never
// overwritten while a unit pinned in it has not been unpinned, nor while it holds a gradient.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "engine/flat_unit.h"
#include "engine/quantized_collectives.h"
#include "runtime/communicator.h"
#include "runtime/device.h"

namespace zest {

class SecondaryShard;  // engine/secondary_shard.h

// What sizes the ring, from the stage-3 options (engine/engine.h) and the units.
struct GatherRingSizing {
  std::size_t minimum_slots = 2;       // EngineOptions::gather_slots, per class
  std::size_t prefetch_elements = 0;   // stage3_prefetch_bucket_size
  std::size_t max_live_elements = 0;   // stage3_max_live_parameters; 0 = no limit
  std::vector<std::size_t> unit_elements;  // per unit: its flat length
  std::vector<std::vector<int>> borrowed;  // per unit: Unit::borrowed_units()
  // per unit: Unit::borrows_in_turn() (missing: false); such a unit holds one borrowed unit at a
  // time, so one slot of each lender's class, not one per lender
  std::vector<bool> borrows_in_turn;
};

// The ring's slots, class by class. Each class has enough slots for the units of the class one
// computation holds at once (a unit and the units it borrows) plus one gathered ahead, and more
// to gather stage3_prefetch_bucket_size elements ahead; never more slots than the class has
// units; at most stage3_max_live_parameters elements in all (classes with the largest slots
// give up slots first). The engine and the memory planner both size the ring here.
struct GatherRingLayout {
  struct SizeClass {
    std::size_t slot_elements = 0;  // the class's largest unit
    std::size_t slots = 0;
    std::size_t units = 0;          // how many units belong to it
  };
  std::vector<SizeClass> classes;  // largest slots first
  std::vector<int> class_of;       // per unit

  std::size_t elements() const;  // of every slot together
  // Whether `unit` is the only unit of its class (its slot is nobody else's).
  bool alone_in_class(int unit) const;
};
// Throws a kConfig Error when stage3_max_live_parameters is below what one computation needs.
GatherRingLayout gather_ring_layout(const GatherRingSizing& sizing);

// offload_param: puts `unit`'s shard (in the host tier or on NVMe) at `device` in `stream` order.
using ShardFetch = std::function<void(const FlatUnit& unit, Stream& stream, void* device)>;

class GatherRing {
 public:
  // With `fetch_shard` (offload_param) a unit's shard lives off the device: pin() fetches it
  // into its place in the slot on the gathering stream, then gathers in place.
  GatherRing(Device& device, const GatherRingLayout& layout, DType dtype,
             ShardFetch fetch_shard = {});

  // Makes `unit`'s full flat parameters present, pins its slot and returns them (valid for
  // `compute` work enqueued after this call until unpin()). With `secondary` (hpZ), it gathers
  // the unit into the slot instead of `communicator` (with qwZ, its gathers across the group
  // through quantize_gathers' buffer).
  void* pin(const FlatUnit& unit, Stream& comm, Stream& compute, Communicator& communicator,
            SecondaryShard* secondary = nullptr);
  // The compute work enqueued so far is the last to read `unit`'s slot.
  void unpin(const FlatUnit& unit, Stream& compute);
  // `unit`'s slot (it must be resident) becomes its gradient bucket: zeroed on `compute` now,
  // after the work already enqueued there, unless it holds the gradient already. Kept out of
  // reuse until gradient_reduced().
  void* hold_gradient(const FlatUnit& unit, Device& device, Stream& compute);
  // The gradient in `unit`'s slot has been read by the work enqueued on `comm` so far; the slot
  // holds nothing once it has run.
  void gradient_reduced(const FlatUnit& unit, Stream& comm);
  // Forgets what the slots hold (the shards changed, or the step ended).
  void clear();
  // qwZ: gathers go through `gather` (int8 blocks; owned by the caller, outlives the ring).
  void quantize_gathers(QuantizedGather* gather) { quantized_ = gather; }

  std::size_t slot_count() const { return slots_.size(); }
  // How many slots hold a unit now (for tests: zero between steps).
  std::size_t resident_count() const;

 private:
  struct Slot {
    Buffer buffer;
    std::size_t size_class = 0;
    int resident = -1;  // unit index, or -1
    int pins = 0;       // pin() calls not yet unpinned
    bool holds_gradient = false;
    std::unique_ptr<Event> gathered;
    std::unique_ptr<Event> unpinned;  // the last work that read the slot
  };

  Slot* find(int unit);
  // offload_param: the shard fetched into its place in `slot`, then the all-gather in place.
  void fetch_and_gather(const FlatUnit& unit, Stream& comm, Communicator& communicator,
                        void* slot);
  Slot& held_slot(const FlatUnit& unit);
  Slot& take_free_slot(int unit_index);

  DType dtype_;
  ShardFetch fetch_shard_;
  QuantizedGather* quantized_ = nullptr;
  std::vector<int> class_of_;
  std::vector<Slot> slots_;
  std::vector<std::size_t> cursor_;  // per class, round-robin: the least recently gathered next
};

}  // namespace zest
