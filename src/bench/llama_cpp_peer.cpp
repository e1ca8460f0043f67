#include "bench/llama_cpp_peer.h"

#include "core/error.h"
#include "core/mapped_file.h"

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

// The calling thread's CPU mask, opened to every CPU of the machine while this object lives: the CPU
// backend pins its team's master thread (usually this one) to one CPU, and a child inherits the
// calling thread's mask, so llama-bench would run all its threads on that one CPU. The kernel keeps
// the result inside the process's cpuset.
class WholeMachineAffinity {
 public:
  WholeMachineAffinity() {
    saved_ok_ = sched_getaffinity(0, sizeof saved_, &saved_) == 0;
    cpu_set_t every;
    CPU_ZERO(&every);
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &every);
    sched_setaffinity(0, sizeof every, &every);  // a failure leaves the mask as it was
  }
  ~WholeMachineAffinity() {
    if (saved_ok_) sched_setaffinity(0, sizeof saved_, &saved_);
  }
  WholeMachineAffinity(const WholeMachineAffinity&) = delete;
  WholeMachineAffinity& operator=(const WholeMachineAffinity&) = delete;

 private:
  cpu_set_t saved_{};
  bool saved_ok_ = false;
};

// llama-bench's --cpu-mask for its threads on the first `threads` CPUs of the calling thread's mask,
// as the CPU backend pins its team (thread t on the t-th allowed CPU; backend/cpu/cpu_backend.cpp);
// empty where there are fewer CPUs or they lie past the first 64.
std::string cpu_mask(int threads) {
  cpu_set_t allowed;
  if (threads <= 0 || sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < threads) return "";
  uint64_t mask = 0;
  for (int c = 0, taken = 0; taken < threads; ++c) {
    if (c >= 64) return "";
    if (CPU_ISSET(c, &allowed)) mask |= uint64_t{1} << c, ++taken;
  }
  return fmt::format("0x{:x}", mask);
}

}  // namespace

nlohmann::json run_llama_bench(const LlamaBenchRequest& request) {
  SF_CHECK(std::filesystem::exists(request.llama_bench), "llama-bench '{}' does not exist (bench/build_llama_cpp.sh builds it)",
           request.llama_bench);
  WholeMachineAffinity whole_machine;
  const std::string mask = cpu_mask(request.threads);
  // Two runs: the prompt from an empty cache, then the decode at a depth of the prompt's tokens
  // (-d), as splitflow's decode steps run after the prompt. (llama-bench's -n alone decodes from
  // an empty cache: at a 2K prompt that compared our decode at 2K tokens of context with its at 0.)
  const auto command_for = [&](const std::string& test) {
    return fmt::format("{} -m {} -t {} {} -r {} -ngl {}{} -o json 2>/dev/null", shell_quote(request.llama_bench),
                       shell_quote(request.model_path), request.threads, test, request.repetitions, request.gpu_layers,
                       mask.empty() ? "" : fmt::format(" -C {} --cpu-strict 1", mask));
  };
  const std::string prefill_command = command_for(fmt::format("-p {} -n 0", request.prompt_tokens));
  const std::string decode_command =
      command_for(fmt::format("-p 0 -n {} -d {}", request.generated_tokens, request.prompt_tokens));
  nlohmann::json peer = {{"tool", "llama-bench"},
                         {"command", prefill_command + "; " + decode_command},
                         {"gpu_layers", request.gpu_layers},
                         {"decode_depth", request.prompt_tokens}};
  // What bench/build_llama_cpp.sh built (llama-bench's own build number is git's, and the source
  // package has no repository of its own).
  const std::filesystem::path source = std::filesystem::path(request.llama_bench).parent_path() / "BUILD_SOURCE";
  if (std::filesystem::exists(source)) {
    std::string text = read_text_file(source.string());
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    peer["source"] = text;
  }
  for (const std::string& command : {prefill_command, decode_command}) {
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
    SF_CHECK(pipe != nullptr, "cannot run '{}'", command);
    std::string output;
    char buffer[4096];
    while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe.get())) output.append(buffer, n);
    const int status = pclose(pipe.release());
    SF_CHECK(status == 0, "'{}' failed (status {}): {}", command, status, output.substr(0, 400));
    const nlohmann::json runs = nlohmann::json::parse(output, nullptr, false);
    SF_CHECK(runs.is_array() && !runs.empty(), "'{}' printed no JSON result: {}", command, output.substr(0, 400));
    for (const auto& run : runs) {
      peer["build"] = fmt::format("b{} ({})", run.value("build_number", 0), run.value("build_commit", ""));
      peer["threads"] = run.value("n_threads", 0);
      const char* kind = run.value("n_gen", 0) > 0 ? "decode" : "prefill";
      peer[fmt::format("{}_tokens_per_s", kind)] = run.value("avg_ts", 0.0);
      peer[fmt::format("{}_stddev", kind)] = run.value("stddev_ts", 0.0);
    }
  }
  SF_CHECK(peer.contains("decode_tokens_per_s") && peer.contains("prefill_tokens_per_s"),
           "'{}' did not report both a prompt and a generation run", peer["command"].get<std::string>());
  return peer;
}

}  // namespace splitflow::bench
