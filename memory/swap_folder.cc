#include "memory/swap_folder.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>

#include "base/error.h"

namespace zest {

namespace {

namespace fs = std::filesystem;

constexpr const char* kLockName = "lock";

// The folders this process holds now: a lock with this process's own pid is stale unless it is
// one of them (a pid reused after a killed run, in a container whose pids restart at 1).
std::mutex& held_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<std::string>& held() {
  static std::set<std::string> folders;
  return folders;
}

bool process_alive(long pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

// The pid in `folder`'s lock, or -1 without a readable lock.
long lock_pid(const fs::path& folder) {
  std::ifstream lock(folder / kLockName);
  long pid = -1;
  if (!(lock >> pid)) return -1;
  return pid;
}

// Called with held_mutex() taken.
bool stale(const fs::path& folder) {
  const long pid = lock_pid(folder);
  if (pid < 0) return false;  // being made right now, or not ours: left alone
  if (pid == static_cast<long>(::getpid())) return held().count(folder.string()) == 0;
  return !process_alive(pid);
}

int remove_stale_locked(const std::string& nvme_path) {
  const fs::path root = fs::path(nvme_path) / "zest-swap";
  std::error_code error;
  if (!fs::is_directory(root, error)) return 0;
  int removed = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    if (!entry.is_directory(error) || !stale(entry.path())) continue;
    fs::remove_all(entry.path(), error);
    if (!error) ++removed;
  }
  return removed;
}

}  // namespace

int remove_stale_swap_folders(const std::string& nvme_path) {
  const std::lock_guard<std::mutex> lock(held_mutex());
  return remove_stale_locked(nvme_path);
}

SwapFolder::SwapFolder(const std::string& nvme_path, int rank) {
  const std::lock_guard<std::mutex> lock(held_mutex());
  remove_stale_locked(nvme_path);
  const fs::path root = fs::path(nvme_path) / "zest-swap";
  std::error_code error;
  fs::create_directories(root, error);
  if (error) {
    throw Error(ErrorKind::kIo, "nvme_path '" + nvme_path + "': cannot make the swap folder '" +
                                    root.string() + "': " + error.message() +
                                    "; point nvme_path at a writable folder");
  }
  const std::string base = "pid" + std::to_string(::getpid()) + "-rank" + std::to_string(rank);
  for (int k = 0;; ++k) {
    const fs::path folder = root / (k == 0 ? base : base + "-" + std::to_string(k));
    // create_directory is the claim: false when the name exists (a live run's, ours or not).
    if (!fs::create_directory(folder, error)) {
      if (error) {
        throw Error(ErrorKind::kIo, "cannot make swap folder '" + folder.string() +
                                        "': " + error.message());
      }
      continue;
    }
    std::ofstream(folder / kLockName) << ::getpid() << '\n';
    path_ = folder.string();
    held().insert(path_);
    return;
  }
}

SwapFolder::~SwapFolder() {
  const std::lock_guard<std::mutex> lock(held_mutex());
  std::error_code error;
  fs::remove_all(path_, error);
  held().erase(path_);
  // The shared parent goes too when this was its last folder; another run's keeps it.
  fs::remove(fs::path(path_).parent_path(), error);
}

}  // namespace zest
