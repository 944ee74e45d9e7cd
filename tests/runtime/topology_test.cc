// Nodes: world.ranks_per_node from the config or the launcher's environment, which node each rank
// is on, and the one-line errors when the nodes would be uneven.
#include "runtime/topology.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/world.h"
#include "runtime/world_detection.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::capture_error;

EnvReader environment(const std::map<std::string, std::string>& variables) {
  return [variables](const char* name) -> const char* {
    const auto found = variables.find(name);
    return found == variables.end() ? nullptr : found->second.c_str();
  };
}

TEST(Topology, ConsecutiveRanksShareANode) {
  const Topology topology(6, 2);
  EXPECT_EQ(topology.nodes(), 3);
  EXPECT_EQ(topology.node_of(0), 0);
  EXPECT_EQ(topology.node_of(1), 0);
  EXPECT_EQ(topology.node_of(2), 1);
  EXPECT_EQ(topology.node_of(5), 2);
  EXPECT_EQ(topology.nodes_spanned({0, 1}), 1);
  EXPECT_EQ(topology.nodes_spanned({1, 2}), 2);
  EXPECT_EQ(topology.nodes_spanned({0, 2, 4}), 3);
  EXPECT_EQ(topology.describe(), "3 nodes x 2 ranks");
  EXPECT_EQ(Topology(4, 4).describe(), "1 node x 4 ranks");
}

TEST(Topology, RanksPerNodeThatDoNotDivideTheWorldAreOneLine) {
  const Error error = capture_error([] { Topology(4, 3); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_EQ(std::string(error.what()),
            "world.ranks_per_node: 3 does not divide world.ranks 4; every node runs the same "
            "number of ranks (one of: 1, 2, 4)");
  EXPECT_THAT(capture_error([] { Topology(4, 0); }).what(),
              HasSubstr("world.ranks_per_node: must be >= 1, got 0"));
}

TEST(Topology, LaunchersSayHowManyRanksEachNodeRuns) {
  EXPECT_EQ(detect_world("auto", 1,
                         environment({{"OMPI_COMM_WORLD_RANK", "1"},
                                      {"OMPI_COMM_WORLD_SIZE", "4"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}))
                .ranks_per_node,
            2);
  const std::map<std::string, std::string> slurm = {
      {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "0"}};
  auto with = [&](const std::string& name, const std::string& value) {
    std::map<std::string, std::string> variables = slurm;
    variables[name] = value;
    return detect_world("mpi", 1, environment(variables)).ranks_per_node;
  };
  EXPECT_EQ(with("SLURM_NTASKS_PER_NODE", "3"), 3);
  EXPECT_EQ(with("SLURM_TASKS_PER_NODE", "2(x3)"), 2);
  EXPECT_EQ(with("SLURM_TASKS_PER_NODE", "3,3"), 3);
  EXPECT_EQ(with("SLURM_TASKS_PER_NODE", "2(x2),2"), 2);
  // Uneven nodes are not a topology zest models: not detected (world.ranks_per_node says it).
  EXPECT_EQ(with("SLURM_TASKS_PER_NODE", "4,2"), 0);
  EXPECT_EQ(with("SLURM_TASKS_PER_NODE", "2(x"), 0);
  EXPECT_EQ(detect_world("auto", 4, environment({})).ranks_per_node, 0);
}

TEST(Topology, ThreadsRunOnOneNodeUnlessTheConfigSaysOtherwise) {
  WorldOptions options;
  options.ranks = 4;
  options.check_collectives = false;
  {
    const World world(options);
    EXPECT_EQ(world.options().ranks_per_node, 4);
    std::mutex mutex;
    std::vector<int> nodes(4, -1);
    world.run([&](RankContext& context) {
      std::lock_guard lock(mutex);
      nodes[context.rank] = context.node();
      EXPECT_EQ(context.topology.nodes(), 1);
    });
    EXPECT_EQ(nodes, (std::vector<int>{0, 0, 0, 0}));
  }
  options.ranks_per_node = 2;
  const World world(options);
  std::mutex mutex;
  std::vector<int> nodes(4, -1);
  world.run([&](RankContext& context) {
    std::lock_guard lock(mutex);
    nodes[context.rank] = context.node();
  });
  EXPECT_EQ(nodes, (std::vector<int>{0, 0, 1, 1}));
  options.ranks_per_node = 3;
  EXPECT_THAT(capture_error([&] { World{options}; }).what(),
              HasSubstr("world.ranks_per_node: 3 does not divide world.ranks 4"));
}

}  // namespace
}  // namespace zest
