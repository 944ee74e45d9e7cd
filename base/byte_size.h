// Byte counts as people write them in configs and read them in messages: a plain integer ("1048576") or a number with a
// unit ("2GiB", "512 MiB", "1.5GB"). Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal
// units (kB, MB, GB, TB) powers of 1000, the way DeepSpeed and the SI prefixes read them.
// Invariant: a parsed size is a whole number of bytes that fits std::size_t, or nothing.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace zest {

// The forms parse_byte_size() accepts, for error messages.
inline constexpr const char* kByteSizeForms =
    "a byte count, or a number with a unit B, kB, MB, GB, TB, KiB, MiB, GiB or TiB (\"2GiB\")";

// Units are case-insensitive ("2gib"); one space may stand between the number and the unit.
// A fraction must come out as whole bytes ("1.5GB" yes, "1.5B" no). Returns nothing for a
// malformed, negative or overflowing size.
std::optional<std::size_t> parse_byte_size(std::string_view text);

// "1.50 GiB" style (binary units, two decimals; "1023 B" below 1 KiB), for messages and reports.
std::string format_bytes(std::size_t bytes);

}  // namespace zest
