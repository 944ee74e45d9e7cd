// ctest-labels: mpi
// Checkpoints with ranks that are processes (the `mpi` backend, run by ctest under mpirun with
// 2 and 4 processes): each process writes its own rank file, rank 0 the manifest from the
// gathered checksums; a new process world resumes bit-identically. (A failing save cannot be
// tested here: a failure inside World::run ends a multi-process job, by design.)
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "checkpoint/manifest.h"
#include "runtime/mpi_process.h"
#include "tests/checkpoint/checkpoint_test_support.h"

namespace zest {
namespace {

using testing::TrainResult;
using testing::TrainSpec;
using testing::train_mlp;

int world_rank() { return MpiProcess::get().rank(); }
int world_size() { return MpiProcess::get().size(); }

// A directory every process of the job sees: rank 0 makes it and broadcasts its name.
class SharedDirectory {
 public:
  SharedDirectory() {
    char name[256] = {};
    if (world_rank() == 0) {
      std::string pattern =
          (std::filesystem::temp_directory_path() / "zest_ckpt_mpi_XXXXXX").string();
      if (::mkdtemp(pattern.data()) == nullptr) std::abort();
      std::strncpy(name, pattern.c_str(), sizeof name - 1);
    }
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = name;
  }
  ~SharedDirectory() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::filesystem::remove_all(path_);
  }
  std::string path(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

class CheckpointMpi : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }

  TrainSpec spec() const {
    TrainSpec s;
    s.backend = "mpi";
    s.world = world_size();
    s.stage = 2;
    return s;
  }
};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST_F(CheckpointMpi, ProcessesResumeBitIdentically) {
  SharedDirectory shared;
  TrainSpec uninterrupted = spec();
  uninterrupted.save_dir = shared.path("ckpt");
  uninterrupted.save_at = 3;
  const TrainResult reference = train_mlp(uninterrupted);

  TrainSpec resumed_spec = spec();
  resumed_spec.stage = 3;  // another stage, same world: the same files
  resumed_spec.resume = shared.path("ckpt");
  const TrainResult resumed = train_mlp(resumed_spec);
  if (world_rank() != 0) return;  // results are collected on rank 0
  const CheckpointManifest manifest = read_manifest(shared.path("ckpt/step-3"));
  EXPECT_EQ(manifest.world_size, world_size());
  for (int r = 0; r < world_size(); ++r) {
    EXPECT_TRUE(std::filesystem::exists(shared.path("ckpt/step-3/" + rank_file_name(r))));
  }
  EXPECT_EQ(resumed.loaded.step, 3);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (const auto& [step, loss] : resumed.losses) {
    EXPECT_TRUE(same_bits(reference.losses.at(step), loss)) << "step " << step;
  }
  for (const auto& [name, values] : reference.params) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(same_bits(values[i], resumed.params.at(name)[i])) << name << "[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace zest
