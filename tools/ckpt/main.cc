// zest-ckpt: looks into, checks and converts zest checkpoints without training.
//
//   zest-ckpt inspect DIR                                    a human summary
//   zest-ckpt verify  DIR                                    the manifest's checksum, every shard
//                                                            file's size and checksum
//   zest-ckpt export  DIR --out FILE.safetensors [--dtype fp32|bf16|fp16]
//   zest-ckpt reshard DIR --world M [--stage T] --out DIR2   rewrite for M ranks
//
// DIR is a checkpoint directory (step-<N>/) or a checkpoint root whose `latest` names one.
// Errors print one line, "zest-ckpt: error: <message>", and exit 2 for bad input (usage, a
// missing or malformed checkpoint) and 1 for failures at run time — a shard file's checksum
// mismatch found by verify among them, since the input was well-formed and its data went bad. A
// manifest that fails its own checksum is bad input (2): without it nothing can be checked.
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "base/byte_size.h"
#include "base/error.h"
#include "base/file_checks.h"
#include "base/printable.h"
#include "memory/allocator.h"
#include "checkpoint/export.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "checkpoint/source.h"
#include "engine/stage_plan.h"
#include "tools/common/tool_main.h"

namespace {

constexpr const char* kProgram = "zest-ckpt";
constexpr const char* kCommands = "inspect, verify, export or reshard";

// CLI11 says "A subcommand is required" for a command it does not know; this names it.
void check_command(int argc, char** argv) {
  if (argc < 2) {
    throw zest::Error(zest::ErrorKind::kUsage,
                      std::string("a command is required: ") + kCommands + " (see --help)");
  }
  const std::string first = argv[1];
  if (first.empty() || first[0] == '-') return;  // --help, or an option CLI11 names
  for (const char* command : {"inspect", "verify", "export", "reshard"}) {
    if (first == command) return;
  }
  throw zest::Error(zest::ErrorKind::kUsage, "unknown command '" + first + "'; the commands are " +
                                                 kCommands + " (see --help)");
}

// An integer from `low` to `high`, said so by name (CLI11's PositiveNumber prints its range up to
// the largest double).
CLI::Validator integer_from(int low, int high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        int value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error != std::errc() || stop != end || value < low || value > high) {
          return "must be an integer from " + std::to_string(low) + " to " +
                 std::to_string(high) + ", got '" + text + "'";
        }
        return "";
      },
      std::to_string(low) + ".." + std::to_string(high));
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string manifest_checksum_text(const zest::CheckpointManifest& m) {
  return m.manifest_xxh3 ? "xxh3 " + zest::hex_digest(*m.manifest_xxh3)
                         : std::string("no checksum (an older zest wrote it: read unchecked)");
}

