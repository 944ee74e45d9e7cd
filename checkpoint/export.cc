#include "checkpoint/export.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "checkpoint/source.h"
#include "checkpoint/safetensors.h"

namespace zest {
namespace {

// Elements converted per read, so a large parameter never needs a second full copy in memory.
constexpr std::size_t kChunkElements = std::size_t{1} << 20;

// A parameter every tensor rank holds whole (rank 0's), or any without tensor parallelism.
void write_flat(const CheckpointSource& source, std::size_t unit, const CheckpointParam& p,
                std::size_t tensor, DType dtype, std::vector<char>& buffer,
                const SafetensorsSink& write) {
  for (std::size_t done = 0; done < p.numel; done += kChunkElements) {
    const std::size_t now = std::min(kChunkElements, p.numel - done);
    buffer.resize(now * dtype_size(dtype));
    const std::size_t first = p.offset + done;
    source.read(unit, tensor, first, first + now, buffer.data(), dtype);
    write(buffer.data(), buffer.size());
  }
}

// A parameter cut among tensor ranks: put back together a whole row at a time, each row from the
// parts that hold it (checkpoint/tensor_split.h).
void write_by_rows(const CheckpointSource& source, std::size_t unit, const CheckpointParam& p,
                   std::size_t tensor, DType dtype, std::vector<char>& buffer,
                   const SafetensorsSink& write) {
  const int ranks = source.manifest().tensor_parallel_size;
  const SplitParameter part{p.shape, p.split, ranks};
  const std::vector<std::int64_t> whole = whole_shape(p.shape, p.split, ranks);
  const std::int64_t columns = whole.size() >= 2 ? whole.back() : 1;
  const std::int64_t rows = static_cast<std::int64_t>(p.numel) * ranks / columns;
  const std::size_t size = dtype_size(dtype);
  buffer.resize(static_cast<std::size_t>(columns) * size);
  for (std::int64_t row = 0; row < rows; ++row) {
    part.for_each_part_run(
        row, 0, static_cast<std::size_t>(columns),
        [&](std::size_t within, int rank, std::size_t element, std::size_t count) {
          source.read(unit, tensor, p.offset + element, p.offset + element + count,
                      buffer.data() + within * size, dtype, rank);
        });
    write(buffer.data(), buffer.size());
  }
}

}  // namespace

ExportResult export_safetensors(const std::string& source_path, const std::string& out,
                                DType dtype) {
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16 && dtype != DType::kFloat16) {
    throw Error(ErrorKind::kUsage, std::string("cannot export as ") + dtype_name(dtype) +
                                       " (allowed: fp32, bf16, fp16)");
  }
  const CheckpointSource source(resolve_checkpoint(source_path));
  source.verify_all();
  const CheckpointManifest& manifest = source.manifest();
  const int master = manifest.find_tensor("master");
  const std::size_t tensor =
      static_cast<std::size_t>(master >= 0 ? master : manifest.find_tensor("params"));

  struct Piece {
    std::size_t unit;
    std::size_t param;
  };
  std::vector<SafetensorsEntry> entries;
  std::vector<std::vector<Piece>> pieces;  // per entry, written one after the other
  ExportResult result{out, 0, 0, manifest.tensors[tensor].name};
  // Note: a GPT in vocabulary pieces (models/gpt_pieces.h) exports its "embedding.wte" and
  // "wte_piece{i}.wte" as the rows of one "embedding.wte" [V, C], the uncut model's tensor, so
  // the file reads the same whatever model.vocab_pieces was (import cuts it anew).
  std::size_t table_entry = entries.size();
  bool table_found = false;
  for (std::size_t u = 0; u < manifest.units.size(); ++u) {
    const std::string& unit = manifest.units[u].name;
    for (std::size_t i = 0; i < manifest.units[u].params.size(); ++i) {
      const CheckpointParam& p = manifest.units[u].params[i];
      const std::vector<std::int64_t> shape =
          whole_shape(p.shape, p.split, manifest.tensor_parallel_size);
      // A cut parameter's whole has every rank's part; a whole one is the same on each.
      result.parameters += p.split.axis == TensorSplit::Axis::kWhole
                               ? p.numel
                               : p.numel * static_cast<std::size_t>(manifest.tensor_parallel_size);
      const bool table = p.name == "wte" && shape.size() == 2 &&
                         (unit == "embedding" || unit.rfind("wte_piece", 0) == 0);
      if (table && table_found && entries[table_entry].shape[1] == shape[1]) {
        entries[table_entry].shape[0] += shape[0];
        pieces[table_entry].push_back({u, i});
        continue;
      }
      if (table && !table_found) {
        table_found = true;
        table_entry = entries.size();
      }
      entries.push_back({unit + "." + p.name, dtype, shape});
      pieces.push_back({{u, i}});
    }
  }
  result.tensors = entries.size();
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"zest.step", std::to_string(manifest.step)},
      {"zest.from", result.taken_from},
      {"zest.compute_dtype", dtype_name(manifest.compute_dtype)}};
  std::vector<char> buffer;
  write_safetensors(out, entries, metadata, [&](std::size_t i, const SafetensorsSink& write) {
    for (const Piece& piece : pieces[i]) {
      const CheckpointParam& p = manifest.units[piece.unit].params[piece.param];
      if (p.split.axis == TensorSplit::Axis::kWhole) {
        write_flat(source, piece.unit, p, tensor, dtype, buffer, write);
      } else {
        write_by_rows(source, piece.unit, p, tensor, dtype, buffer, write);
      }
    }
  });
  return result;
}

}  // namespace zest
