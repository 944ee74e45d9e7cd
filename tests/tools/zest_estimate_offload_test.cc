// Runs the built zest-estimate binary on the offload tiers: the host tier by category with the
// parameters offloaded, and --fit's offload proposal, the first rung of none → optimizer cpu →
// parameters cpu → optimizer nvme → parameters nvme that fits --device-memory, --host-memory and
// --nvme, in one line with its keys, or which tier is short by how much.
// Model state only (--params), 1M parameters in fp32 on one rank: 16 MB of training state, of
// which the parameters and the gradients are 4 MB each (plus their padding).
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using zest::testing::lines_of;
using zest::testing::ProcessResult;

const std::string kEstimate = ZEST_BINARY_DIR "/bin/zest-estimate";

class ZestEstimateOffload : public zest::testing::ScratchDirectoryTest {
 protected:
  ProcessResult run(std::vector<std::string> args) const {
    return zest::testing::run_program(kEstimate, args, {path("stdout.txt"), path("stderr.txt")});
  }
  // The line --fit proposes, for 1M parameters at stage 3 on one rank; `nvme` is --nvme's value.
  std::string proposal(const std::string& device, const std::string& host,
                       const std::string& nvme = "") const {
    std::vector<std::string> args = {"--params", "1000000", "--world", "1", "--stage", "3",
                                     "--device-memory", device, "--host-memory", host, "--fit"};
    if (!nvme.empty()) args.insert(args.end(), {"--nvme", nvme});
    const ProcessResult result = run(args);
    EXPECT_EQ(result.status, 0) << result.err;
    for (const std::string& line : lines_of(result.out)) {
      if (line.rfind("offload: ", 0) == 0) return line;
    }
    ADD_FAILURE() << "no offload line in\n" << result.out;
    return "";
  }
};

TEST_F(ZestEstimateOffload, FitProposesTheFirstRungThatFits) {
  EXPECT_THAT(proposal("20MB", "1GB"), HasSubstr("offload: fits with none ("));
  // 16 MB does not fit 10 MB; the optimizer's 8 MB (and the host's master and transfer) move.
  const std::string optimizer = proposal("10MB", "1GB");
  EXPECT_THAT(optimizer, HasSubstr("fits with optimizer cpu ("));
  EXPECT_THAT(optimizer, HasSubstr("zero_optimization.offload_optimizer.device \"cpu\""));
  EXPECT_THAT(optimizer, HasSubstr("zero_optimization.offload_param.device \"none\""));
  // The gradients alone (4 MB) fit 6 MB once the parameters move too.
  const std::string parameters = proposal("6MB", "1GB");
  EXPECT_THAT(parameters, HasSubstr("fits with optimizer cpu, parameters cpu ("));
  EXPECT_THAT(parameters, HasSubstr("zero_optimization.offload_param.device \"cpu\""));
  // A host too small for what moves, and no --nvme: nothing fits; the closest rung says which
  // tier is short, and the most offloaded one that the NVMe tier is missing.
  const std::string none = proposal("6MB", "8MB");
  // The closest is short by the fewest bytes: the optimizer on the host leaves 8 MB on the
  // 6 MB device and puts 16 MB on the 8 MB host (9.54 MiB short), where moving the parameters
  // too would put 20 MB there (11.44 MiB short).
  EXPECT_THAT(none, HasSubstr("offload: nothing fits; the closest, optimizer cpu, needs"));
  EXPECT_THAT(none, HasSubstr("device short by 1.91 MiB, host short by 7.63 MiB"));
  EXPECT_THAT(none, HasSubstr("with optimizer nvme, parameters nvme: "));
  EXPECT_THAT(none, HasSubstr("(no --nvme given: name a directory on the NVMe file system)"));
}

// 12 MB of host holds neither the optimizer's 16 MB nor the parameters' 4 MB beside it; with
// the optimizer on NVMe it holds the parameters, the transfer shard and buffer_count (4)
// sub-groups of 1/16 of the shard each (4 x 62,500 x 12 bytes), so only the NVMe rung fits, with
// the sub_group_size it needs and the swap files under --nvme's directory.
TEST_F(ZestEstimateOffload, FitProposesTheOptimizerOnNvmeWhereOnlyThatFits) {
  const std::string nvme = proposal("6MB", "12MB", path("."));
  EXPECT_THAT(nvme, HasSubstr("offload: fits with optimizer nvme, parameters cpu ("));
  EXPECT_THAT(nvme, HasSubstr("zero_optimization.offload_optimizer.device \"nvme\""));
  EXPECT_THAT(nvme, HasSubstr("zero_optimization.offload_optimizer.nvme_path \"" + path(".")));
  EXPECT_THAT(nvme, HasSubstr("zero_optimization.sub_group_size 62500"));
  // The master and the two moments: 12 MB, each sub-group's tensors padded to 4096 bytes.
  EXPECT_THAT(nvme, HasSubstr("nvme 11.62 MiB of "));
  // A byte count is the tier's size as well.
  EXPECT_THAT(proposal("6MB", "12MB", "1GB"), HasSubstr("fits with optimizer nvme, parameters cpu"));
  // The same without --nvme fits nowhere.
  EXPECT_THAT(proposal("6MB", "12MB"), HasSubstr("offload: nothing fits"));
}

