#include "runtime/checked_communicator.h"

#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/release_after.h"

namespace zest {

namespace {

// What one rank says about one collective: fixed size, so that it all-gathers as int32 words.
struct Record {
  std::uint64_t sequence = 0;
  std::uint64_t running_hash = 0;  // over every record up to and including this one
  std::uint64_t count = 0;
  std::int32_t op = 0;
  std::int32_t dtype = 0;
  std::int32_t detail = 0;
  std::int32_t reserved = 0;
  char label[56] = {};
};
static_assert(sizeof(Record) == 96 && sizeof(Record) % sizeof(std::int32_t) == 0);
constexpr std::size_t kRecordWords = sizeof(Record) / sizeof(std::int32_t);

const char* op_name(std::int32_t op) {
  static const char* const kNames[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                       "barrier"};
  return op >= 0 && op < 5 ? kNames[op] : "unknown collective";
}

std::string describe(const Record& record) {
  std::string text = op_name(record.op);
  if (record.op != 4) {
    text += fmt::format(" of {} {} elements", record.count,
                        dtype_name(static_cast<DType>(record.dtype)));
  }
  if (record.op == 1 || record.op == 2) {
    static const char* const kReductions[] = {"sum", "mean", "pre-divided mean"};
    text += std::string(", ") + (record.detail >= 0 && record.detail < 3 ? kReductions[record.detail] : "?");
  }
  if (record.op == 3) text += fmt::format(" from rank {}", record.detail);
  if (record.label[0] != '\0') text += fmt::format(" ({})", std::string(record.label));
  return text;
}

bool same(const Record& a, const Record& b) {
  return a.running_hash == b.running_hash && a.op == b.op && a.count == b.count &&
         a.dtype == b.dtype && a.detail == b.detail;
}

// Throws when the ranks' records differ, naming what each group of ranks issued; `world_ranks`
// maps the group's ranks to the world's, and `group` names it (empty: the world).
void compare(const std::vector<Record>& records, const std::vector<int>& world_ranks,
             const std::string& group) {
  const Record& first = records.front();
  bool agree = true;
  for (const Record& record : records) agree = agree && same(record, first);
  if (agree) return;
  // Group ranks by what they issued, so four ranks in two camps read as two parts, not four;
  // camps in the order of their lowest rank.
  std::vector<std::pair<std::string, std::vector<int>>> camps;
  for (std::size_t rank = 0; rank < records.size(); ++rank) {
    const Record& record = records[rank];
    std::string what = describe(record);
    if (record.op == first.op && record.count == first.count && record.dtype == first.dtype &&
        record.detail == first.detail && record.running_hash != first.running_hash) {
      what += " after a different sequence of earlier collectives";
    }
    auto camp = std::find_if(camps.begin(), camps.end(),
                             [&](const auto& entry) { return entry.first == what; });
    if (camp == camps.end()) camp = camps.insert(camps.end(), {what, {}});
    camp->second.push_back(world_ranks[rank]);
  }
  std::string sides;
  for (const auto& [what, ranks] : camps) {
    sides += fmt::format("{}rank{} {}: {}", sides.empty() ? "" : "; ", ranks.size() == 1 ? "" : "s",
                         fmt::join(ranks, ","), what);
  }
  throw Error(ErrorKind::kCommMismatch,
              fmt::format("collective order differs between ranks at collective #{}{}: {}; every "
                          "rank must issue the same collectives in the same order (a unit skipped "
                          "on one rank, or control flow that depends on rank-local data)",
                          first.sequence, group.empty() ? "" : " in the " + group, sides));
}

}  // namespace

bool collective_check_from_environment() {
  const char* text = std::getenv("ZEST_CHECK_COLLECTIVES");
  return text != nullptr && *text != '\0' && std::strcmp(text, "0") != 0;
}

Communicator& maybe_checked(Communicator& inner, std::optional<bool> enabled, Device* device,
                            std::optional<CheckedCommunicator>& checked) {
  if (!enabled.value_or(collective_check_from_environment())) return inner;
  return checked.emplace(inner, device);
}

CheckedCommunicator::CheckedCommunicator(Communicator& inner, Device* device)
    : inner_(inner), device_(device && device->kind() != DeviceKind::kCpu ? device : nullptr) {}

CheckedCommunicator::CheckedCommunicator(std::unique_ptr<Communicator> inner, Device* device)
    : owned_(std::move(inner)),
      inner_(*owned_),
      device_(device && device->kind() != DeviceKind::kCpu ? device : nullptr) {}

void CheckedCommunicator::send(Stream& stream, const void* data, std::size_t count, DType dtype,
                               int peer) {
  if (!label_.empty()) inner_.label_next(std::exchange(label_, std::string()).c_str());
  inner_.send(stream, data, count, dtype, peer);
}

void CheckedCommunicator::receive(Stream& stream, void* data, std::size_t count, DType dtype,
                                  int peer) {
  if (!label_.empty()) inner_.label_next(std::exchange(label_, std::string()).c_str());
  inner_.receive(stream, data, count, dtype, peer);
}

std::unique_ptr<Communicator> CheckedCommunicator::split(int color, int key,
                                                         const std::string& name,
                                                         std::chrono::milliseconds timeout) {
  std::unique_ptr<Communicator> group = inner_.split(color, key, name, timeout);
  if (!group) return nullptr;
  return std::make_unique<CheckedCommunicator>(std::move(group), device_);
}

void CheckedCommunicator::label_next(const char* label) {
  // Passed on in check(), after the record's own all-gather, which would otherwise consume it.
  label_ = label == nullptr ? "" : label;
}

void CheckedCommunicator::check(Stream& stream, Op op, std::size_t count, DType dtype,
                                std::int32_t detail) {
  Record mine;
  mine.sequence = ++sequence_;
  mine.count = count;
  mine.op = static_cast<std::int32_t>(op);
  mine.dtype = static_cast<std::int32_t>(dtype);
  mine.detail = detail;
  std::strncpy(mine.label, label_.c_str(), sizeof(mine.label) - 1);
  const std::string label = std::exchange(label_, std::string());
  // The label is for people; the hash covers what must agree.
  const std::uint64_t fields[5] = {mine.sequence, mine.count, static_cast<std::uint64_t>(mine.op),
                                   static_cast<std::uint64_t>(mine.dtype),
                                   static_cast<std::uint64_t>(mine.detail)};
  running_hash_ = XXH3_64bits_withSeed(fields, sizeof(fields), running_hash_);
  mine.running_hash = running_hash_;
  // Both buffers live until the stream has run the comparison that reads them.
  auto send = std::make_shared<Record>(mine);
  auto all = std::make_shared<std::vector<Record>>(static_cast<std::size_t>(inner_.world_size()));
  // Note: a peer that never arrives is first missed at this gather, not at the collective it
  // checks: the gather's errors name the caller's collective (numbered as the caller counts),
  // so that a timeout says what the caller was waiting in.
  const Reduction reduction =
      op == Op::kReduceScatter || op == Op::kAllReduce ? static_cast<Reduction>(detail)
                                                       : Reduction::kSum;
  inner_.name_next(describe_collective(op_name(mine.op), mine.sequence - 1, count, dtype,
                                       reduction, op == Op::kBroadcast ? detail : 0, label));
  if (device_ == nullptr) {
    inner_.all_gather(stream, send.get(), all->data(), kRecordWords, DType::kInt32);
  } else {
    const std::size_t total = all->size() * sizeof(Record);
    Buffer staged = device_->allocator().allocate(total, Category::kWorkspace);
    char* mine_staged = staged.as<char>() + static_cast<std::size_t>(inner_.rank()) * sizeof(Record);
    device_->copy(stream, mine_staged, send.get(), sizeof(Record));
    inner_.all_gather(stream, mine_staged, staged.data(), kRecordWords, DType::kInt32);
    device_->copy(stream, all->data(), staged.data(), total);
    release_after(*device_, stream, std::move(staged));
  }
  std::vector<int> world_ranks;
  for (int r = 0; r < inner_.world_size(); ++r) world_ranks.push_back(inner_.world_rank_of(r));
  stream.enqueue([send, all, world_ranks = std::move(world_ranks), group = inner_.group_name()] {
    compare(*all, world_ranks, group);
  });
  inner_.label_next(label.c_str());  // for the collective checked
}

void CheckedCommunicator::all_gather(Stream& stream, const void* send, void* recv,
                                     std::size_t count, DType dtype) {
  check(stream, Op::kAllGather, count, dtype, 0);
  inner_.all_gather(stream, send, recv, count, dtype);
}

void CheckedCommunicator::reduce_scatter(Stream& stream, const void* send, void* recv,
                                         std::size_t count, DType dtype, Reduction reduction) {
  check(stream, Op::kReduceScatter, count, dtype, static_cast<std::int32_t>(reduction));
  inner_.reduce_scatter(stream, send, recv, count, dtype, reduction);
}

void CheckedCommunicator::all_reduce(Stream& stream, const void* send, void* recv,
                                     std::size_t count, DType dtype, Reduction reduction) {
  check(stream, Op::kAllReduce, count, dtype, static_cast<std::int32_t>(reduction));
  inner_.all_reduce(stream, send, recv, count, dtype, reduction);
}

void CheckedCommunicator::broadcast(Stream& stream, void* buffer, std::size_t count, DType dtype,
                                    int root) {
  check(stream, Op::kBroadcast, count, dtype, root);
  inner_.broadcast(stream, buffer, count, dtype, root);
}

void CheckedCommunicator::barrier(Stream& stream) {
  check(stream, Op::kBarrier, 0, DType::kInt32, 0);
  inner_.barrier(stream);
}

}  // namespace zest
