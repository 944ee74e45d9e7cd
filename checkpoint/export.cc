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
    std::size_t offset;
    std::size_t numel;
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
    for (const CheckpointParam& p : manifest.units[u].params) {
      result.parameters += p.numel;
      const bool table = p.name == "wte" && p.shape.size() == 2 &&
                         (unit == "embedding" || unit.rfind("wte_piece", 0) == 0);
      if (table && table_found && entries[table_entry].shape[1] == p.shape[1]) {
        entries[table_entry].shape[0] += p.shape[0];
        pieces[table_entry].push_back({u, p.offset, p.numel});
        continue;
      }
      if (table && !table_found) {
        table_found = true;
        table_entry = entries.size();
      }
      entries.push_back({unit + "." + p.name, dtype, p.shape});
      pieces.push_back({{u, p.offset, p.numel}});
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
      for (std::size_t done = 0; done < piece.numel; done += kChunkElements) {
        const std::size_t now = std::min(kChunkElements, piece.numel - done);
        buffer.resize(now * dtype_size(dtype));
        const std::size_t first = piece.offset + done;
        source.read(piece.unit, tensor, first, first + now, buffer.data(), dtype);
        write(buffer.data(), buffer.size());
      }
    }
  });
  return result;
}

}  // namespace zest
