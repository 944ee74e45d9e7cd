#include "engine/gradient_reducer.h"

#include <algorithm>
#include <string>
#include <utility>

#include "base/error.h"
#include "kernels/convert.h"
#include "runtime/hybrid_communicator.h"
#include "runtime/release_after.h"

namespace zest {

namespace {
char* byte_offset(void* base, std::size_t bytes) { return static_cast<char*>(base) + bytes; }
}  // namespace

GradientReducer::GradientReducer(RankContext& context, const EngineOptions& options,
                                 const StagePlan& plan, std::vector<FlatUnit>& units,
                                 GradientChecks& checks, ParameterGatherer& gatherer,
                                 FinalShard final_shard)
    : context_(context), options_(options), plan_(plan), units_(units), checks_(checks),
      gatherer_(gatherer), final_shard_(std::move(final_shard)), unit_buckets_(units.size()),
      into_shard_(accumulates_into_shard(plan, options, context.world_size, context.replicas)),
      targeted_(units.size(), false) {
  for (std::size_t i = 0; i < units.size(); ++i) {
    backward_done_.push_back(context.device.create_event());
    bucket_released_.push_back(context.device.create_event());
  }
  serialize_ = context.device.create_event();
  if (options.quantized_gradients && plan.reduction == GradientReduction::kReduceScatter) {
    std::size_t largest = 0;
    for (const FlatUnit& unit : units) largest = std::max(largest, unit.layout.shard_length());
    // Note: with hybrid sharding the shard group reduces as qgZ does without it (inside the
    // node), then the replicas average their shard through the same bits: ZeRO++'s cross-node hop.
    auto* hybrid = dynamic_cast<HybridCommunicator*>(&context.communicator);
    if (context.replicas > 1 && hybrid == nullptr) {
      throw Error(ErrorKind::kInternal, "qgZ with hybrid sharding needs its shard group's "
                                        "communicator (HybridCommunicator)");
    }
    quantized_ = std::make_unique<QuantizedReduceScatter>(
        context.device, hybrid ? hybrid->shard() : context.communicator, context.topology,
        largest, options.quantization_block, options.quantized_gradient_bits);
    if (hybrid) {
      replicas_ = std::make_unique<QuantizedReplicaMean>(
          context.device, hybrid->replica(), largest, options.quantization_block,
          options.quantized_gradient_bits);
    }
  }
  forward_done_ = context.device.create_event();
  for (std::size_t i = 0; i < kForwardCallsAhead; ++i) {
    forward_calls_.push_back(context.device.create_event());
  }
}

void GradientReducer::forward_call_begins() {
  if (into_shard_ && forward_calls_begun_ >= kForwardCallsAhead) {
    forward_calls_[forward_calls_begun_ % kForwardCallsAhead]->synchronize();
  }
}

void GradientReducer::forward_call_done() {
  if (!into_shard_) return;
  context_.compute.record(*forward_calls_[forward_calls_begun_ % kForwardCallsAhead]);
  ++forward_calls_begun_;
}

bool accumulates_into_shard(const StagePlan& plan, const EngineOptions& options, int group_size,
                            int replicas) {
  return plan.reduce_per_unit && group_size == 1 && replicas == 1 &&
         options.communication_dtype == options.compute_dtype;
}

void GradientReducer::wait_for_bucket() {
  // Note: at most kLiveGradientBuckets buckets exist at once: one being written by backward
  // and one being reduced meanwhile. Without the bound, a host that runs ahead of the comm
  // stream would hold every unit's full gradients at once, which is what stage 2 avoids.
  // Gradients accumulated into their shard keep a wait with no bucket, closer still: one rank
  // has no communication to overlap, and a host ahead of compute holds every scratch buffer
  // compute has yet to free: the forward's workspaces and the head's logits beside the next
  // unit's backward (at one rank, vocabulary 50257: 15.6 MiB, and 21 MiB more with no wait).
  if (forward_pending_) {
    forward_done_->synchronize();
    forward_pending_ = false;
  }
  const std::size_t live = into_shard_ ? kLiveShardTargets : kLiveGradientBuckets;
  while (buckets_in_flight_.size() >= live) {
    bucket_released_[buckets_in_flight_.front()]->synchronize();
    buckets_in_flight_.pop_front();
  }
}

void* GradientReducer::target(FlatUnit& unit) {
  if (!plan_.reduce_per_unit) return unit.grads.data();
  const auto index = static_cast<std::size_t>(unit.index);
  if (into_shard_) {
    if (!targeted_[index]) wait_for_bucket();
    targeted_[index] = true;
    return unit.grads.data();
  }
  if (gatherer_.gradient_in_slot(unit)) return gatherer_.gradient_slot(unit);
  Buffer& bucket = unit_buckets_[index];
  if (bucket.empty()) {
    wait_for_bucket();
    bucket = context_.allocator().allocate(unit.layout.flat_length() * dtype_size(options_.compute_dtype),
                                           Category::kBuckets);
    context_.device.fill_zero(context_.compute, bucket.data(), bucket.bytes());
  }
  return bucket.data();
}

void GradientReducer::backward_begins(bool last_micro_batch) {
  last_micro_batch_ = last_micro_batch;
  // Stages 0-1 keep full gradients and reduce them once per step; stages 2-3 must reduce
  // every micro-batch, since only the shard is kept between them.
  reduce_now_ = plan_.reduce_every_micro_batch || last_micro_batch;
  if (into_shard_) {  // the first target waits for the forward (wait_for_bucket)
    context_.compute.record(*forward_done_);
    forward_pending_ = true;
    forward_calls_begun_ = 0;
  }
  bucket_.clear();
  bucket_elements_ = 0;
}

void GradientReducer::unit_done(FlatUnit& unit) {
  if (!reduce_now_) return;
  bucket_.push_back(unit.index);
  bucket_elements_ += unit.layout.flat_length();
  // Stages 2-3 reduce every unit at once (only its shard may outlive its backward); stages
  // 0-1 wait until the bucket holds reduce_bucket_size elements or backward is done.
  if (plan_.reduce_per_unit || bucket_elements_ >= options_.reduce_bucket_size || unit.index == 0) {
    for (int member : bucket_) reduce(units_[static_cast<std::size_t>(member)]);
    bucket_.clear();
    bucket_elements_ = 0;
    if (!options_.overlap_comm) {
      context_.comm.record(*serialize_);
      context_.compute.wait(*serialize_);
    }
  }
}

void GradientReducer::reduce(FlatUnit& unit) {
  if (into_shard_) {
    // The gradient is its shard already: nothing to reduce, but the checks, and the comm
    // stream's order for whoever reads the final shard there (the offloaded optimizer), stay.
    checks_.check_before_reduction(unit, unit.grads.data(), unit.layout.flat_length());
    Event& written = *backward_done_[static_cast<std::size_t>(unit.index)];
    context_.compute.record(written);
    context_.comm.wait(written);
    if (last_micro_batch_ && final_shard_) final_shard_(unit);
    targeted_[static_cast<std::size_t>(unit.index)] = false;
    context_.comm.record(*bucket_released_[static_cast<std::size_t>(unit.index)]);
    buckets_in_flight_.push_back(unit.index);
    return;
  }
  Buffer& bucket = unit_buckets_[static_cast<std::size_t>(unit.index)];
  const bool in_slot = plan_.reduce_per_unit && gatherer_.gradient_in_slot(unit);
  void* source = in_slot                  ? gatherer_.gradient_slot(unit)
                 : plan_.reduce_per_unit ? bucket.data()
                                         : unit.grads.data();
  const std::size_t full = unit.layout.flat_length();
  // Note: checked before the reduction mixes the ranks' gradients, so that a NaN is traced to
  // the rank where it arose; in compute-stream order, so the comm stream waits for the check.
  checks_.check_before_reduction(unit, source, full);
  // The comm stream reduces this unit's gradients while compute goes on to the previous unit.
  Event& written = *backward_done_[static_cast<std::size_t>(unit.index)];
  context_.compute.record(written);
  Stream& comm = context_.comm;
  comm.wait(written);
  const DType held = options_.compute_dtype;
  const DType wire = options_.communication_dtype;
  const std::size_t shard = unit.layout.shard_length();
  const std::size_t first = context_.rank * shard;
  if (quantized_) {
    reduce_quantized(unit, source, shard, first);
  } else {
    // Reduce in the communication dtype: in place when it is the dtype gradients are held in,
    // else through a converted copy (charged to buckets).
    Buffer converted;
    void* reduced = source;
    if (wire != held) {
      converted = context_.allocator().allocate(full * dtype_size(wire), Category::kBuckets);
      convert(comm, source, held, converted.data(), wire, full);
      reduced = converted.data();
    }
    void* reduced_shard = byte_offset(reduced, first * dtype_size(wire));
    Communicator& communicator = context_.communicator;
    communicator.label_next(("reduce " + unit.layout.unit_name()).c_str());
    if (plan_.reduction == GradientReduction::kAllReduce) {
      communicator.all_reduce(comm, reduced, reduced, full, wire, Reduction::kMean);
      if (wire != held) convert(comm, reduced, wire, source, held, full);
    } else {
      communicator.reduce_scatter(comm, reduced, reduced_shard, shard, wire, Reduction::kMean);
      if (!plan_.grads_sharded) {  // the full buffer keeps the reduced shard at its place
        if (wire != held) {
          convert(comm, reduced_shard, wire, byte_offset(source, first * dtype_size(held)), held,
                  shard);
        }
      } else {
        accumulate_into(comm, unit.grads.data(), held, reduced_shard, wire, shard);
      }
    }
    release_after(context_.device, comm, std::move(converted));
  }
  if (in_slot) {
    gatherer_.gradient_reduced(unit);
  } else if (plan_.reduce_per_unit) {
    release_after(context_.device, comm, std::move(bucket));
    comm.record(*bucket_released_[static_cast<std::size_t>(unit.index)]);
    buckets_in_flight_.push_back(unit.index);
  }
  // The step's gradient shard is final after the last micro-batch's reduction.
  if (last_micro_batch_ && final_shard_) final_shard_(unit);
}

// qgZ: the reduce-scatter through int8 or int4 blocks, the mean in fp32 (quantized_collectives.h);
// with hybrid sharding, then the replicas' mean through the same blocks (quantized_replicas.h).
void GradientReducer::reduce_quantized(FlatUnit& unit, void* source, std::size_t shard,
                                       std::size_t first) {
  Stream& comm = context_.comm;
  const DType held = options_.compute_dtype;
  const std::string label = "reduce " + unit.layout.unit_name();
  quantized_->reduce_scatter(comm, source, held, shard, label.c_str());
  if (replicas_) replicas_->mean(comm, quantized_->result(), shard, label.c_str());
  if (!plan_.grads_sharded) {  // the full buffer keeps the reduced shard at its place
    convert(comm, quantized_->result(), DType::kFloat32,
            byte_offset(source, first * dtype_size(held)), held, shard);
  } else {
    accumulate_into(comm, unit.grads.data(), held, quantized_->result(), DType::kFloat32, shard);
  }
}

}  // namespace zest
