#include "pipeline/schedule_simulator.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "base/error.h"

namespace zest {

namespace {

constexpr double kNever = -1.0;

// What a send puts on the wire between two pipeline stages.
struct Message {
  bool activations = true;  // else gradients
  int micro_batch = 0;
  int virtual_stage = 0;  // the receiver's virtual stage, which consumes it
  double arrival = 0.0;
};

class Simulator {
 public:
  Simulator(const Schedule& schedule, const ScheduleCosts& costs)
      : s_(schedule),
        costs_(costs),
        vs_(schedule.virtual_stages()),
        m_(schedule.micro_batches),
        forward_(table()),
        input_grad_(table()),
        weight_grad_(table()),
        received_activations_(table()),
        received_gradients_(table()),
        reduced_(static_cast<std::size_t>(schedule.pipeline_stages), kNever),
        clock_(static_cast<std::size_t>(schedule.pipeline_stages), 0.0),
        next_(static_cast<std::size_t>(schedule.pipeline_stages), 0),
        in_flight_(static_cast<std::size_t>(schedule.pipeline_stages), 0) {}

  ScheduleSimulation run() {
    check_shape();
    result_.pipeline_stages.resize(static_cast<std::size_t>(s_.pipeline_stages));
    for (int p = 0; p < s_.pipeline_stages; ++p) {
      result_.pipeline_stages[p].start.assign(s_.actions[p].size(), kNever);
    }
    for (;;) {
      bool progress = false, finished = true;
      for (int p = 0; p < s_.pipeline_stages; ++p) {
        while (next_[p] < s_.actions[p].size()) {
          std::optional<double> start = try_run(p, s_.actions[p][next_[p]]);
          if (!start) break;
          result_.pipeline_stages[p].start[next_[p]] = *start;
          ++next_[p];
          progress = true;
        }
        finished = finished && next_[p] == s_.actions[p].size();
      }
      if (finished) break;
      if (!progress) deadlock();
    }
    check_complete();
    double busy = 0.0;
    for (int p = 0; p < s_.pipeline_stages; ++p) {
      result_.pipeline_stages[p].finish = clock_[p];
      result_.makespan = std::max(result_.makespan, clock_[p]);
      busy += result_.pipeline_stages[p].busy;
    }
    const double total = result_.makespan * s_.pipeline_stages;
    result_.bubble_ratio = busy > 0 ? (total - busy) / busy : 0.0;
    result_.idle_fraction = total > 0 ? (total - busy) / total : 0.0;
    return result_;
  }

 private:
  std::vector<std::vector<double>> table() const {
    return std::vector<std::vector<double>>(static_cast<std::size_t>(vs_),
                                            std::vector<double>(static_cast<std::size_t>(m_), kNever));
  }

  [[noreturn]] void fail(const std::string& message) const {
    throw Error(ErrorKind::kUsage, fmt::format("pipeline schedule {}: {}", s_.name, message));
  }

  std::string at(int pipeline_stage, const Action& action) const {
    return fmt::format("pipeline stage {} runs {}", pipeline_stage,
                       describe_action(action, s_.chunks));
  }

  void check_shape() const {
    if (s_.pipeline_stages < 1 || s_.chunks < 1 || s_.micro_batches < 1 ||
        static_cast<int>(s_.actions.size()) != s_.pipeline_stages) {
      fail(
          fmt::format("{} pipeline stages, {} chunks, {} micro-batches and action lists for {} "
                      "pipeline stages do not make a schedule",
                      s_.pipeline_stages, s_.chunks, s_.micro_batches, s_.actions.size()));
    }
    for (int p = 0; p < s_.pipeline_stages; ++p) {
      for (const Action& action : s_.actions[p]) {
        const bool whole_step = action.kind == ActionKind::kReduce || action.kind == ActionKind::kStep;
        if (!whole_step && (action.micro_batch < 0 || action.micro_batch >= m_ ||
                            action.chunk < 0 || action.chunk >= s_.chunks)) {
          fail(at(p, action) + fmt::format(", outside {} micro-batches and {} chunks", m_, s_.chunks));
        }
        const bool transfer = action.kind >= ActionKind::kSendActivations &&
                              action.kind <= ActionKind::kReceiveGradients;
        if (transfer && action.peer == p) fail(at(p, action) + ": a rank cannot wait on itself");
        if (transfer && (action.peer < 0 || action.peer >= s_.pipeline_stages)) {
          fail(at(p, action) +
               fmt::format(", but there are {} pipeline stages", s_.pipeline_stages));
        }
      }
    }
  }

  double& cell(std::vector<std::vector<double>>& t, int virtual_stage, int micro_batch) {
    return t[static_cast<std::size_t>(virtual_stage)][static_cast<std::size_t>(micro_batch)];
  }

