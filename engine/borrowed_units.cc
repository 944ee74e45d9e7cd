#include "engine/borrowed_units.h"

#include <utility>

#include "kernels/convert.h"
#include "runtime/release_after.h"

namespace zest {

BorrowedUnits::BorrowedUnits(RankContext& context, DType compute_dtype,
                             std::vector<FlatUnit>& units, ParameterGatherer& gatherer)
    : context_(context), compute_dtype_(compute_dtype), units_(units), gatherer_(gatherer) {}

std::vector<void*> BorrowedUnits::pin_at_once(const FlatUnit& unit) {
  std::vector<void*> params;
  if (unit.borrows_in_turn) return params;
  for (std::size_t b = 0; b < unit.borrowed.size(); ++b) params.push_back(gatherer_.pin(lender(unit, b)));
  return params;
}

bool BorrowedUnits::begin(const FlatUnit& unit, Call& call) const {
  call.pinned.assign(unit.borrowed.size(), !unit.borrows_in_turn);
  if (!unit.borrows_in_turn) return false;
  // Pinned, and their gradients made, when the unit first asks (pin).
  call.params.assign(unit.borrowed.size(), nullptr);
  call.grads.assign(unit.borrowed.size(), nullptr);
  call.copies.resize(unit.borrowed.size());
  return true;
}

void BorrowedUnits::pin(const FlatUnit& unit, Call& call, std::size_t b) {
  if (!unit.borrows_in_turn || call.pinned.at(b)) return;
  FlatUnit& from = lender(unit, b);
  void* params = gatherer_.pin(from);
  call.pinned[b] = true;
  if (compute_dtype_ == DType::kFloat32) {
    call.params[b] = static_cast<float*>(params);
    return;
  }
  // Note: the fp32 copy of a 2-byte piece lives from its pin to its unpin, so that a unit
  // borrowing in turn holds one copy at a time (the planner replays it so).
  Buffer copy = context_.allocator().allocate(from.layout.flat_length() * sizeof(float),
                                              Category::kWorkspace);
  convert(context_.compute, params, compute_dtype_, copy.data(), DType::kFloat32,
          from.layout.flat_length());
  call.params[b] = copy.as<float>();
  call.copies[b] = std::move(copy);
}

void BorrowedUnits::unpin(const FlatUnit& unit, Call& call, std::size_t b) {
  if (!unit.borrows_in_turn || !call.pinned.at(b)) return;
  call.pinned[b] = false;
  call.params[b] = nullptr;
  release_after(context_.device, context_.compute, std::move(call.copies[b]));
  gatherer_.unpin(lender(unit, b));
}

void BorrowedUnits::unpin_all(const FlatUnit& unit, Call& call) {
  if (!unit.borrows_in_turn) {
    for (std::size_t b = 0; b < unit.borrowed.size(); ++b) gatherer_.unpin(lender(unit, b));
    return;
  }
  for (std::size_t b = 0; b < unit.borrowed.size(); ++b) unpin(unit, call, b);
}

}  // namespace zest
