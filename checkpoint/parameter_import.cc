#include "checkpoint/parameter_import.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"
#include "kernels/convert.h"
#include "checkpoint/agreement.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/state_shard_copies.h"
#include "checkpoint/tensor_parallel_reads.h"

namespace zest {

namespace {

constexpr std::size_t kDifferencesShown = 5;

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Where a parameter's values are in the file: its own tensor, or for a GPT in vocabulary pieces
// (models/gpt_pieces.h) the rows of one "embedding.wte" [V, C], as zest-ckpt export writes it,
// from element `first` on.
struct FileSource {
  std::string name;
  std::size_t first = 0;
  std::vector<std::int64_t> shape;  // the file tensor's
};

bool vocab_piece(const std::string& unit, const ParamPlace& place) {
  return place.name == "wte" && place.shape.size() == 2 &&
         (unit == "embedding" || unit.rfind("wte_piece", 0) == 0);
}

// Per parameter name ("<unit>.<name>").
std::map<std::string, FileSource> file_sources(const std::vector<ShardLayout>& layouts) {
  bool cut = false;
  std::int64_t rows = 0;
  for (const ShardLayout& layout : layouts) {
    cut = cut || layout.unit_name().rfind("wte_piece", 0) == 0;
    for (const ParamPlace& place : layout.params()) {
      if (vocab_piece(layout.unit_name(), place)) rows += place.shape[0];
    }
  }
  std::map<std::string, FileSource> sources;
  std::size_t first = 0;
  for (const ShardLayout& layout : layouts) {
    for (const ParamPlace& place : layout.params()) {
      const std::string name = layout.unit_name() + "." + place.name;
      if (!cut || !vocab_piece(layout.unit_name(), place)) {
        sources[name] = {name, 0, place.shape};
        continue;
      }
      sources[name] = {"embedding.wte", first, {rows, place.shape[1]}};
      first += place.numel;
    }
  }
  return sources;
}

// What keeps `file` from filling `layouts`, first differences first.
std::vector<std::string> differences(const SafetensorsReader& file,
                                     const std::vector<ShardLayout>& layouts) {
  std::vector<std::string> found;
  std::map<std::string, bool> wanted;
  const std::map<std::string, FileSource> sources = file_sources(layouts);
  for (const ShardLayout& layout : layouts) {
    for (const ParamPlace& place : layout.params()) {
      const FileSource& source = sources.at(layout.unit_name() + "." + place.name);
      const std::string& name = source.name;
      if (wanted.count(name)) continue;  // the pieces' table, checked once
      wanted[name] = true;
      const SafetensorsTensor* tensor = file.find(name);
      if (tensor == nullptr) {
        found.push_back("'" + name + "' " + shape_text(source.shape) + " is missing");
      } else if (tensor->shape != source.shape) {
        found.push_back("'" + name + "' has shape " + shape_text(tensor->shape) +
                        ", the model's is " + shape_text(source.shape));
      } else if (!dtype_from_safetensors(tensor->dtype)) {
        found.push_back("'" + name + "' has dtype " + tensor->dtype +
                        " (F32, BF16, F16 or F64 expected)");
      }
    }
  }
  for (const SafetensorsTensor& tensor : file.tensors()) {
    if (!wanted.count(tensor.name)) {
      found.push_back("'" + tensor.name + "' is not a parameter of the model");
    }
  }
  return found;
}

void check_fits(const SafetensorsReader& file, const std::vector<ShardLayout>& layouts) {
  const std::vector<std::string> found = differences(file, layouts);
  if (found.empty()) return;
  std::vector<std::string> shown(found.begin(),
                                 found.begin() + std::min(found.size(), kDifferencesShown));
  std::string more = found.size() > shown.size()
                         ? fmt::format(" (and {} more)", found.size() - shown.size())
                         : "";
  throw Error(ErrorKind::kData,
              fmt::format("{} does not hold this model's parameters: {}{}", file.path(),
                          fmt::join(shown, "; "), more));
}

// A tensor-parallel rank's cut of each parameter of a unit (none: every parameter whole).
struct UnitCut {
  std::vector<TensorSplit> splits;
  int rank = 0;
  int ranks = 1;
};

// Elements [begin, end) of a part cut by `split` out of the whole parameter `whole`, which has
// `columns` columns.
std::vector<float> part_of(const std::vector<float>& whole, std::int64_t columns,
                           const SplitParameter& part, int rank, const ElementRange& elements) {
  std::vector<float> values(elements.size());
  part.for_each_whole_run(
      rank, elements.begin, elements.size(),
      [&](std::size_t offset, std::int64_t row, std::int64_t column, std::size_t count) {
        const auto first = static_cast<std::size_t>(row * columns + column);
        std::copy_n(whole.begin() + static_cast<std::ptrdiff_t>(first), count,
                    values.begin() + static_cast<std::ptrdiff_t>(offset));
      });
  return values;
}

// Copies shard `shard`'s part of unit `u` out of the file into every parameter-valued shard view.
void fill_unit(const RankContext& context, int shard_index, const SafetensorsReader& file,
               const ShardLayout& layout, const std::vector<StateShard>& shards,
               const std::map<std::string, FileSource>& sources, const UnitCut& cut) {
  for (const ParamInShard& part : layout.params_in_shard(shard_index)) {
    const ParamPlace& place = layout.params()[part.param_index];
    const FileSource& from = sources.at(layout.unit_name() + "." + place.name);
    std::vector<float> values = file.read_float32(from.name);
    const float* source = values.data() + from.first + part.param_elements.begin;
    if (!cut.splits.empty() && cut.splits[part.param_index].axis != TensorSplit::Axis::kWhole) {
      const SplitParameter split{place.shape, cut.splits[part.param_index], cut.ranks};
      values = part_of(values, from.shape.size() >= 2 ? from.shape.back() : 1, split, cut.rank,
                       part.param_elements);
      source = values.data();
    }
    for (const StateShard& shard : shards) {
      if (shard.name != "params" && shard.name != "master") continue;
      // Note: rounded to nearest even into a 2-byte compute copy; the master keeps the fp32
      // value itself, as a fresh initialization does.
      write_state_elements(context, shard, part.shard_offset, part.param_elements.size(),
                           [&](void* host, std::size_t first, std::size_t count) {
                             cpu::convert(source + first, DType::kFloat32, host, shard.dtype,
                                          count);
                           });
    }
  }
}

}  // namespace

ImportResult import_parameters(RankContext& context, Trainer& trainer, const std::string& path) {
  ImportResult result;
  const std::vector<ShardLayout>& layouts = trainer.layouts();
  // Note: a pipeline stage's rank holds only its pipeline stage's units, sharded over its
  // data-parallel group: the file is held against the whole model, and the rank fills its own shard
  // of its own units (a tied copy too, so both copies start equal).
  const std::optional<CheckpointPlacement> placement = trainer.checkpoint_placement();
  // A tensor-parallel rank's slices are cut from the file's whole tensors.
  const bool cut = placement && placement->tensor_ranks > 1;
  const std::vector<ShardLayout> whole = cut         ? whole_layouts(*placement)
                                         : placement ? placement->units
                                                     : layouts;
  for (const ShardLayout& layout : whole) {
    result.tensors += layout.params().size();
    result.parameters += layout.numel();
  }
  // Check everything on every rank and agree before anything is written.
  std::optional<SafetensorsReader> file;
  PhaseRecord checked;
  const std::optional<Error> check_failure = capture(checked, [&] {
    file.emplace(path);
    check_fits(*file, whole);
  });
  raise_if_failed(exchange_records(context, checked, check_failure),
                  check_failure, "reading initial parameters from " + path);

  PhaseRecord copied;
  const std::optional<Error> copy_failure = capture(copied, [&] {
    const std::map<std::string, FileSource> sources = file_sources(cut ? whole : layouts);
    // The rank's shard: its world rank, or its place in its shard group (hybrid sharding).
    const CheckpointPlacement here = placement_of(trainer, context.rank, context.world_size);
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      UnitCut unit_cut{{}, here.tensor_rank, here.tensor_ranks};
      if (cut) unit_cut.splits = tensor_splits(here, here.local_units[u]);
      fill_unit(context, here.shard, *file, layouts[u], trainer.state_shards(u), sources, unit_cut);
    }
  });
  raise_if_failed(exchange_records(context, copied, copy_failure), copy_failure,
                  "reading initial parameters from " + path);
  trainer.state_loaded();
  return result;
}

}  // namespace zest