  // When this forward's input is there; nullopt: not yet. Fails if it can never be.
  std::optional<double> input_ready(int pipeline_stage, const Action& action, int v) {
    if (v == 0) return 0.0;
    if (s_.stage_of(v - 1) == pipeline_stage) {
      const double made = cell(forward_, v - 1, action.micro_batch);
      if (made == kNever)
        fail(at(pipeline_stage, action) + " before the forward of virtual stage " +
             std::to_string(v - 1) + " that makes its input");
      return made;
    }
    const double received = cell(received_activations_, v, action.micro_batch);
    if (received == kNever) fail(at(pipeline_stage, action) + " before receiving its activations");
    return received;
  }

  std::optional<double> gradient_ready(int pipeline_stage, const Action& action, int v) {
    if (v == vs_ - 1) return 0.0;  // the loss is computed here
    if (s_.stage_of(v + 1) == pipeline_stage) {
      const double made = cell(input_grad_, v + 1, action.micro_batch);
      if (made == kNever)
        fail(at(pipeline_stage, action) + " before the backward of virtual stage " +
             std::to_string(v + 1) + " that makes its gradient");
      return made;
    }
    const double received = cell(received_gradients_, v, action.micro_batch);
    if (received == kNever) fail(at(pipeline_stage, action) + " before receiving its gradients");
    return received;
  }

  double compute(int pipeline_stage, double ready, double cost) {
    const double start = std::max(clock_[pipeline_stage], ready);
    clock_[pipeline_stage] = start + cost;
    result_.pipeline_stages[pipeline_stage].busy += cost;
    return start;
  }

  // Runs `action` of `pipeline_stage` if it can start; its start time, or nullopt while it must
  // wait.
  std::optional<double> try_run(int pipeline_stage, const Action& action) {
    const int v = s_.virtual_stage(pipeline_stage, action.chunk);
    const int mb = action.micro_batch;
    switch (action.kind) {
      case ActionKind::kForward: {
        if (cell(forward_, v, mb) != kNever) fail(at(pipeline_stage, action) + " a second time");
        const double ready = *input_ready(pipeline_stage, action, v);
        const double start = compute(pipeline_stage, ready, costs_.forward);
        cell(forward_, v, mb) = clock_[pipeline_stage];
        note_in_flight(pipeline_stage, +1);
        return start;
      }
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        if (cell(forward_, v, mb) == kNever)
          fail(at(pipeline_stage, action) + " before its forward");
        if (cell(input_grad_, v, mb) != kNever) fail(at(pipeline_stage, action) + " a second time");
        const double ready =
            std::max(cell(forward_, v, mb), *gradient_ready(pipeline_stage, action, v));
        const bool whole = action.kind == ActionKind::kBackward;
        const double cost = costs_.backward_input + (whole ? costs_.backward_weight : 0.0);
        const double start = compute(pipeline_stage, ready, cost);
        cell(input_grad_, v, mb) = clock_[pipeline_stage];
        if (whole) {
          cell(weight_grad_, v, mb) = clock_[pipeline_stage];
          note_in_flight(pipeline_stage, -1);
        }
        return start;
      }
      case ActionKind::kBackwardWeight: {
        if (cell(input_grad_, v, mb) == kNever)
          fail(at(pipeline_stage, action) + " before its backward-input");
        if (cell(weight_grad_, v, mb) != kNever)
          fail(at(pipeline_stage, action) + " a second time");
        const double start =
            compute(pipeline_stage, cell(input_grad_, v, mb), costs_.backward_weight);
        cell(weight_grad_, v, mb) = clock_[pipeline_stage];
        note_in_flight(pipeline_stage, -1);
        return start;
      }
      case ActionKind::kSendActivations:
      case ActionKind::kSendGradients: {
        const bool activations = action.kind == ActionKind::kSendActivations;
        const int to = activations ? v + 1 : v - 1;
        if (to < 0 || to >= vs_ || s_.stage_of(to) != action.peer) {
          fail(at(pipeline_stage, action) +
               fmt::format(", but the virtual stage that needs them is {}",
                           to < 0 || to >= vs_
                               ? std::string("none")
                               : fmt::format("on pipeline stage {}", s_.stage_of(to))));
        }
        const double made = activations ? cell(forward_, v, mb) : cell(input_grad_, v, mb);
        if (made == kNever) fail(at(pipeline_stage, action) + " before computing them");
        const double start = std::max(clock_[pipeline_stage], made);
        clock_[pipeline_stage] = start;
        channels_[{pipeline_stage, action.peer}].push_back(
            {activations, mb, to, start + costs_.transfer});
        return start;
      }
      case ActionKind::kReceiveActivations:
      case ActionKind::kReceiveGradients: {
        const bool activations = action.kind == ActionKind::kReceiveActivations;
        auto& channel = channels_[{action.peer, pipeline_stage}];
        if (channel.empty()) return std::nullopt;  // its send has not run yet
        const Message& head = channel.front();
        if (head.activations != activations || head.micro_batch != mb || head.virtual_stage != v) {
          fail(at(pipeline_stage, action) +
               fmt::format(", but the next transfer pipeline stage {} sends "
                           "it is {} of micro-batch {} for virtual stage {}; "
                           "transfers between two pipeline stages pair in order",
                           action.peer, head.activations ? "activations" : "gradients",
                           head.micro_batch, head.virtual_stage));
        }
        const double start = std::max(clock_[pipeline_stage], head.arrival);
        clock_[pipeline_stage] = start;
        cell(activations ? received_activations_ : received_gradients_, v, mb) = start;
        channel.pop_front();
        return start;
      }
      case ActionKind::kReduce: {
        for (int c = 0; c < s_.chunks; ++c) {
          for (int b = 0; b < m_; ++b) {
            if (cell(weight_grad_, s_.virtual_stage(pipeline_stage, c), b) == kNever) {
              fail(at(pipeline_stage, action) +
                   fmt::format(" before the weight gradient of micro-batch {}{}", b,
                               s_.chunks > 1 ? fmt::format(" (chunk {})", c) : ""));
            }
          }
        }
        if (reduced_[pipeline_stage] != kNever) fail(at(pipeline_stage, action) + " a second time");
        reduced_[pipeline_stage] = clock_[pipeline_stage];
        return clock_[pipeline_stage];
      }
      case ActionKind::kStep:
        if (reduced_[pipeline_stage] == kNever)
          fail(at(pipeline_stage, action) + " before its reduce");
        if (stepped_.size() <= static_cast<std::size_t>(pipeline_stage))
          stepped_.resize(s_.pipeline_stages, false);
        if (stepped_[pipeline_stage]) fail(at(pipeline_stage, action) + " a second time");
        stepped_[pipeline_stage] = true;
        return clock_[pipeline_stage];
    }
    return std::nullopt;
  }

