// What the command-line tools' main() functions share: however a tool fails, the user sees one
// line, "<program>: error: <message>", on stderr, and the exit status says whose fault it was:
// 2 for bad input (is_input_error: config, data, checkpoint, usage, a malformed command line), 1
// for a failure at run time. Invariant: run_tool never throws, so nothing reaches terminate.
#pragma once

#include <functional>

namespace CLI {
class App;
}  // namespace CLI

namespace zest {

// Runs `body`; returns its exit status, or reports what it threw as above and returns that
// status.
int run_tool(const char* program, const std::function<int()>& body);

// Parses the command line into `app`. False when the tool is done and should exit 0 (--help has
// printed); a malformed command line throws a kUsage Error that points to --help.
bool parse_command_line(CLI::App& app, int argc, char** argv);

}  // namespace zest
