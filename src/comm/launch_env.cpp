#include "comm/launch_env.h"

#include "core/error.h"

#include <charconv>
#include <optional>

extern char** environ;

namespace splitflow::comm {

namespace {

struct LauncherNames {
  const char* launcher;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr LauncherNames kLaunchers[] = {
    {"splitflow", "SPLITFLOW_RANK", "SPLITFLOW_WORLD_SIZE", "SPLITFLOW_LOCAL_RANK", "SPLITFLOW_LOCAL_WORLD_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    // SLURM_NTASKS_PER_NODE may read "2(x3)": the local world size is left to the default.
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

const std::string* find(const EnvMap& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

std::optional<int> read_int(const EnvMap& env, const char* name) {
  const std::string* text = name ? find(env, name) : nullptr;
  if (!text) return std::nullopt;
  int value = -1;
  const char* end = text->data() + text->size();
  auto [ptr, ec] = std::from_chars(text->data(), end, value);
  SF_CHECK(ec == std::errc() && ptr == end && value >= 0 && !text->empty(),
           "launch environment: {}='{}' is not a non-negative integer", name, *text);
  return value;
}

// Characters safe in a directory name; anything else becomes '_'.
std::string sanitize(const std::string& key) {
  std::string out = key;
  for (char& c : out) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                      c == '_' || c == '.';
    if (!safe) c = '_';
  }
  return out;
}

// A key that is the same for every rank of one job and differs between jobs.
std::string job_key(const EnvMap& env, const std::string& launcher) {
  if (const std::string* id = find(env, "SPLITFLOW_JOB_ID")) return *id;
  if (launcher == "openmpi") {
    for (const char* name : {"PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid"}) {
      if (const std::string* id = find(env, name)) return "ompi-" + *id;
    }
  }
  if (launcher == "torchrun") {
    const std::string* run_id = find(env, "TORCHELASTIC_RUN_ID");
    const std::string* port = find(env, "MASTER_PORT");
    if (run_id || port) return "torchrun-" + (run_id ? *run_id : std::string("none")) + "-" + (port ? *port : "0");
  }
  if (launcher == "slurm") {
    if (const std::string* job = find(env, "SLURM_JOB_ID")) {
      const std::string* step = find(env, "SLURM_STEP_ID");
      return "slurm-" + *job + "." + (step ? *step : "0");
    }
  }
  return "";
}

}  // namespace

LaunchInfo parse_launch_env(const EnvMap& env) {
  LaunchInfo info;
  info.launcher = "none";
  for (const LauncherNames& names : kLaunchers) {
    const std::optional<int> rank = read_int(env, names.rank);
    const std::optional<int> world_size = read_int(env, names.world_size);
    if (!rank && !world_size) continue;
    SF_CHECK(rank.has_value(), "launch environment: {} is set but {} is not", names.world_size, names.rank);
    SF_CHECK(world_size.has_value(), "launch environment: {} is set but {} is not", names.rank, names.world_size);
    SF_CHECK(*world_size >= 1, "launch environment: {}=0, a job needs at least one rank", names.world_size);
    SF_CHECK(*rank < *world_size, "launch environment: {}={} is not below {}={}", names.rank, *rank,
             names.world_size, *world_size);
    info.launcher = names.launcher;
    info.rank = *rank;
    info.world_size = *world_size;
    // Without a local rank the job is taken to run on one node.
    info.local_rank = read_int(env, names.local_rank).value_or(*rank);
    info.local_world_size = read_int(env, names.local_world_size).value_or(*world_size);
    SF_CHECK(info.local_world_size >= 1 && info.local_rank < info.local_world_size,
             "launch environment: {}={} is not below the local world size {}", names.local_rank, info.local_rank,
             info.local_world_size);
    break;
  }

  if (const std::string* dir = find(env, "SPLITFLOW_COMM_STORE")) {
    SF_CHECK(!dir->empty(), "launch environment: SPLITFLOW_COMM_STORE is empty");
    info.store_dir = *dir;
  } else if (const std::string key = job_key(env, info.launcher); !key.empty()) {
    const std::string* tmp = find(env, "TMPDIR");
    info.store_dir = (tmp && !tmp->empty() ? *tmp : std::string("/tmp")) + "/splitflow-comm-" + sanitize(key);
  } else {
    SF_CHECK(info.world_size == 1,
             "launch environment: {} ranks started by '{}' but no rendezvous directory: set SPLITFLOW_COMM_STORE "
             "to a directory all ranks share (or SPLITFLOW_JOB_ID to a key unique to this job)",
             info.world_size, info.launcher);
  }
  return info;
}

EnvMap current_environment() {
  EnvMap env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text = *entry;
    const size_t equals = text.find('=');
    if (equals == std::string::npos) continue;
    env.emplace(text.substr(0, equals), text.substr(equals + 1));
  }
  return env;
}

}  // namespace splitflow::comm
