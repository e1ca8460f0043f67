// backend/cpu/thread_team.h — the threads that run the CPU backend's hot kernels (GEMV, GEMM,
// attention): per calling thread, a team of num_threads - 1 workers pinned to distinct CPUs, which
// spin between jobs for a while before sleeping, so a decode step's hundreds of kernels start
// without waking anyone. A job is a count of chunks taken one at a time from a shared counter; the
// caller takes chunks too and returns once every chunk is done, without waiting for workers that
// have not woken up (on a loaded machine a descheduled worker costs its chunk, never a time slice
// per kernel; OpenMP's team barrier did: docs/cpu.md).
// Must never: run a chunk twice or not at all, let a late worker touch a later job's chunks, or be
// shared between threads (each calling thread has its own team).
#pragma once

#include <cstdint>
#include <functional>

namespace splitflow::cpu {

// Calls body(chunk) for every chunk in [0, chunks), on the calling thread's team of num_threads
// (1: inline). Returns when all are done; body's writes are visible to the caller then. body may
// run on any team thread, so per-thread scratch must be thread_local.
void parallel_chunks(int num_threads, int64_t chunks, const std::function<void(int64_t)>& body);

// Calls body(begin, end) over contiguous ranges covering [0, count) on the team: about four ranges
// per thread (the counter balances them; each call covers many items), one range inline when
// `parallel` is false (work too small to be worth waking the team for). The row-wise kernels
// (norms, RoPE, activations) use it so that the whole step runs on one set of threads: an OpenMP
// team beside this one spins on the same CPUs the team's workers need.
void parallel_ranges(int num_threads, int64_t count, bool parallel,
                     const std::function<void(int64_t begin, int64_t end)>& body);

// Whether teams pin their threads (set once, before the first parallel_chunks of a thread; in-process
// parallel jobs turn it off so their teams do not stack on the same CPUs).
void set_team_pinning(bool on);

}  // namespace splitflow::cpu
