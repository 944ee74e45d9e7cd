#include "runtime/world_detection.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <optional>

#include "base/error.h"

namespace zest {

namespace {

constexpr const char* kHowToLaunch = "mpirun -np N (or srun -n N)";

// One launcher's view of this process, read from its environment variables.
struct Launch {
  std::string launcher;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int ranks_per_node = 0;  // 0: not said
};

// Slurm's SLURM_TASKS_PER_NODE: "2(x3)", "4,4" or "4(x2),4" when every node runs the same number
// of tasks (that number); 0 for uneven nodes ("4,2") or text it does not recognize.
int even_slurm_tasks_per_node(const std::string& text) {
  int common = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    int tasks = 0;
    const auto [stop, error] = std::from_chars(item.data(), item.data() + item.size(), tasks);
    const std::string rest(stop, item.data() + item.size());
    const bool repeat = rest.size() > 3 && rest.rfind("(x", 0) == 0 && rest.back() == ')';
    if (error != std::errc() || tasks < 1 || (!rest.empty() && !repeat)) return 0;
    if (common != 0 && tasks != common) return 0;
    common = tasks;
    at = end + 1;
  }
  return common;
}

class Environment {
 public:
  explicit Environment(const EnvReader& reader) : reader_(reader) {}

  const char* raw(const char* name) const {
    return reader_ ? reader_(name) : std::getenv(name);
  }

  std::optional<int> integer(const char* name) const {
    const char* text = raw(name);
    if (text == nullptr) return std::nullopt;
    const std::string value(text);
    int parsed = 0;
    const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
    if (value.empty() || error != std::errc() || end != value.data() + value.size() || parsed < 0) {
      throw Error(ErrorKind::kConfig, std::string("environment variable ") + name + " is \"" +
                                          value + "\", not a non-negative integer");
    }
    return parsed;
  }

  // A launcher's variables: nothing where rank or size is unset.
  std::optional<Launch> launch(const char* launcher, const char* rank_name, const char* size_name,
                               const char* local_name, const char* local_size_name) const {
    const std::optional<int> rank = integer(rank_name);
    const std::optional<int> size = integer(size_name);
    if (!rank || !size) return std::nullopt;
    if (*size < 1 || *rank >= *size) {
      throw Error(ErrorKind::kConfig, std::string("the ") + launcher + " environment is "
                                          "inconsistent: " + rank_name + "=" +
                                          std::to_string(*rank) + ", " + size_name + "=" +
                                          std::to_string(*size));
    }
    return Launch{launcher, *rank, *size, integer(local_name).value_or(0),
                  local_size_name ? integer(local_size_name).value_or(0) : 0};
  }

  std::optional<Launch> open_mpi() const {
    return launch("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
  }
  std::optional<Launch> slurm() const {
    std::optional<Launch> found =
        launch("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
    if (found && found->ranks_per_node == 0) {
      if (const char* text = raw("SLURM_TASKS_PER_NODE")) {
        found->ranks_per_node = even_slurm_tasks_per_node(text);
      }
    }
    return found;
  }
  std::optional<Launch> torchrun() const {
    return launch("torchrun-style", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  }

 private:
  const EnvReader& reader_;
};

DetectedWorld threads(int ranks) {
  return {false, ranks, 0, 0, 0, "local", "threads"};
}

// With processes, world.ranks is the launcher's to decide: 1 (the default) or the same count.
DetectedWorld processes(const Launch& launch, int ranks) {
  if (ranks != 1 && ranks != launch.size) {
    throw Error(ErrorKind::kConfig,
                "world.ranks: is " + std::to_string(ranks) + ", but " + launch.launcher +
                    " started " + std::to_string(launch.size) +
                    " processes (one rank each); leave world.ranks out or set it to " +
                    std::to_string(launch.size));
  }
  return {true,          launch.size, launch.rank, launch.local_rank, launch.ranks_per_node,
          "mpi",         launch.launcher};
}

[[noreturn]] void torchrun_without_mpi(const Launch& launch) {
  throw Error(ErrorKind::kConfig,
              "the environment sets RANK=" + std::to_string(launch.rank) +
                  " and WORLD_SIZE=" + std::to_string(launch.size) +
                  " (a torchrun-style launch), but zest connects processes only through MPI and "
                  "no MPI launcher started this process; launch with mpirun -np " +
                  std::to_string(launch.size) + " (or srun -n " + std::to_string(launch.size) +
                  ") instead");
}

}  // namespace

std::string DetectedWorld::describe() const {
  if (!processes) {
    return std::to_string(size) + (size == 1 ? " thread" : " threads") + " of one process";
  }
  return std::to_string(size) + (size == 1 ? " process" : " processes") + " (" + launcher +
         "), rank " + std::to_string(rank) + " local " + std::to_string(local_rank);
}

DetectedWorld detect_world(const std::string& backend, int ranks, const EnvReader& env) {
  if (ranks < 1) {
    throw Error(ErrorKind::kConfig, "world.ranks: must be >= 1, got " + std::to_string(ranks));
  }
  const Environment environment(env);
  if (backend == "local") {
    // Note: an explicit "local" wins over the environment, except under mpirun with several
    // processes: N copies of a threads job, each training the whole model and writing the same
    // files, is never what was meant.
    if (auto launch = environment.open_mpi(); launch && launch->size > 1) {
      throw Error(ErrorKind::kConfig,
                  "world.backend: is \"local\" (ranks are threads of one process), but Open MPI "
                  "started this process as rank " + std::to_string(launch->rank) + " of " +
                      std::to_string(launch->size) +
                      "; set world.backend to \"mpi\" (or \"auto\") for one rank per process, or "
                      "run without mpirun");
    }
    return threads(ranks);
  }
  if (backend == "mpi") {
    if (auto launch = environment.open_mpi()) return processes(*launch, ranks);
    if (auto launch = environment.slurm()) return processes(*launch, ranks);
    if (auto launch = environment.torchrun(); launch && launch->size > 1) {
      torchrun_without_mpi(*launch);
    }
    if (ranks > 1) {
      throw Error(ErrorKind::kConfig,
                  "world.backend: \"mpi\" runs one rank per process, but no launcher started "
                  "this one and world.ranks is " + std::to_string(ranks) + "; launch " +
                      std::to_string(ranks) + " processes with " + kHowToLaunch +
                      ", or use world.backend \"local\" for " + std::to_string(ranks) +
                      " threads");
    }
    return {true, 1, 0, 0, 1, "mpi", "MPI singleton"};
  }
  if (backend == "auto") {
    if (auto launch = environment.open_mpi()) return processes(*launch, ranks);
    if (auto launch = environment.slurm(); launch && launch->size > 1) {
      return processes(*launch, ranks);
    }
    if (auto launch = environment.torchrun(); launch && launch->size > 1) {
      torchrun_without_mpi(*launch);
    }
    return threads(ranks);
  }
  throw Error(ErrorKind::kConfig,
              "world.backend: must be \"local\", \"mpi\" or \"auto\", got \"" + backend + "\"");
}

}  // namespace zest
