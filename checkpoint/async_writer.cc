#include "checkpoint/async_writer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <xxhash.h>

#include "base/error.h"
#include "checkpoint/agreement.h"
#include "checkpoint/files.h"
#include "checkpoint/save_phases.h"
#include "checkpoint/state_shard_copies.h"
#include "runtime/host_collectives.h"
#include "runtime/trace.h"

namespace zest {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// A save begun and not yet published: what its manifest says, its temporary directory, and
// what the writer thread reports (read by the main thread only after joining it).
struct AsyncCheckpointWriter::Pending {
  SaveDescription save;
  std::string temporary;
  TemporaryDirectory guard;
  std::optional<std::uint64_t> budget;
  std::size_t buffer = 0;
  std::uint64_t bytes = 0;  // of the buffer, which holds exactly the rank file's bytes
  PhaseRecord record;
  std::optional<Error> failure;
  // Marks the end of the snapshot's copies on the snapshot stream; the writer waits for it.
  std::shared_ptr<Event> copied;
  std::chrono::steady_clock::time_point copy_start;
  std::atomic<bool> done{false};
  double copy_s = 0.0;  // from the save's start until its copies had run
  double write_s = 0.0;
};

int snapshot_buffers(std::int64_t saves) {
  return static_cast<int>(std::clamp<std::int64_t>(saves, 0, 2));
}

AsyncCheckpointWriter::AsyncCheckpointWriter(CheckpointOptions options)
    : options_(std::move(options)) {}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  wait_for_writer();  // the writer waits for the snapshot's copies before it writes
  try {
    // Copies a failed save enqueued and no writer waited for still fill the buffers.
    if (snapshot_stream_) snapshot_stream_->synchronize();
  } catch (...) {
    // A failed copy was reported by its save, or the run is ending on another error.
  }
}

std::int64_t AsyncCheckpointWriter::pending_step() const {
  return pending_ ? pending_->save.counters.steps_taken : -1;
}

void AsyncCheckpointWriter::wait_for_writer() {
  if (writer_.joinable()) writer_.join();
}

std::optional<SavedCheckpoint> AsyncCheckpointWriter::save(RankContext& context, Trainer& trainer,
                                                           const nlohmann::json& config,
                                                           const nlohmann::json& extra) {
  auto next = std::make_unique<Pending>();
  next->save = describe_save(context, trainer, options_, config, extra);
  next->budget = save_budget(context, options_);
  next->buffer = next_buffer_;
  const auto copy_start = std::chrono::steady_clock::now();
  take_snapshot(context, trainer, *next);
  stats_.snapshot_s = seconds_since(copy_start);
  stats_.snapshot_bytes = std::max<std::uint64_t>(stats_.snapshot_bytes, next->bytes);

  const auto wait_start = std::chrono::steady_clock::now();
  wait_for_writer();
  stats_.wait_s = seconds_since(wait_start);
  stats_.total_wait_s += stats_.wait_s;
  std::optional<SavedCheckpoint> published;
  if (pending_) published = publish(context);

  next->temporary = prepare_save(context, next->save, next->guard);
  pending_ = std::move(next);
  next_buffer_ = 1 - next_buffer_;
  ++stats_.saves_started;
  start_writer(context, pending_->buffer);
  return published;
}

void AsyncCheckpointWriter::take_snapshot(RankContext& context, Trainer& trainer, Pending& next) {
  // The snapshot, into the buffer the writer is not reading, copied on a stream of its own while
  // the next step's forward and backward run: the trainer holds its update until the copies
  // have run (Trainer::hold_state_for), and the writer starts writing once they have. Note:
  // NVMe-resident state is read through its swap files here, on this thread, a sub-group at a
  // time, not by the writer: the next step's optimizer rewrites those files.
  const bool snapshot = rank_file_role(next.save.placement) != RankFileRole::kNone;
  const std::size_t size = snapshot ? rank_state_bytes(trainer, next.save) : 0;
  Buffer& buffer = buffers_[next.buffer];
  if (buffer.bytes() != size) {
    buffer.reset();  // before the new one: the peak is one buffer here, not two
    buffer = context.device.host_allocator().allocate(size, Category::kSnapshot);
  }
  const std::vector<StateShard> shards =
      snapshot ? rank_state_shards(trainer, next.save) : std::vector<StateShard>{};
  std::size_t total = 0;
  for (const StateShard& shard : shards) {
    total += (shard.end - shard.begin) * dtype_size(shard.dtype);
  }
  if (total != size) {
    throw Error(ErrorKind::kInternal, "the checkpoint snapshot holds " + std::to_string(total) +
                                          " bytes, not its " + std::to_string(size) +
                                          " planned bytes");
  }
  if (!snapshot_stream_) snapshot_stream_ = context.device.create_stream("checkpoint snapshot");
  next.copied = context.device.create_event();
  next.copy_start = std::chrono::steady_clock::now();
  unsigned char* into = buffer.as<unsigned char>();
  for (const StateShard& shard : shards) {
    const std::size_t element = dtype_size(shard.dtype);
    const std::size_t count = shard.end - shard.begin;
    if (shard.swap) {
      read_state_elements(context, shard, 0, count,
                          [&](const void* host, std::size_t first, std::size_t piece) {
                            std::memcpy(into + first * element, host, piece * element);
                          });
    } else {
      context.device.copy(*snapshot_stream_, into, shard.data, count * element);
    }
    into += count * element;
  }
  snapshot_stream_->record(*next.copied);
  trainer.hold_state_for(next.copied);
  next.bytes = size;
}

