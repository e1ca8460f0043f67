#include "embedding/pooling.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace splitflow {

std::vector<float> pool_states(std::span<const float> states, int64_t tokens, int64_t hidden, Pooling pooling) {
  SF_CHECK(tokens >= 1 && hidden >= 1 && static_cast<int64_t>(states.size()) == tokens * hidden,
           "pooling: {} values are not [{} tokens, {}]", states.size(), tokens, hidden);
  switch (pooling) {
    case Pooling::Cls: return {states.begin(), states.begin() + hidden};
    case Pooling::Last: return {states.end() - hidden, states.end()};
    case Pooling::Mean: {
      std::vector<double> sum(static_cast<size_t>(hidden), 0.0);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t i = 0; i < hidden; ++i) sum[i] += states[t * hidden + i];
      std::vector<float> out(static_cast<size_t>(hidden));
      for (int64_t i = 0; i < hidden; ++i) out[i] = static_cast<float>(sum[i] / static_cast<double>(tokens));
      return out;
    }
  }
  fail("pooling: unknown mode");
}

void l2_normalize(std::span<float> x) {
  double squares = 0.0;
  for (const float v : x) squares += static_cast<double>(v) * v;
  const double norm = std::max(std::sqrt(squares), 1e-12);
  for (float& v : x) v = static_cast<float>(v / norm);
}

std::vector<float> truncate_dimensions(std::span<const float> x, int64_t dimensions) {
  SF_CHECK(dimensions >= 1 && dimensions <= static_cast<int64_t>(x.size()),
           "dimensions: {} is outside [1, {}] (the model's embedding size)", dimensions, x.size());
  std::vector<float> out(x.begin(), x.begin() + dimensions);
  l2_normalize(out);
  return out;
}

}  // namespace splitflow
