// Developer settings from the environment: unset and empty read as not set, numbers within range and the
// stated words are read, anything else fails naming the variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/env.h"
#include "core/error.h"

namespace qspec {
namespace {

constexpr const char* kName = "QSPEC_TEST_ENV_SETTING";

// Sets (or with nullptr unsets) the variable for one check and restores its absence after.
class Setting {
 public:
  explicit Setting(const char* value) {
    if (value == nullptr)
      unsetenv(kName);
    else
      setenv(kName, value, 1);
  }
  ~Setting() { unsetenv(kName); }
  Setting(const Setting&) = delete;
  Setting& operator=(const Setting&) = delete;
};

std::string failure_of_integer(const char* value) {
  const Setting setting(value);
  try {
    env_integer(kName, 0, 100);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Env, UnsetOrEmptyIsNotSet) {
  {
    const Setting setting(nullptr);
    EXPECT_FALSE(env_integer(kName, 0, 100).has_value());
    EXPECT_FALSE(env_number(kName, 0.0, 1.0).has_value());
  }
  const Setting setting("");
  EXPECT_FALSE(env_integer(kName, 0, 100).has_value());
  EXPECT_FALSE(env_number(kName, 0.0, 1.0).has_value());
}

TEST(Env, ReadsNumbersWithinRange) {
  {
    const Setting setting("42");
    EXPECT_EQ(env_integer(kName, 0, 100), 42);
    EXPECT_EQ(env_number(kName, 0.0, 100.0), 42.0);
  }
  {
    const Setting setting("0");
    EXPECT_EQ(env_integer(kName, 0, 100), 0);
  }
  const Setting setting("2.5");
  EXPECT_EQ(env_number(kName, 0.0, 10.0), 2.5);
}

TEST(Env, RejectsWhatIsNotANumberInRange) {
  for (const char* bad : {"abc", "12abc", " 12", "-1", "101", "2.5", "1e400"}) {
    const std::string message = failure_of_integer(bad);
    EXPECT_NE(message.find(kName), std::string::npos) << bad << ": " << message;
    EXPECT_NE(message.find("expected an integer in [0, 100]"), std::string::npos) << bad << ": " << message;
    EXPECT_NE(message.find(std::string("'") + bad + "'"), std::string::npos) << bad << ": " << message;
  }
  const Setting setting("fast");
  EXPECT_THROW(env_number(kName, 0.0, 10.0), Error);
}

TEST(Env, ReadsOneOfTheChoicesExactly) {
  {
    const Setting setting(nullptr);
    EXPECT_FALSE(env_choice(kName, {"rows64"}).has_value());
  }
  {
    const Setting setting("rows64");
    EXPECT_EQ(env_choice(kName, {"rows32", "rows64"}), "rows64");
  }
  for (const char* bad : {"rows_64", "Rows64", "rows64 "}) {
    const Setting setting(bad);
    try {
      env_choice(kName, {"rows32", "rows64"});
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(kName) + ": expected one of rows32, rows64, got '" +
                                           bad + "'"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace qspec
