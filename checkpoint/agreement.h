// How the ranks of a checkpoint save or load agree on the outcome of each phase before the next
// one: every rank contributes a fixed-size record (failed or not, a file's size and checksum,
// an error message) and every rank sees all of them, through the communicator, so the ranks can
// be threads or processes alike. Invariant: after an exchange either every rank goes on or
// every rank throws — the failing rank its own error, the others an echo (kPeerFailure) that
// names the failing rank and carries its message.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/world.h"

namespace zest {

struct PhaseRecord {
  std::int32_t failed = 0;
  std::int32_t kind = 0;  // ErrorKind of the failure
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0;
  char text[1008] = {};  // the failure's message (cut), or a name the root shares

  void set_text(const std::string& value);
  std::string get_text() const;
  void set_failure(const Error& error);
};
static_assert(sizeof(PhaseRecord) == 1032);

// Every rank's record, in rank order (an all-gather). `own` is this rank's failure, if any: it
// is what this rank throws should the collective itself fail (a peer that failed and left
// early can make it fail), so that a rank's own error is never masked by an echo.
std::vector<PhaseRecord> exchange_records(RankContext& context, const PhaseRecord& mine,
                                          const std::optional<Error>& own);
// Rank `root`'s record on every rank (a broadcast); `own` as above.
PhaseRecord share_record(RankContext& context, const PhaseRecord& mine, int root,
                         const std::optional<Error>& own);

// Runs `work`, turning a failure into the record's failure (non-zest exceptions as kInternal).
// Returns the error for raise_if_failed.
template <typename Work>
std::optional<Error> capture(PhaseRecord& record, Work&& work) {
  try {
    work();
    return std::nullopt;
  } catch (const Error& error) {
    record.set_failure(error);
    return error;
  } catch (const std::exception& error) {
    Error wrapped(ErrorKind::kInternal, error.what());
    record.set_failure(wrapped);
    return wrapped;
  }
}

// Throws if any record failed: `own` when this rank failed, else an echo naming the first
// failed rank, `what` it was doing, and its message.
void raise_if_failed(const std::vector<PhaseRecord>& records, const std::optional<Error>& own,
                     const std::string& what);

}  // namespace zest
