#include "engine/sub_module.h"

#include <algorithm>
#include <set>
#include <string>

#include "base/error.h"

namespace zest {

// Forwards everything to the whole model's unit but borrowed_units(), renumbered for the part.
class SubModule::View final : public Unit {
 public:
  View(Unit& unit, std::vector<int> borrowed) : unit_(unit), borrowed_(std::move(borrowed)) {}

  const std::string& name() const override { return unit_.name(); }
  std::vector<ParamSpec> parameters() const override { return unit_.parameters(); }
  std::vector<int> borrowed_units() const override { return borrowed_; }
  bool gradients_replace_parameters() const override {
    return unit_.gradients_replace_parameters();
  }
  bool borrows_in_turn() const override { return unit_.borrows_in_turn(); }
  bool backward_reads_parameters() const override { return unit_.backward_reads_parameters(); }
  void forward(UnitContext& context) override { unit_.forward(context); }
  void backward(UnitContext& context) override { unit_.backward(context); }
  bool supports_selective_recompute() const override {
    return unit_.supports_selective_recompute();
  }
  void recompute(UnitContext& context) override { unit_.recompute(context); }
  bool supports_split_backward() const override { return unit_.supports_split_backward(); }
  void backward_input(UnitContext& context) override { unit_.backward_input(context); }
  void backward_weight(UnitContext& context) override { unit_.backward_weight(context); }

 private:
  Unit& unit_;
  std::vector<int> borrowed_;
};

SubModule::SubModule(Module& whole, std::size_t begin, std::size_t end)
    : tensor_parallel_group_(whole.tensor_parallel_group()) {
  std::vector<Unit*> all = whole.units();
  if (begin >= end || end > all.size()) {
    throw Error(ErrorKind::kUsage, "units [" + std::to_string(begin) + ", " + std::to_string(end) +
                                       ") of a module of " + std::to_string(all.size()) +
                                       " units: not a non-empty range of it");
  }
  // Lenders before the range, and their own lenders, in model order.
  std::set<int> lenders;
  std::vector<int> pending;
  for (std::size_t u = begin; u < end; ++u) {
    for (int b : all[u]->borrowed_units()) pending.push_back(b);
  }
  while (!pending.empty()) {
    const int b = pending.back();
    pending.pop_back();
    if (b < 0 || b >= static_cast<int>(all.size())) {
      throw Error(ErrorKind::kUsage, "unit '" + all[begin]->name() + "' borrows unit " +
                                         std::to_string(b) + ", which the module does not have");
    }
    if (b >= static_cast<int>(begin) || !lenders.insert(b).second) continue;
    for (int c : all[static_cast<std::size_t>(b)]->borrowed_units()) pending.push_back(c);
  }
  whole_.assign(lenders.begin(), lenders.end());
  copies_ = whole_.size();
  for (std::size_t u = begin; u < end; ++u) whole_.push_back(static_cast<int>(u));
  for (int w : whole_) {
    std::vector<int> borrowed;
    for (int b : all[static_cast<std::size_t>(w)]->borrowed_units()) {
      const auto at = std::find(whole_.begin(), whole_.end(), b);
      borrowed.push_back(static_cast<int>(at - whole_.begin()));
    }
    views_.push_back(std::make_unique<View>(*all[static_cast<std::size_t>(w)], std::move(borrowed)));
  }
}

SubModule::~SubModule() = default;

std::vector<Unit*> SubModule::units() {
  std::vector<Unit*> units;
  for (auto& view : views_) units.push_back(view.get());
  return units;
}

int SubModule::initialization_index(std::size_t unit) const { return whole_.at(unit); }

}  // namespace zest
