#include "checkpoint/agreement.h"

#include <algorithm>
#include <cstring>

#include "runtime/host_collectives.h"

namespace zest {
namespace {

// Records travel as int32 words: the collectives only move them, never reduce them.
constexpr std::size_t kWords = sizeof(PhaseRecord) / sizeof(std::int32_t);
static_assert(sizeof(PhaseRecord) % sizeof(std::int32_t) == 0);

}  // namespace

void PhaseRecord::set_text(const std::string& value) {
  std::memset(text, 0, sizeof text);
  std::memcpy(text, value.data(), std::min(value.size(), sizeof text - 1));
}

std::string PhaseRecord::get_text() const { return std::string(text, strnlen(text, sizeof text)); }

void PhaseRecord::set_failure(const Error& error) {
  failed = 1;
  kind = static_cast<std::int32_t>(error.kind());
  set_text(error.what());
}

std::vector<PhaseRecord> exchange_records(RankContext& context, const PhaseRecord& mine,
                                          const std::optional<Error>& own) {
  std::vector<PhaseRecord> all(static_cast<std::size_t>(context.world_size));
  try {
    all_gather_host(context, &mine, all.data(), kWords, DType::kInt32);
  } catch (...) {
    if (own) raise(*own);
    throw;
  }
  return all;
}

PhaseRecord share_record(RankContext& context, const PhaseRecord& mine, int root,
                         const std::optional<Error>& own) {
  PhaseRecord shared = mine;
  try {
    broadcast_host(context, &shared, kWords, DType::kInt32, root);
  } catch (...) {
    if (own) raise(*own);
    throw;
  }
  return shared;
}

void raise_if_failed(const std::vector<PhaseRecord>& records, const std::optional<Error>& own,
                     const std::string& what) {
  if (own) raise(*own);
  for (std::size_t r = 0; r < records.size(); ++r) {
    if (!records[r].failed) continue;
    throw Error(ErrorKind::kPeerFailure,
                what + ": rank " + std::to_string(r) + " failed: " + records[r].get_text());
  }
}

}  // namespace zest