namespace {

// The rank file's `count` bytes, written (or only hashed, by a replica that checks group 0's): the
// digest the ranks then exchange.
FileDigest write_rank_file(const SaveDescription& save, const std::string& temporary,
                           std::optional<std::uint64_t>* budget, const unsigned char* bytes,
                           std::uint64_t count) {
  const RankFileRole role = rank_file_role(save.placement);
  if (role == RankFileRole::kWrite) {
    HashingFileWriter writer(rank_file_path(temporary, save.placement), budget);
    writer.write(bytes, count);
    return writer.finish();
  }
  if (role == RankFileRole::kHash) return {count, XXH3_64bits(bytes, count)};
  return {};
}

}  // namespace

void AsyncCheckpointWriter::start_writer(RankContext& context, std::size_t buffer) {
  Pending* pending = pending_.get();
  const auto* bytes = buffers_[buffer].as<const unsigned char>();
  TraceRecorder* trace = context.trace;
  const int rank = context.rank;
  writer_ = std::thread([pending, bytes, trace, rank] {
    const std::int64_t copy_begin_us = TraceRecorder::now_us();
    pending->failure = capture(pending->record, [&] { pending->copied->synchronize(); });
    pending->copy_s = seconds_since(pending->copy_start);
    const auto start = std::chrono::steady_clock::now();
    const std::int64_t begin_us = TraceRecorder::now_us();
    if (!pending->failure) {
      pending->failure = capture(pending->record, [&] {
        const FileDigest digest = write_rank_file(pending->save, pending->temporary,
                                                  &pending->budget, bytes, pending->bytes);
        pending->record.bytes = digest.bytes;
        pending->record.xxh3 = digest.xxh3;
      });
    }
    pending->write_s = seconds_since(start);
    if (trace != nullptr) {
      const auto size = static_cast<std::int64_t>(pending->bytes);
      trace->add({rank, "checkpoint writer", "wait for the snapshot copy", copy_begin_us, begin_us,
                  size, -1});
      trace->add({rank, "checkpoint writer", "write " + pending->save.final_name, begin_us,
                  TraceRecorder::now_us(), size, -1});
    }
    pending->done.store(true);
  });
}

SavedCheckpoint AsyncCheckpointWriter::publish(RankContext& context) {
  // The writer is joined: its record and failure are this thread's to read.
  std::unique_ptr<Pending> pending = std::move(pending_);
  stats_.write_s = pending->write_s;
  stats_.copy_s = pending->copy_s;
  const std::vector<PhaseRecord> written =
      exchange_records(context, pending->record, pending->failure);
  raise_if_failed(written, pending->failure, pending->save.what);
  SavedCheckpoint saved = publish_save(context, pending->save, pending->temporary, written,
                                       pending->guard, &pending->budget, options_.keep_last);
  ++stats_.saves_published;
  return saved;
}

std::optional<SavedCheckpoint> AsyncCheckpointWriter::poll(RankContext& context) {
  if (!pending_) return std::nullopt;
  // Note: every rank holds a save in flight here or none (save() is a collective), so either
  // every rank runs this all-reduce or none does.
  const float mine = pending_->done.load() ? 1.0f : 0.0f;
  float done_everywhere = 0.0f;
  all_reduce_host(context, &mine, &done_everywhere, 1, DType::kFloat32, Reduction::kSum);
  if (done_everywhere < static_cast<float>(context.world_size)) return std::nullopt;
  wait_for_writer();
  return publish(context);
}

std::optional<SavedCheckpoint> AsyncCheckpointWriter::finish(RankContext& context) {
  if (!pending_) return std::nullopt;
  const auto wait_start = std::chrono::steady_clock::now();
  wait_for_writer();
  stats_.total_wait_s += seconds_since(wait_start);
  return publish(context);
}

}  // namespace zest
