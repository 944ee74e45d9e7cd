// A checkpoint opened for reading by flat coordinates, whatever world size wrote it: flat element
// e of a unit lived on old rank e / shard_length at e % shard_length, and elements at or past the
// unit's numel are padding, read as zeros. This is all resharding needs — online at load (each
// new rank reads the ranges of its new shard) and offline (zest-ckpt reshard, export).
// Invariant: read() returns bytes from files whose size and checksum verify() has checked, when
// the caller verified them first; read() itself checks only that the bytes exist.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"

namespace zest {

class CheckpointSource {
 public:
  // `dir` is a checkpoint directory (it holds manifest.json); reads and checks the manifest.
  explicit CheckpointSource(std::string dir);
  ~CheckpointSource();

  const std::string& dir() const { return dir_; }
  const CheckpointManifest& manifest() const { return manifest_; }

  // Checks that file `rank` (the manifest's files[rank]) exists, has the manifest's size and its
  // checksum; a kCheckpoint Error names the file otherwise. verify_all() checks every file.
  void verify(int rank) const;
  void verify_all() const;

  // The files (their index in the manifest: the old ranks) that hold flat elements [begin, end)
  // of tensor rank `tensor_rank`'s part of `unit` (padding excluded).
  std::vector<int> ranks_holding(std::size_t unit, std::size_t begin, std::size_t end,
                                 int tensor_rank = 0) const;

  // Reads flat elements [begin, end) of checkpoint tensor `tensor` (an index into the
  // manifest's tensors) of tensor rank `tensor_rank`'s part of `unit` into `destination`,
  // converted to `type`.
  void read(std::size_t unit, std::size_t tensor, std::size_t begin, std::size_t end,
            void* destination, DType type, int tensor_rank = 0) const;

  // The checkpoint tensor that state tensor `name` of dtype `type` is filled from, or -1:
  //   "params": the saved params when their dtype is `type`, else "master" when saved (fp32, so
  //             converting loses nothing it need not), else the saved params converted;
  //   "master": the saved "master", else the saved params (fp32 training has no master);
  //   others:   the tensor of that name.
  int source_for(const std::string& name, DType type) const;

 private:
  const ReadOnlyFile& file(int rank) const;

  std::string dir_;
  CheckpointManifest manifest_;
  mutable std::vector<std::unique_ptr<ReadOnlyFile>> files_;  // opened on first use
};

}  // namespace zest
