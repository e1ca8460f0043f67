// bench/llama_cpp_peer.h — llama.cpp's llama-bench run on the same model file, threads and token
// counts as a splitflow benchmark, in the same run, so results carry their peer (not a number
// copied from elsewhere). bench/build_llama_cpp.sh builds llama-bench. On the CPU its threads are
// pinned to the CPUs splitflow's team is pinned to (-C MASK --cpu-strict 1).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace splitflow::bench {

struct LlamaBenchRequest {
  std::string llama_bench;   // path to the llama-bench binary
  std::string model_path;    // a .gguf
  int threads = 0;
  int prompt_tokens = 512;   // llama-bench -p (prefill speed)
  int generated_tokens = 128;  // llama-bench -n (decode speed, at a depth -d of prompt_tokens)
  int repetitions = 3;
  int gpu_layers = 0;        // -ngl: layers on the GPU (99: all of them; 0: a CPU run)
};

// {"tool": "llama-bench", "build": ..., "prefill_tokens_per_s": ..., "decode_tokens_per_s": ...,
//  "prefill_stddev", "decode_stddev", "command": both runs', "decode_depth"}. Throws naming the command when it fails or
// prints no result (a model llama.cpp cannot load, a missing binary).
nlohmann::json run_llama_bench(const LlamaBenchRequest& request);

}  // namespace splitflow::bench
