#include "bench/llama_cpp_peer.h"

#include "core/error.h"

#include <fmt/format.h>

#include <sched.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>

namespace splitflow::bench {
namespace {

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// llama-bench's --cpu-mask for its threads on the first `threads` CPUs this process may use, as the
// CPU backend pins its team (backend/cpu/cpu_backend.h); empty where there are fewer CPUs.
std::string cpu_mask(int threads) {
  cpu_set_t allowed;
  if (threads <= 0 || sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < threads) return "";
  uint64_t mask = 0;
  for (int c = 0, taken = 0; taken < threads; ++c) {
    if (c >= 64) return "";  // past one 64-bit word: left unpinned
    if (CPU_ISSET(c, &allowed)) mask |= uint64_t{1} << c, ++taken;
  }
  return fmt::format("0x{:x}", mask);
}

}  // namespace

nlohmann::json run_llama_bench(const LlamaBenchRequest& request) {
  SF_CHECK(std::filesystem::exists(request.llama_bench), "llama-bench '{}' does not exist (bench/build_llama_cpp.sh builds it)",
           request.llama_bench);
  const std::string command = fmt::format(
      "{} -m {} -t {} -p {} -n {} -r {} -ngl {} -o json 2>/dev/null", shell_quote(request.llama_bench),
      shell_quote(request.model_path), request.threads, request.prompt_tokens, request.generated_tokens,
      request.repetitions, request.gpu_layers);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  SF_CHECK(pipe != nullptr, "cannot run '{}'", command);
  std::string output;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe.get())) output.append(buffer, n);
  const int status = pclose(pipe.release());
  SF_CHECK(status == 0, "'{}' failed (status {}): {}", command, status, output.substr(0, 400));
  nlohmann::json runs = nlohmann::json::parse(output, nullptr, false);
  SF_CHECK(runs.is_array() && !runs.empty(), "'{}' printed no JSON result: {}", command, output.substr(0, 400));
  nlohmann::json peer = {{"tool", "llama-bench"}, {"command", command}, {"gpu_layers", request.gpu_layers}};
  for (const auto& run : runs) {
    peer["build"] = fmt::format("b{} ({})", run.value("build_number", 0), run.value("build_commit", ""));
    peer["threads"] = run.value("n_threads", 0);
    const char* kind = run.value("n_gen", 0) > 0 ? "decode" : "prefill";
    peer[fmt::format("{}_tokens_per_s", kind)] = run.value("avg_ts", 0.0);
    peer[fmt::format("{}_stddev", kind)] = run.value("stddev_ts", 0.0);
  }
  SF_CHECK(peer.contains("decode_tokens_per_s") && peer.contains("prefill_tokens_per_s"),
           "'{}' did not report both a prompt and a generation run", command);
  return peer;
}

}  // namespace splitflow::bench
