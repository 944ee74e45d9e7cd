// The link model and the wire counters: bytes each rank sends, intra- and inter-node, exactly as
// the ring formulas in runtime/link_model.h say; the modelled delay of a collective that crosses
// nodes, through an injected clock (exact) and the real one (at least that long); none inside a
// node; the trace's inter-node track; and each group's bytes on the mesh axis its name says.
#include "runtime/link_model.h"

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "runtime/world.h"
#include "tests/runtime/local_world_support.h"

namespace zest {
namespace {

using std::chrono::nanoseconds;

constexpr int kAllGather = static_cast<int>(WireKind::kAllGather);
constexpr int kReduceScatter = static_cast<int>(WireKind::kReduceScatter);
constexpr int kAllReduce = static_cast<int>(WireKind::kAllReduce);
constexpr int kSend = static_cast<int>(WireKind::kSend);

LinkOptions modelled_link() {
  LinkOptions link;
  link.modelled = true;
  link.bandwidth_gbit_s = 200.0;  // 25e9 bytes/s
  link.latency_us = 10.0;
  return link;
}

TEST(LinkModel, RingBytesAndTimeFollowTheFormulas) {
  const LinkOptions link = modelled_link();
  // all_gather over 4 ranks on 2 nodes of a 16000-byte buffer: each rank sends 3/4 of it, and
  // 2 of the ring's 4 edges cross nodes; 3 steps of 10 µs + 4000 B / 25e9 B/s = 160 ns.
  LinkCost cost = collective_cost(WireKind::kAllGather, 4, 2, 16000.0, link);
  EXPECT_DOUBLE_EQ(cost.intra_bytes + cost.inter_bytes, 12000.0);
  EXPECT_DOUBLE_EQ(cost.inter_bytes, 6000.0);
  EXPECT_EQ(cost.delay, nanoseconds(3 * (10000 + 160)));
  // all_reduce: twice the steps and the bytes.
  cost = collective_cost(WireKind::kAllReduce, 4, 2, 16000.0, link);
  EXPECT_DOUBLE_EQ(cost.intra_bytes + cost.inter_bytes, 24000.0);
  EXPECT_EQ(cost.delay, nanoseconds(6 * (10000 + 160)));
  // Inside a node: the same bytes, all intra-node, no wait.
  cost = collective_cost(WireKind::kReduceScatter, 4, 0, 16000.0, link);
  EXPECT_DOUBLE_EQ(cost.intra_bytes, 12000.0);
  EXPECT_DOUBLE_EQ(cost.inter_bytes, 0.0);
  EXPECT_EQ(cost.delay, nanoseconds(0));
  // A group of one sends nothing; a send across nodes is one message.
  EXPECT_DOUBLE_EQ(collective_cost(WireKind::kAllReduce, 1, 0, 16000.0, link).intra_bytes, 0.0);
  cost = send_cost(true, 25000.0, link);
  EXPECT_DOUBLE_EQ(cost.inter_bytes, 25000.0);
  EXPECT_EQ(cost.delay, nanoseconds(10000 + 1000));
}

// Every rank's waits, by the name of the group.
struct Waits {
  std::mutex mutex;
  std::map<int, std::vector<nanoseconds>> by_rank;
  LinkCommunicator::Sleep recorder(int rank) {
    return [this, rank](nanoseconds delay) {
      std::lock_guard lock(mutex);
      by_rank[rank].push_back(delay);
    };
  }
};

TEST(LinkModel, CountsEveryRanksBytesAndWaitsOnlyAcrossNodes) {
  Waits waits;
  std::mutex mutex;
  std::map<int, WireBytes> bytes;
  testing::run_world(4, [&](RankContext& context) {
    LinkCommunicator link(context.communicator, Topology(4, 2), modelled_link(), nullptr,
                          waits.recorder(context.rank));
    constexpr std::size_t kCount = 1000;  // fp32: 4000 bytes a rank
    std::vector<float> shard(kCount, 1.0f), full(4 * kCount);
    link.all_gather(context.comm, shard.data(), full.data(), kCount, DType::kFloat32);
    // The node's group (ranks 0, 1 or 2, 3) and the group across nodes (0, 2 or 1, 3).
    auto node = link.split(context.rank / 2, context.rank, "node");
    auto across = link.split(context.rank % 2, context.rank, "across");
    node->reduce_scatter(context.comm, full.data(), shard.data(), kCount / 2, DType::kFloat32,
                         Reduction::kSum);
    across->all_reduce(context.comm, shard.data(), shard.data(), kCount, DType::kFloat32,
                       Reduction::kSum);
    if (context.rank == 0) link.send(context.comm, shard.data(), kCount, DType::kFloat32, 2);
    if (context.rank == 2) link.receive(context.comm, shard.data(), kCount, DType::kFloat32, 0);
    context.comm.synchronize();
    std::lock_guard lock(mutex);
    bytes[context.rank] = link.wire().snapshot();
  });
  for (int rank = 0; rank < 4; ++rank) {
    const WireBytes& b = bytes[rank];
    // all_gather over the world: 3/4 of 16000 bytes, half of it across nodes.
    EXPECT_DOUBLE_EQ(b.intra_node[kAllGather], 6000.0) << rank;
    EXPECT_DOUBLE_EQ(b.inter_node[kAllGather], 6000.0) << rank;
    // reduce_scatter inside the node: 1/2 of 4000 bytes, all intra-node.
    EXPECT_DOUBLE_EQ(b.intra_node[kReduceScatter], 2000.0) << rank;
    EXPECT_DOUBLE_EQ(b.inter_node[kReduceScatter], 0.0) << rank;
    // all_reduce across nodes over 2 ranks: 2 · 1/2 · 4000 bytes, all of it across.
    EXPECT_DOUBLE_EQ(b.intra_node[kAllReduce], 0.0) << rank;
    EXPECT_DOUBLE_EQ(b.inter_node[kAllReduce], 4000.0) << rank;
    EXPECT_DOUBLE_EQ(b.inter_node[kSend], rank == 0 ? 4000.0 : 0.0) << rank;
    EXPECT_DOUBLE_EQ(b.inter_total(), rank == 0 ? 14000.0 : 10000.0) << rank;
  }
  // The all_gather's 3 steps of 10 µs + 4000/4... per step 1000 fp32 = 4000 B / 25e9 B/s =
  // 160 ns; the node's reduce_scatter waits for nothing; the all_reduce across nodes: 2 steps
  // of 10 µs + 2000 B / 25e9 B/s = 80 ns; rank 0's send: 10 µs + 160 ns.
  const std::vector<nanoseconds> expected = {nanoseconds(3 * 10160), nanoseconds(2 * 10080)};
  for (int rank = 0; rank < 4; ++rank) {
    std::vector<nanoseconds> want = expected;
    if (rank == 0) want.push_back(nanoseconds(10160));
    EXPECT_EQ(waits.by_rank[rank], want) << rank;
  }
}

// Each group counts along its mesh axis, by the name it was split with; a group split from
// another keeps its axis unless its name says another.
TEST(LinkModel, GroupsCountAlongTheAxisTheirNameSays) {
  EXPECT_EQ(wire_axis_of("tensor-parallel group of pipeline stage 0, data-parallel index 1 (ranks "
                         "2, 3)",
                         WireAxis::kData),
            WireAxis::kTensor);
  EXPECT_EQ(wire_axis_of("activations of the pipeline group of data-parallel index 0 (ranks 0, 2)",
                         WireAxis::kData),
            WireAxis::kPipeline);
  EXPECT_EQ(wire_axis_of("tied parameters of pipeline stages 0 and 1 (data-parallel index 0)",
                         WireAxis::kData),
            WireAxis::kPipeline);
  EXPECT_EQ(wire_axis_of("data-parallel group of pipeline stage 1 (ranks 2, 3)", WireAxis::kTensor),
            WireAxis::kData);
  EXPECT_EQ(wire_axis_of("shard group 0", WireAxis::kData), WireAxis::kData);
  EXPECT_EQ(wire_axis_of("shard group 0", WireAxis::kPipeline), WireAxis::kPipeline);
  EXPECT_STREQ(wire_axis_name(WireAxis::kTensor), "tensor");

  std::map<int, WireBytes> bytes;
  std::mutex mutex;
  testing::run_world(4, [&](RankContext& context) {
    LinkOptions link = modelled_link();
    link.modelled = false;
    LinkCommunicator world(context.communicator, Topology(4, 2), link, nullptr);
    std::unique_ptr<Communicator> tensor =
        world.split(context.rank / 2, context.rank % 2, "tensor-parallel group of ranks");
    std::unique_ptr<Communicator> pipeline =
        world.split(context.rank % 2, context.rank / 2, "gradients of the pipeline group 0");
    std::unique_ptr<Communicator> within = pipeline->split(0, pipeline->rank(), "a part of it");
    std::vector<float> values(100, 1.0f);  // 400 bytes
    tensor->all_reduce(context.comm, values.data(), values.data(), 100, DType::kFloat32,
                       Reduction::kSum);
    within->all_gather(context.comm, values.data(), values.data(), 50, DType::kFloat32);
    world.all_reduce(context.comm, values.data(), values.data(), 1, DType::kFloat32,
                     Reduction::kSum);
    context.comm.synchronize();
    const std::lock_guard<std::mutex> lock(mutex);
    bytes[context.rank] = world.wire().snapshot();
  });
  for (const auto& [rank, counted] : bytes) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    // all-reduce of 400 B over 2 ranks: 2 (1/2) 400; all-gather of 2 x 200 B over 2: (1/2) 400;
    // all-reduce of 4 B over 4: 2 (3/4) 4.
    EXPECT_DOUBLE_EQ(counted.by_axis[static_cast<int>(WireAxis::kTensor)], 400.0);
    EXPECT_DOUBLE_EQ(counted.by_axis[static_cast<int>(WireAxis::kPipeline)], 200.0);
    EXPECT_DOUBLE_EQ(counted.by_axis[static_cast<int>(WireAxis::kData)], 6.0);
    EXPECT_DOUBLE_EQ(counted.intra_total() + counted.inter_total(), 606.0);
  }
}

TEST(LinkModel, AnUnmodelledLinkCountsBytesButNeverWaits) {
  Waits waits;
  testing::run_world(2, [&](RankContext& context) {
    LinkOptions link = modelled_link();
    link.modelled = false;
    LinkCommunicator wrapped(context.communicator, Topology(2, 1), link, nullptr,
                             waits.recorder(context.rank));
    float value = 1.0f;
    wrapped.all_reduce(context.comm, &value, &value, 1, DType::kFloat32, Reduction::kSum);
    context.comm.synchronize();
    EXPECT_DOUBLE_EQ(wrapped.wire().snapshot().inter_node[kAllReduce], 4.0);
  });
  EXPECT_TRUE(waits.by_rank.empty());
}

TEST(LinkModel, AWorldOnTwoNodesWaitsAtLeastTheModelledTimeAndTracesIt) {
  WorldOptions options;
  options.ranks = 4;
  options.ranks_per_node = 2;
  options.check_collectives = false;
  options.link.bandwidth_gbit_s = 8.0;  // 1e9 bytes/s: 4 MB moved by a ring step take 1 ms
  options.link.latency_us = 0.0;
  options.trace = std::make_shared<TraceRecorder>();
  const World world(options);
  EXPECT_TRUE(world.options().link.modelled.value_or(false));  // auto: threads are modelled
  std::mutex mutex;
  std::vector<double> elapsed_ms(4);
  std::vector<double> inter(4);
  world.run([&](RankContext& context) {
    constexpr std::size_t kCount = 1 << 20;  // 4 MiB of fp32 a rank
    std::vector<float> shard(kCount, 1.0f), full(4 * kCount);
    const auto begin = std::chrono::steady_clock::now();
    context.communicator.all_gather(context.comm, shard.data(), full.data(), kCount,
                                    DType::kFloat32);
    context.comm.synchronize();
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - begin;
    std::lock_guard lock(mutex);
    elapsed_ms[context.rank] = took.count();
    inter[context.rank] = context.wire->snapshot().inter_total();
  });
  // 3 steps of 4 MiB / 1e9 B/s each: 12.58 ms at least.
  const double modelled_ms = 3.0 * (4.0 * (1 << 20)) / 1e9 * 1e3;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_GE(elapsed_ms[rank], modelled_ms) << rank;
    EXPECT_DOUBLE_EQ(inter[rank], 3.0 / 4.0 * 16.0 * (1 << 20) * 2.0 / 4.0) << rank;
  }
  int inter_node_slices = 0;
  for (const TraceRecorder::Slice& slice : options.trace->slices()) {
    if (slice.track == "comm inter-node") {
      ++inter_node_slices;
      EXPECT_EQ(slice.name, "inter-node all_gather");
    }
  }
  EXPECT_EQ(inter_node_slices, 4);
}

