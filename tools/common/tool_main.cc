#include "tools/common/tool_main.h"

#include <exception>
#include <filesystem>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/printable.h"

namespace zest {
namespace {

// One line, whatever the message holds, and nothing in it the terminal would act on (a message
// may quote a file's bytes).
int report(const char* program, std::string message, int status) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::cerr << program << ": error: " << printable(message) << std::endl;
  return status;
}

}  // namespace

int run_tool(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& error) {
    return report(program, error.what(), is_input_error(error.kind()) ? 2 : 1);
  } catch (const std::filesystem::filesystem_error& error) {
    // Its what() holds each path whole, however long: the paths are quoted short instead.
    std::string message = "file system: " + error.code().message();
    if (!error.path1().empty()) message += " " + quoted_path(error.path1().string());
    if (!error.path2().empty()) message += " -> " + quoted_path(error.path2().string());
    return report(program, message, 1);
  } catch (const std::exception& error) {
    return report(program, error.what(), 1);
  } catch (...) {
    return report(program, "unknown failure", 1);
  }
}

bool parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      app.exit(error);  // prints the help
      return false;
    }
    throw Error(ErrorKind::kUsage, std::string(error.what()) + " (see --help)");
  }
  return true;
}

}  // namespace zest
