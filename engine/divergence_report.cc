#include "engine/divergence_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "runtime/host_collectives.h"

namespace zest {

namespace {

// One rank's finding as the collectives carry it: fixed size, the unit's name cut to fit.
struct FindingRecord {
  std::int32_t world_rank = 0;
  std::int32_t where = 0;
  char unit[120] = {};
};

FindingRecord record_of(int world_rank, const NonFiniteFinding& finding) {
  FindingRecord record;
  record.world_rank = world_rank;
  record.where = static_cast<std::int32_t>(finding.where);
  const std::size_t length = std::min(finding.unit.size(), sizeof record.unit - 1);
  std::memcpy(record.unit, finding.unit.data(), length);
  return record;
}

// Every rank of every group's records: gathered over the first group, then each rank's
// collection over the next, and so on.
std::vector<FindingRecord> gather_records(const RankContext& context,
                                          const std::vector<Communicator*>& groups,
                                          FindingRecord mine) {
  std::vector<FindingRecord> records{mine};
  for (Communicator* group : groups) {
    if (group == nullptr) continue;
    std::vector<FindingRecord> all(records.size() * static_cast<std::size_t>(group->world_size()));
    group->label_next("divergence report");
    all_gather_host(context, *group, records.data(), all.data(),
                    records.size() * sizeof(FindingRecord), DType::kInt8);
    records = std::move(all);
  }
  std::sort(records.begin(), records.end(), [](const FindingRecord& a, const FindingRecord& b) {
    return a.world_rank < b.world_rank;
  });
  return records;
}

}  // namespace

void raise_divergence(const RankContext& context, const std::vector<Communicator*>& groups,
                      std::int64_t step, DType dtype, const NonFiniteFinding& mine) {
  Communicator& own = *groups.front();
  const FindingRecord record = record_of(own.world_rank_of(own.rank()), mine);
  std::vector<std::string> where;
  for (const FindingRecord& other : gather_records(context, groups, record)) {
    if (other.where != static_cast<std::int32_t>(NonFiniteFinding::Where::kUnit)) continue;
    where.push_back(fmt::format("rank {}, unit {}", other.world_rank, other.unit));
  }
  // Note: no rank's own gradient may be non-finite while the reduced ones are (an overflow in
  // the reduction itself, or in the norm's sum); then the message says so instead of naming a
  // rank.
  const std::string origin = where.empty() ? "in the reduced gradients"
                                           : "on " + fmt::format("{}", fmt::join(where, "; "));
  throw Error(ErrorKind::kDivergence,
              fmt::format("non-finite gradient at step {} {} ({} training has no loss scale to "
                          "lower and skip the step; lower the learning rate, clip gradients, or "
                          "check the data of that step)",
                          step, origin, dtype_name(dtype)));
}

}  // namespace zest
