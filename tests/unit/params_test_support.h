// Parse() over a map instead of the environment, for the config tests.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "config/params.h"

namespace vmmipc::config {

inline Params ParseWith(std::map<std::string, std::string> env) {
  return Parse([env = std::move(env)](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace vmmipc::config
