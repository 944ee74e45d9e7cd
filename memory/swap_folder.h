// A rank's folder of swap files, <nvme_path>/zest-swap/pid<pid>-rank<r>[-<k>]/, holding a lock
// file with the owning process's pid. Made when the NVMe tier opens, removed with everything in
// it when this object goes (at exit, on an error, after a signal's orderly stop). A folder left
// by a run that was killed is found at the next start by its lock: its pid is not alive (or is
// this process's, but no live SwapFolder holds it) and it is removed. A live run's folder is
// never touched: a second folder name is taken instead. Invariant: no two live SwapFolders, in
// this process or any other, share a path.
#pragma once

#include <string>

namespace zest {

class SwapFolder {
 public:
  // Throws a kIo Error naming `nvme_path` when the folder cannot be made there.
  SwapFolder(const std::string& nvme_path, int rank);
  ~SwapFolder();  // removes the folder and its files; never throws
  SwapFolder(const SwapFolder&) = delete;
  SwapFolder& operator=(const SwapFolder&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Removes the folders under <nvme_path>/zest-swap whose lock names a process that is not
// running; returns how many. SwapFolder's constructor calls it; exposed for tests and tools.
int remove_stale_swap_folders(const std::string& nvme_path);

}  // namespace zest
