// The Error a call throws, for tests that check what an error says: capture_error fails the test
// (and returns a placeholder) when the call throws nothing; error_message returns "" then.
#pragma once

#include <string>

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

// The message of the Error `call` throws, which must be of `kind`; "" when it throws nothing, for
// tests that also check what is accepted.
template <typename Call>
std::string error_message(Call call, ErrorKind kind) {
  try {
    call();
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), kind) << error.what();
    return error.what();
  }
  return "";
}

}  // namespace zest::testing
