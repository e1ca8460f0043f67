// comm/launch_env.h — who this process is in a multi-process job: rank, world size, local rank and
// the rendezvous directory, read from the variables a launcher sets. Owns only the parsing; it
// never starts processes (comm/local_launcher.h does) and never touches a GPU.
//
// Launchers recognised, first match wins:
//   SPLITFLOW_RANK / SPLITFLOW_WORLD_SIZE / SPLITFLOW_LOCAL_RANK   (splitflow's own launcher)
//   RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE               (torchrun and alike)
//   OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE        (OpenMPI's mpirun)
//   PMI_RANK / PMI_SIZE / MPI_LOCALRANKID / MPI_LOCALNRANKS         (MPICH's Hydra)
//   SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID                     (srun)
// With none of them the process is rank 0 of a world of 1.
#pragma once

#include <map>
#include <string>

namespace splitflow::comm {

using EnvMap = std::map<std::string, std::string>;

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // index among the ranks of this node: the GPU this rank drives
  int local_world_size = 1;  // ranks on this node
  std::string launcher;      // "splitflow", "torchrun", "openmpi", "mpich", "slurm" or "none"
  // Directory the ranks of one job share to exchange bootstrap data (comm/file_store.h):
  // SPLITFLOW_COMM_STORE when set, else ${TMPDIR:-/tmp}/splitflow-comm-<job key> where the job key
  // comes from the launcher (PMIx namespace, OpenMPI job id, torchrun run id + master port, Slurm
  // job and step); empty for a world of 1 without a job key.
  std::string store_dir;
};

// Parses `env` (names above). Throws splitflow::Error naming the variable when a value is not a
// non-negative integer, when a rank variable comes without its world size (or the reverse), when
// rank >= world size, or when a multi-rank job has no store directory and no job key.
LaunchInfo parse_launch_env(const EnvMap& env);

// The current process environment as an EnvMap.
EnvMap current_environment();

}  // namespace splitflow::comm