TEST_F(ZestEstimateOffload, ANvmeTierTooSmallIsNamedWithItsShortfall) {
  const std::string small = proposal("6MB", "12MB", "1MB");
  EXPECT_THAT(small, HasSubstr("offload: nothing fits"));
  EXPECT_THAT(small, HasSubstr("nvme short by "));
  EXPECT_THAT(small, ::testing::Not(HasSubstr("no --nvme given")));
}

// The JSON carries every rung planned, the NVMe rungs' swap files among them.
TEST_F(ZestEstimateOffload, TheJsonListsTheNvmeRungsWithTheirTiers) {
  const ProcessResult result =
      run({"--params", "1000000", "--world", "1", "--stage", "3", "--device-memory", "6MB",
           "--host-memory", "8MB", "--fit", "--nvme", "1GB", "--json"});
  ASSERT_EQ(result.status, 0) << result.err;
  const json rungs = json::parse(result.out)["offload_fit"]["rungs"];
  ASSERT_EQ(rungs.size(), 5u);
  EXPECT_EQ(rungs[3]["rung"], "optimizer nvme, parameters cpu");
  EXPECT_GT(rungs[3]["nvme_total"].get<std::size_t>(), 12000000u);
  EXPECT_EQ(rungs[4]["rung"], "optimizer nvme, parameters nvme");
  // The parameters' 4 MB join the NVMe tier.
  EXPECT_GT(rungs[4]["nvme_total"].get<std::size_t>(),
            rungs[3]["nvme_total"].get<std::size_t>() + 4000000u);
  EXPECT_EQ(rungs[4]["fits"], false);
}

TEST_F(ZestEstimateOffload, ARaisedStageIsPartOfTheKeys) {
  const ProcessResult result =
      run({"--params", "1000000", "--world", "2", "--stage", "1", "--device-memory", "5MB",
           "--host-memory", "1GB", "--fit"});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("set zero_optimization.stage 3, "));
}

TEST_F(ZestEstimateOffload, TheHostTierHoldsTheOffloadedParametersByCategory) {
  const ProcessResult result = run({"--params", "1000000", "--world", "1", "--stage", "3",
                                    "--offload-param", "--offload", "--json"});
  ASSERT_EQ(result.status, 0) << result.err;
  const json out = json::parse(result.out);
  const json& bytes = out["per_rank_bytes"];
  EXPECT_EQ(bytes["params"], 0);
  EXPECT_GE(bytes["host"]["params"].get<std::size_t>(), 4000000u);
  EXPECT_GT(bytes["host"]["offload"].get<std::size_t>(), 0u);
  EXPECT_EQ(bytes["host"]["total"].get<std::size_t>(),
            bytes["host"]["params"].get<std::size_t>() +
                bytes["host"]["offload"].get<std::size_t>());
  EXPECT_EQ(bytes["nvme"]["total"], 0);
  const ProcessResult text = run({"--params", "1000000", "--world", "1", "--stage", "3",
                                  "--offload-param"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("host params"));
  EXPECT_THAT(text.out, HasSubstr("host total"));
  EXPECT_THAT(text.out, HasSubstr("parameters offloaded"));
}

TEST_F(ZestEstimateOffload, BadInputIsOneLineAndStatusTwo) {
  const ProcessResult below = run({"--params", "1000000", "--world", "1", "--stage", "2",
                                   "--offload-param"});
  EXPECT_EQ(below.status, 2);
  EXPECT_THAT(below.err, HasSubstr("offload_param"));
  const ProcessResult missing =
      run({"--params", "1000000", "--world", "1", "--stage", "3", "--device-memory", "1GB",
           "--fit", "--nvme", path("no/such/dir")});
  EXPECT_EQ(missing.status, 2);
  EXPECT_EQ(lines_of(missing.err).size(), 1u) << missing.err;
  EXPECT_THAT(missing.err, HasSubstr("--nvme: cannot read the free space of"));
  const ProcessResult host = run({"--params", "1000000", "--world", "1", "--stage", "3",
                                  "--host-memory", "lots"});
  EXPECT_EQ(host.status, 2);
  EXPECT_THAT(host.err, HasSubstr("--host-memory: must be"));
}

}  // namespace
