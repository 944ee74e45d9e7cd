// Paths checked by name before they are opened or written. An input that is not a regular file
// blocks or never ends: open() of a FIFO waits for a writer, /dev/zero reads forever, and a
// directory fails inside the stream library with a message that names neither. An output whose
// place is wrong (a directory, a missing folder) would otherwise fail only when the run is over.
// Invariant: each check stats the path and nothing more; it never opens or creates it.
#pragma once

#include <string>

#include "base/error.h"

namespace zest {

// "a directory", "a FIFO", "a character device", ... for the file at `path` (after symlinks),
// "a regular file", or "missing" when it cannot be stat'ed.
std::string file_kind(const std::string& path);

// Throws an Error of `kind`, "<what> '<path>' is a FIFO, not a regular file", when `path` exists
// and is not a regular file. A missing path passes: its reader names it as it always has.
void refuse_non_regular_file(const std::string& path, ErrorKind kind, const std::string& what);

// An output file that is written at `path` later (created, truncated or renamed over): refused
// now when `path` exists and is not a regular file (a directory, or a device or FIFO that writing
// would block on or destroy), or when its folder is missing, is not a directory or cannot be
// written.
void check_output_file(const std::string& path, ErrorKind kind, const std::string& what);

// An output directory that is created (with its parents) and written into later: refused now
// when `path` exists and is not a writable directory, or when its nearest existing ancestor is
// not a writable directory.
void check_output_directory(const std::string& path, ErrorKind kind, const std::string& what);

}  // namespace zest
