// The Error a call throws, for tests that check what an error says: fails the test (and returns
// a placeholder) when the call throws nothing.
#pragma once

#include <gtest/gtest.h>

#include "base/error.h"

namespace zest::testing {

template <typename Call>
Error capture_error(Call call) {
  try {
    call();
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "expected a zest::Error";
  return Error(ErrorKind::kInternal, "(none thrown)");
}

}  // namespace zest::testing