  void note_in_flight(int pipeline_stage, int change) {
    in_flight_[pipeline_stage] += change;
    result_.pipeline_stages[pipeline_stage].peak_in_flight = std::max(
        result_.pipeline_stages[pipeline_stage].peak_in_flight, in_flight_[pipeline_stage]);
  }

  [[noreturn]] void deadlock() const {
    std::string waits;
    for (int p = 0; p < s_.pipeline_stages; ++p) {
      if (next_[p] == s_.actions[p].size()) continue;
      const Action& action = s_.actions[p][next_[p]];
      if (!waits.empty()) waits += "; ";
      waits += fmt::format("pipeline stage {} waits at action {} ({}), which pipeline stage {} "
                           "sends only later or never",
                           p, next_[p], describe_action(action, s_.chunks), action.peer);
    }
    fail("deadlock: " + waits);
  }

  void check_complete() {
    for (const auto& [ends, channel] : channels_) {
      if (channel.empty()) continue;
      const Message& left = channel.front();
      fail(fmt::format("pipeline stage {} sends {} of micro-batch {} to pipeline stage {}, which "
                       "never receives them; every send needs its receive",
                       ends.first, left.activations ? "activations" : "gradients",
                       left.micro_batch, ends.second));
    }
    for (int v = 0; v < vs_; ++v) {
      for (int b = 0; b < m_; ++b) {
        const char* missing = cell(forward_, v, b) == kNever       ? "forward"
                              : cell(input_grad_, v, b) == kNever  ? "backward"
                              : cell(weight_grad_, v, b) == kNever ? "backward-weight"
                                                                   : nullptr;
        if (missing != nullptr) {
          fail(fmt::format("micro-batch {}{} has no {} on pipeline stage {}", b,
                           s_.chunks > 1 ? fmt::format(" (chunk {})", s_.chunk_of(v)) : "",
                           missing, s_.stage_of(v)));
        }
      }
    }
    for (int p = 0; p < s_.pipeline_stages; ++p) {
      if (reduced_[p] == kNever) fail(fmt::format("pipeline stage {} never reduces", p));
      if (stepped_.size() <= static_cast<std::size_t>(p) || !stepped_[p]) {
        fail(fmt::format("pipeline stage {} never steps", p));
      }
    }
  }

  const Schedule& s_;
  const ScheduleCosts costs_;
  const int vs_;
  const int m_;
  // Per virtual stage and micro-batch: when each was done (kNever: not yet).
  std::vector<std::vector<double>> forward_, input_grad_, weight_grad_;
  std::vector<std::vector<double>> received_activations_, received_gradients_;
  std::vector<double> reduced_;
  std::vector<bool> stepped_;
  std::vector<double> clock_;
  std::vector<std::size_t> next_;
  std::vector<int> in_flight_;
  std::map<std::pair<int, int>, std::deque<Message>> channels_;
  ScheduleSimulation result_;
};

}  // namespace

ScheduleSimulation simulate_schedule(const Schedule& schedule, const ScheduleCosts& costs) {
  return Simulator(schedule, costs).run();
}

double closed_form_bubble_ratio(ScheduleKind kind, int pipeline_stages, int micro_batches,
                                int chunks) {
  const double p = pipeline_stages, m = micro_batches, v = chunks;
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB: return (p - 1) / m;
    case ScheduleKind::kInterleavedOneFOneB: return (p - 1) / (v * m);
    case ScheduleKind::kZeroBubbleH1: return (p - 1) / (3 * m);
  }
  return 0.0;
}

}  // namespace zest
