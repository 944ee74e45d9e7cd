// Where each parameter of a unit lives in the unit's flat buffer, and which contiguous slice of
// that buffer each rank owns. Parameters are laid end to end from offset 0; the flat length is
// padded up to a multiple of world_size × alignment so that every shard has the same length and
// starts on an aligned element. Invariant: every element of every parameter is owned by exactly
// one rank, and the padding is less than world_size × alignment elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zest {

// 32 elements: a 64-byte boundary for 2-byte types and two of them for fp32, so one layout
// serves the compute-dtype buffer and the fp32 master buffer alike.
inline constexpr std::size_t kDefaultShardAlignment = 32;

struct ParamShape {
  std::string name;
  std::vector<std::int64_t> shape;
};

struct ParamPlace {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t numel = 0;
  std::size_t offset = 0;  // first element in the flat buffer
};

struct ElementRange {
  std::size_t begin = 0;
  std::size_t end = 0;  // one past the last
  std::size_t size() const { return end - begin; }
};

// The part of one parameter that falls inside one rank's shard.
struct ParamInShard {
  std::size_t param_index = 0;   // into ShardLayout::params()
  ElementRange param_elements;   // elements of the parameter, in its own flat order
  std::size_t shard_offset = 0;  // where they start inside the shard
};

class ShardLayout {
 public:
  // Throws a kUsage Error naming the unit for an empty unit, a parameter with a zero-size or
  // negative dimension, a world size below 1 or an alignment of 0.
  static ShardLayout build(const std::string& unit_name, const std::vector<ParamShape>& params,
                           int world_size, std::size_t alignment = kDefaultShardAlignment);

  const std::string& unit_name() const { return unit_name_; }
  int world_size() const { return world_size_; }
  std::size_t alignment() const { return alignment_; }
  std::size_t numel() const { return numel_; }              // sum of parameter sizes
  std::size_t flat_length() const { return flat_length_; }  // numel plus padding
  std::size_t shard_length() const { return flat_length_ / world_size_; }
  std::size_t padding() const { return flat_length_ - numel_; }
  const std::vector<ParamPlace>& params() const { return params_; }

  ElementRange shard_range(int rank) const;
  // The parameters, and which of their elements, in rank `rank`'s shard, in flat order.
  std::vector<ParamInShard> params_in_shard(int rank) const;
  // The rank whose shard holds flat element `element`.
  int owner_of(std::size_t element) const { return static_cast<int>(element / shard_length()); }

 private:
  std::string unit_name_;
  int world_size_ = 1;
  std::size_t alignment_ = kDefaultShardAlignment;
  std::size_t numel_ = 0;
  std::size_t flat_length_ = 0;
  std::vector<ParamPlace> params_;
};

}  // namespace zest
