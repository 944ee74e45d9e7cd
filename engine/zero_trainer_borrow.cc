// ZeroTrainer's borrowing in turn (Unit::borrows_in_turn): a borrowed unit pinned at the unit's
// first ask and unpinned when the unit hands it back, so a head tied to an embedding in vocabulary
// pieces holds one piece (and in 2-byte training one fp32 copy of it) at a time.
#include "engine/zero_trainer.h"

#include "kernels/convert.h"

namespace zest {

bool ZeroTrainer::pins_own(const FlatUnit& unit, bool backward, bool recomputed) const {
  // A backward that reads no parameter (Unit::backward_reads_parameters) needs no gather, unless
  // it is recomputed first or its gradient lives in its gather slot.
  return !backward || recomputed || unit.backward_reads_parameters ||
         gatherer_->gradient_in_slot(unit);
}

bool ZeroTrainer::defer_borrowed(FlatUnit& unit, CallViews& views) {
  views.borrowed_pinned.assign(unit.borrowed.size(), !unit.borrows_in_turn);
  if (!unit.borrows_in_turn) return false;
  // Pinned, and their gradients made, when the unit first asks (pin_borrowed).
  views.borrowed_params.assign(unit.borrowed.size(), nullptr);
  views.borrowed_grads.assign(unit.borrowed.size(), nullptr);
  views.borrowed_copies.resize(unit.borrowed.size());
  return true;
}

void ZeroTrainer::unpin_borrowed_units(FlatUnit& unit, CallViews& views) {
  if (!unit.borrows_in_turn) {
    for (int b : unit.borrowed) gatherer_->unpin(units_[b]);
    return;
  }
  for (std::size_t b = 0; b < unit.borrowed.size(); ++b) unpin_borrowed(unit, views, b);
}

void ZeroTrainer::pin_borrowed(FlatUnit& unit, CallViews& views, std::size_t b) {
  if (!unit.borrows_in_turn || views.borrowed_pinned.at(b)) return;
  FlatUnit& lender = units_.at(static_cast<std::size_t>(unit.borrowed.at(b)));
  void* params = gatherer_->pin(lender);
  views.borrowed_pinned[b] = true;
  if (options_.compute_dtype == DType::kFloat32) {
    views.borrowed_params[b] = static_cast<float*>(params);
    return;
  }
  // Note: the fp32 copy of a 2-byte piece lives from its pin to its unpin, so that a unit
  // borrowing in turn holds one copy at a time (the planner replays it so).
  Buffer copy = context_.allocator().allocate(lender.layout.flat_length() * sizeof(float),
                                              Category::kWorkspace);
  convert(context_.compute, params, options_.compute_dtype, copy.data(), DType::kFloat32,
          lender.layout.flat_length());
  views.borrowed_params[b] = copy.as<float>();
  views.borrowed_copies[b] = std::move(copy);
}

void ZeroTrainer::unpin_borrowed(FlatUnit& unit, CallViews& views, std::size_t b) {
  if (!unit.borrows_in_turn || !views.borrowed_pinned.at(b)) return;
  views.borrowed_pinned[b] = false;
  views.borrowed_params[b] = nullptr;
  release_on(context_.compute, std::move(views.borrowed_copies[b]));
  gatherer_->unpin(units_.at(static_cast<std::size_t>(unit.borrowed[b])));
}

}  // namespace zest
