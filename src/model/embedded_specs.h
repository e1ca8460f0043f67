// model/embedded_specs.h — the models/*.json spec templates, compiled in (cmake/EmbedSpecs.cmake).
#pragma once

#include <string_view>
#include <vector>

namespace splitflow {

struct EmbeddedSpec {
  std::string_view name;   // file name without .json ("llama")
  std::string_view json;   // file contents
};

const std::vector<EmbeddedSpec>& embedded_specs();

}  // namespace splitflow
