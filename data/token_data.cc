#include "data/token_data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "base/error.h"
#include "base/file_checks.h"
#include "base/printable.h"

namespace zest {

namespace {

std::string errno_text() { return std::strerror(errno); }

std::vector<std::string> expand(const std::string& pattern, const std::string& key) {
  glob_t matches{};
  std::vector<std::string> files;
  if (::glob(pattern.c_str(), 0, nullptr, &matches) == 0) {
    for (std::size_t i = 0; i < matches.gl_pathc; ++i) files.emplace_back(matches.gl_pathv[i]);
  }
  ::globfree(&matches);
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    throw Error(ErrorKind::kData, key + ": no file matches " + quoted_path(pattern) +
                                      "; give a .bin shard or a glob of them");
  }
  return files;
}

// Note: a FIFO, a device or a directory is refused by name before it is opened: /dev/zero
// would be read until memory runs out, a FIFO would block the open. Read with read(2), not a
// stream, so that a failed read (EIO from /proc/self/mem, a bad disk) names the file, the offset
// and the reason instead of the stream library's "basic_filebuf::underflow".
std::string read_whole(const std::string& path, const std::string& key) {
  refuse_non_regular_file(path, ErrorKind::kData, key + ": data file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw Error(ErrorKind::kData, key + ": " + quoted_path(path) +
                                      ": cannot open for reading (" + errno_text() + ")");
  }
  std::string bytes;
  char buffer[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got == 0) break;
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int error = errno;
      ::close(fd);
      throw Error(ErrorKind::kData, key + ": " + quoted_path(path) + ": offset " +
                                        std::to_string(bytes.size()) + ": cannot read (" +
                                        std::strerror(error) + ")");
    }
    bytes.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(fd);
  return bytes;
}

}  // namespace

void append_token_shard(std::string_view bytes, const std::string& source,
                        std::int64_t vocab_size, TokenData& data) {
  const std::size_t header_bytes = kTokenShardHeaderInts * sizeof(std::int32_t);
  if (bytes.size() < header_bytes) {
    throw Error(ErrorKind::kData, source + ": truncated header (" + std::to_string(bytes.size()) +
                                      " bytes; an llm.c token shard starts with 1024)");
  }
  std::int32_t header[kTokenShardHeaderInts];
  std::memcpy(header, bytes.data(), header_bytes);
  if (header[0] != kTokenShardMagic) {
    throw Error(ErrorKind::kData, source + ": offset 0: wrong magic " + std::to_string(header[0]) +
                                      " (an llm.c token shard has " +
                                      std::to_string(kTokenShardMagic) + ")");
  }
  if (header[1] != kTokenShardVersion) {
    throw Error(ErrorKind::kData, source + ": offset 4: unsupported version " +
                                      std::to_string(header[1]) + " (zest reads version 1)");
  }
  // Note: the count is checked against the bytes actually there before anything is allocated
  // for it, so a header that promises billions of tokens costs nothing.
  const std::int64_t count = header[2];
  if (count < 0) {
    throw Error(ErrorKind::kData, source + ": offset 8: the header's token count " +
                                      std::to_string(count) + " is negative");
  }
  const std::uint64_t expected = header_bytes + static_cast<std::uint64_t>(count) * 2;
  if (bytes.size() != expected) {
    throw Error(ErrorKind::kData, source + ": the header promises " + std::to_string(count) +
                                      " tokens (" + std::to_string(expected) +
                                      " bytes in all) but the file has " +
                                      std::to_string(bytes.size()) + " bytes; is it truncated?");
  }
  const std::size_t first = data.tokens.size();
  data.tokens.resize(first + static_cast<std::size_t>(count));
  std::copy(bytes.data() + header_bytes, bytes.data() + expected,
            reinterpret_cast<char*>(data.tokens.data() + first));
  for (std::int64_t i = 0; i < count; ++i) {
    if (data.tokens[first + i] >= vocab_size) {
      const std::uint16_t token = data.tokens[first + i];
      data.tokens.resize(first);  // `data` keeps only whole, valid shards
      throw Error(ErrorKind::kData, source + ": offset " + std::to_string(header_bytes + 2 * i) +
                                        ": token " + std::to_string(token) +
                                        " is not below model.vocab_size (" +
                                        std::to_string(vocab_size) + ")");
    }
  }
  data.files.push_back(source);
}

TokenData text_tokens(std::string_view bytes, const std::string& source) {
  if (bytes.empty()) {
    throw Error(ErrorKind::kData, source + ": the text file is empty; it needs at least one "
                                           "sequence of model.seq_len + 1 bytes");
  }
  TokenData data;
  data.tokens.assign(reinterpret_cast<const unsigned char*>(bytes.data()),
                     reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size());
  data.files.push_back(source);
  return data;
}

TokenData load_token_shards(const std::string& pattern, std::int64_t vocab_size,
                            const std::string& key) {
  TokenData data;
  for (const std::string& file : expand(pattern, key)) {
    append_token_shard(read_whole(file, key), file, vocab_size, data);
  }
  if (data.tokens.empty()) {
    throw Error(ErrorKind::kData,
                key + ": " + quoted_path(pattern) + " holds no tokens");
  }
  return data;
}

TokenData load_text_tokens(const std::string& path, const std::string& key) {
  // Note: stat, not std::filesystem::exists, which throws for a name too long, with the whole name.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const std::string reason = errno == ENOENT ? "does not exist"
                                               : "cannot be read (" + errno_text() + ")";
    throw Error(ErrorKind::kData, key + ": text file " + quoted_path(path) + " " + reason);
  }
  return text_tokens(read_whole(path, key), path);
}

void write_token_shard(const std::string& path, const std::vector<std::uint16_t>& tokens) {
  if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    throw Error(ErrorKind::kData, path + ": " + std::to_string(tokens.size()) +
                                      " tokens do not fit one shard (its header counts in int32)");
  }
  std::int32_t header[kTokenShardHeaderInts] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<std::int32_t>(tokens.size());
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * sizeof(std::uint16_t)));
    if (!out) {
      std::remove(temporary.c_str());
      throw Error(ErrorKind::kData, path + ": cannot write the token shard");
    }
  }
  std::filesystem::rename(temporary, path);
}

}  // namespace zest
