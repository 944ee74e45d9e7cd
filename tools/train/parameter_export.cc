#include "tools/train/parameter_export.h"

#include <algorithm>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_split.h"
#include "runtime/host_collectives.h"
#include "tools/train/console.h"

namespace zest {
namespace {

// The whole parameter from every tensor rank's part (`parts`: rank r's at r × part size), each
// element put where rank r's rule places it.
std::vector<float> whole_from_parts(const std::vector<float>& parts, const SplitParameter& split) {
  const std::vector<std::int64_t> shape = whole_shape(split.shape, split.split, split.tensor_ranks);
  std::size_t count = 1;
  for (std::int64_t dimension : shape) count *= static_cast<std::size_t>(dimension);
  std::vector<float> whole(count);
  const std::size_t part = parts.size() / static_cast<std::size_t>(split.tensor_ranks);
  const std::int64_t columns = shape.size() >= 2 ? shape.back() : 1;
  for (int rank = 0; rank < split.tensor_ranks; ++rank) {
    const float* mine = parts.data() + static_cast<std::size_t>(rank) * part;
    split.for_each_whole_run(
        rank, 0, part,
        [&](std::size_t offset, std::int64_t row, std::int64_t column, std::size_t run) {
          std::copy_n(mine + offset, run, whole.data() + row * columns + column);
        });
  }
  return whole;
}

}  // namespace

void export_parameters(RankContext& context, Trainer& trainer, const std::string& path,
                       Communicator* tensor_group) {
  std::vector<SafetensorsEntry> entries;
  std::vector<std::vector<float>> values;
  std::size_t name_index = 0;
  const std::vector<std::string> names = trainer.parameter_names();
  // A pipeline stage's rank holds only its pipeline stage's units; parameter_names() and
  // full_parameter() are the whole model's (a collective over every rank), in the order of
  // placement's units.
  const std::optional<CheckpointPlacement> placement = trainer.checkpoint_placement();
  const std::vector<ShardLayout>& layouts = placement ? placement->units : trainer.layouts();
  const int tensor_ranks = placement ? placement->tensor_ranks : 1;
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    const ShardLayout& layout = layouts[u];
    const std::vector<ParamPlace>& params = layout.params();
    for (std::size_t p = 0; p < params.size(); ++p) {
      const ParamPlace& place = params[p];
      const std::string name = layout.unit_name() + "." + place.name;
      std::vector<float> full = trainer.full_parameter(names.at(name_index++));
      std::vector<std::int64_t> shape = place.shape;
      if (tensor_ranks > 1) {
        const SplitParameter split{place.shape,
                                   split_of(placement->slices.at(u).at(p), place.shape,
                                            placement->tensor_rank, tensor_ranks, name),
                                   tensor_ranks};
        std::vector<float> parts(full.size() * static_cast<std::size_t>(tensor_ranks));
        tensor_group->label_next(("export " + name).c_str());
        all_gather_host(context, *tensor_group, full.data(), parts.data(), full.size(),
                        DType::kFloat32);
        if (context.rank == 0) full = whole_from_parts(parts, split);
        shape = whole_shape(place.shape, split.split, tensor_ranks);
      }
      if (context.rank != 0) continue;
      // A GPT in vocabulary pieces writes its pieces' rows as one embedding.wte, as zest-ckpt
      // export does (models/gpt_pieces.h).
      if (layout.unit_name().rfind("wte_piece", 0) == 0 && place.name == "wte" &&
          !entries.empty() && entries.front().name == "embedding.wte") {
        entries.front().shape[0] += shape[0];
        values.front().insert(values.front().end(), full.begin(), full.end());
        continue;
      }
      entries.push_back({name, DType::kFloat32, shape});
      values.push_back(std::move(full));
    }
  }
  if (context.rank != 0) return;
  write_safetensors(path, entries,
                    {{"format", "pt"}, {"zest.step", std::to_string(trainer.steps_taken())}},
                    [&](std::size_t i, const SafetensorsSink& write) {
                      write(values[i].data(), values[i].size() * sizeof(float));
                    });
  Console::say(fmt::format("zest-train: wrote the initial parameters ({} tensors) to {}",
                           entries.size(), path));
}

}  // namespace zest