// A link so slow that the modelled delay overflows 64 bits of nanoseconds saturates instead of
// wrapping into a negative delay, which turned the model off.
TEST(LinkModel, ADelayTooLongForNanosecondsSaturates) {
  LinkOptions link = modelled_link();
  link.bandwidth_gbit_s = 1e-300;
  EXPECT_EQ(collective_cost(WireKind::kAllGather, 4, 2, 16000.0, link).delay, nanoseconds::max());
  EXPECT_EQ(send_cost(true, 1.0, link).delay, nanoseconds::max());
}

// A modelled wait longer than the timeout (bandwidth_gbit_s 1e-9 slept for days) fails at once
// as a timeout naming the collective, the rank and the link.
TEST(LinkModel, AWaitLongerThanTheTimeoutFailsAtOnceAsATimeout) {
  for (const double bandwidth : {1e-9, 1e-300}) {
    WorldOptions options;
    options.ranks = 2;
    options.ranks_per_node = 1;
    options.check_collectives = false;
    options.timeout = std::chrono::milliseconds(2000);
    options.link.bandwidth_gbit_s = bandwidth;
    const auto start = std::chrono::steady_clock::now();
    const Error error = testing::capture_error([&] {
      World(options).run([&](RankContext& context) {
        std::vector<float> shard(1024, 1.0f), full(2 * 1024);
        context.communicator.all_gather(context.comm, shard.data(), full.data(), 1024,
                                        DType::kFloat32);
        context.comm.synchronize();
      });
    });
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500));
    EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
    EXPECT_THAT(error.what(), ::testing::HasSubstr("all_gather on rank "));
    EXPECT_THAT(error.what(), ::testing::HasSubstr("more than the timeout of 2 s"));
  }
}

}  // namespace
}  // namespace zest