int inspect(const std::string& path) {
  const std::string dir = zest::resolve_checkpoint(path);
  const zest::CheckpointManifest m = zest::read_manifest(dir);
  std::uint64_t bytes = 0;
  std::size_t parameters = 0;
  for (const zest::CheckpointFile& f : m.files) bytes += f.bytes;
  for (const zest::CheckpointUnit& u : m.units) {
    for (const zest::CheckpointParam& p : u.params) {
      // A part of a parameter cut among tensor ranks: the whole has every rank's.
      parameters += p.split.axis == zest::TensorSplit::Axis::kWhole
                        ? p.numel
                        : p.numel * static_cast<std::size_t>(m.tensor_parallel_size);
    }
  }
  std::cout << fmt::format("checkpoint {}\n", zest::printable(dir));
  std::cout << fmt::format("  format version {}, written by zest {}\n", m.format_version,
                           zest::printable(m.zest_version));
  std::cout << fmt::format("  step {} (optimizer steps {}), world size {}, stage {}, compute {}\n",
                           m.step, m.counters.optimizer_steps, m.world_size, m.stage,
                           zest::dtype_name(m.compute_dtype));
  if (m.pipeline_stages > 1) {
    std::cout << fmt::format("  {} pipeline stages, each unit sharded over {} ranks\n",
                             m.pipeline_stages, m.world_size);
  }
  if (m.tensor_parallel_size > 1) {
    std::cout << fmt::format(
        "  tensor-parallel size {}: each tensor rank saved its part of every "
        "unit; the shapes below are one part's\n",
        m.tensor_parallel_size);
  }
  if (m.hybrid_replicas > 1) {
    std::cout << fmt::format("  hybrid sharding: saved by {} shard groups of {} ranks ({} ranks); "
                             "the files are one group's, the others held the same shards\n",
                             m.hybrid_replicas, m.world_size,
                             m.hybrid_replicas * m.world_size * m.pipeline_stages);
  }
  const zest::LossScalerState& s = m.counters.loss_scaler;
  std::cout << fmt::format("  loss scale {} (skipped steps {})\n", s.scale, s.skipped);
  std::cout << fmt::format("  {} parameters in {} units; state tensors:", parameters,
                           m.units.size());
  for (const zest::CheckpointTensor& t : m.tensors) {
    std::cout << fmt::format(" {} ({})", zest::printable(t.name), zest::dtype_name(t.dtype));
  }
  std::cout << '\n';
  if (!m.extra.empty()) {
    std::cout << "  extra: "
              << zest::printable(
                     m.extra.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
              << '\n';
  }
  std::cout << fmt::format("  {:<20} {:>12} {:>12} {:>12}\n", "unit", "numel", "flat", "shard");
  for (const zest::CheckpointUnit& u : m.units) {
    std::cout << fmt::format("  {:<20} {:>12} {:>12} {:>12}{}\n", zest::printable(u.name),
                             u.numel, u.flat_length, u.shard_length,
                             m.pipeline_stages > 1
                                 ? fmt::format("  (pipeline stage {})", u.pipeline_stage)
                                 : std::string());
    for (const zest::CheckpointParam& p : u.params) {
      const std::string cut = p.split.axis == zest::TensorSplit::Axis::kWhole
                                  ? std::string()
                                  : std::string("  cut by ") + zest::axis_name(p.split.axis);
      std::cout << fmt::format("    {:<18} {:>12} at {:<10} {}{}\n", zest::printable(p.name),
                               p.numel, p.offset, shape_text(p.shape), cut);
    }
  }
  std::cout << fmt::format("  {:<14} {}\n", "manifest.json", manifest_checksum_text(m));
  std::cout << fmt::format("  files ({} in all):\n", zest::format_bytes(bytes));
  for (const zest::CheckpointFile& f : m.files) {
    std::cout << fmt::format("    {:<14} {:>12} bytes  xxh3 {}\n", zest::printable(f.name),
                             f.bytes, zest::hex_digest(f.xxh3));
  }
  return 0;
}

int verify(const std::string& path) {
  // The manifest's own checksum is checked as it is read.
  const zest::CheckpointSource source(zest::resolve_checkpoint(path));
  const zest::CheckpointManifest& m = source.manifest();
  std::cout << fmt::format("manifest.json: {}\n",
                           m.manifest_xxh3 ? "ok" : manifest_checksum_text(m));
  // A shard that is not a file at all is a malformed checkpoint (status 2), not bytes gone bad.
  for (const zest::CheckpointFile& file : source.manifest().files) {
    zest::refuse_non_regular_file((std::filesystem::path(source.dir()) / file.name).string(),
                                  zest::ErrorKind::kCheckpoint, "shard file");
  }
  const int files = static_cast<int>(source.manifest().files.size());
  for (int rank = 0; rank < files; ++rank) {
    try {
      source.verify(rank);
    } catch (const zest::Error& error) {
      // A file that is present but whose bytes went bad: the data failed, not the command.
      throw zest::Error(zest::ErrorKind::kIo, error.what());
    }
    const std::string& name = source.manifest().files[static_cast<std::size_t>(rank)].name;
    std::cout << fmt::format("{}: ok\n", zest::printable(name));
  }
  std::cout << fmt::format("{}: {} files verified\n", zest::printable(source.dir()), files);
  return 0;
}

int run(int argc, char** argv) {
  CLI::App app{"Inspects, verifies, exports and reshards zest checkpoints.", kProgram};
  app.require_subcommand(1);
  std::string dir, out, dtype = "fp32";
  int world = 0;
  std::optional<int> stage;

  CLI::App* inspect_command = app.add_subcommand("inspect", "print a summary of a checkpoint");
  inspect_command->add_option("DIR", dir, "checkpoint directory, or a root with `latest`")
      ->required();
  CLI::App* verify_command = app.add_subcommand("verify", "check every shard file's checksum");
  verify_command->add_option("DIR", dir, "checkpoint directory, or a root with `latest`")
      ->required();
  CLI::App* export_command =
      app.add_subcommand("export", "write the full parameters as one safetensors file");
  export_command->add_option("DIR", dir, "checkpoint directory, or a root with `latest`")
      ->required();
  export_command->add_option("--out", out, "the .safetensors file to write")->required();
  export_command->add_option("--dtype", dtype, "fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  CLI::App* reshard_command =
      app.add_subcommand("reshard", "rewrite a checkpoint for another world size");
  reshard_command->add_option("DIR", dir, "checkpoint directory, or a root with `latest`")
      ->required();
  reshard_command->add_option("--world", world, "the new world size")
      ->required()
      ->check(integer_from(1, 65536));
  reshard_command->add_option("--stage", stage, "the stage recorded for the new run")
      ->check(integer_from(0, zest::StagePlan::kFullySharded));
  reshard_command->add_option("--out", out, "the new checkpoint directory (must not exist)")
      ->required();
  check_command(argc, argv);
  if (!zest::parse_command_line(app, argc, argv)) return 0;

  if (*inspect_command) return inspect(dir);
  if (*verify_command) return verify(dir);
  if (*export_command) {
    // Before the checkpoint is read: a wrong --out would otherwise fail only at the end.
    zest::check_output_file(out, zest::ErrorKind::kUsage, "--out");
    const zest::ExportResult result = zest::export_safetensors(dir, out, zest::parse_dtype(dtype));
    std::cout << fmt::format("{}: {} tensors, {} parameters ({} from {})\n",
                             zest::printable(result.path), result.tensors, result.parameters,
                             dtype, zest::printable(result.taken_from));
    return 0;
  }
  if (!std::filesystem::exists(std::filesystem::symlink_status(out))) {
    zest::check_output_directory(out, zest::ErrorKind::kUsage, "--out");
  }  // else reshard_checkpoint refuses it: the new checkpoint must not exist
  const zest::ReshardResult result = zest::reshard_checkpoint(dir, out, world, stage);
  std::cout << fmt::format("{}: {} ranks, stage {}, {}\n", zest::printable(result.path),
                           result.world_size, result.stage, zest::format_bytes(result.bytes));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zest::run_tool(kProgram, [&] { return run(argc, argv); });
}
