// The units a unit's call borrows (Unit::borrowed_units: the GPT head reads the embedding's
// parameters), pinned in the parameter gatherer around the call. A unit that borrows at once has
// every lender pinned before its call; one that borrows in turn (Unit::borrows_in_turn: a head
// tied to an embedding cut into vocabulary pieces) pins a lender at its first ask and unpins it
// when it hands it back, so it holds one piece, and in 2-byte training one fp32 copy of it, at a
// time. Invariant: every lender pinned for a call is unpinned by unpin_all() at the call's end.
#pragma once

#include <cstddef>
#include <vector>

#include "engine/flat_unit.h"
#include "engine/parameter_gatherer.h"
#include "memory/allocator.h"
#include "runtime/world.h"

namespace zest {

class BorrowedUnits {
 public:
  // One call's lenders, each by its place in the borrowing unit's `borrowed` list.
  struct Call {
    std::vector<float*> params;  // fp32 views; null while not pinned (in turn)
    std::vector<float*> grads;   // fp32 views of their gradient targets; null until made
    std::vector<bool> pinned;
    std::vector<Buffer> copies;  // in turn, 2-byte training: the fp32 copy, pin to unpin
  };

  // `units` and `gatherer` outlive this object.
  BorrowedUnits(RankContext& context, DType compute_dtype, std::vector<FlatUnit>& units,
                ParameterGatherer& gatherer);

  // Before a call of a unit that borrows at once: pins every lender and returns their
  // parameters in the compute dtype (nothing for a unit that borrows in turn).
  std::vector<void*> pin_at_once(const FlatUnit& unit);
  // Starts `call`: every lender pinned (at once), or none yet with empty views (in turn; true).
  bool begin(const FlatUnit& unit, Call& call) const;
  // In turn only (no-ops otherwise): pins lender `b` at the unit's first ask, its fp32 view made
  // in 2-byte training, and unpins it when the unit hands it back.
  void pin(const FlatUnit& unit, Call& call, std::size_t b);
  void unpin(const FlatUnit& unit, Call& call, std::size_t b);
  // At the end of the call: unpins every lender still pinned.
  void unpin_all(const FlatUnit& unit, Call& call);

 private:
  FlatUnit& lender(const FlatUnit& unit, std::size_t b) const {
    return units_.at(static_cast<std::size_t>(unit.borrowed.at(b)));
  }

  RankContext& context_;
  DType compute_dtype_;
  std::vector<FlatUnit>& units_;
  ParameterGatherer& gatherer_;
};

}  // namespace zest
