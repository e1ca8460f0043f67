// comm/file_store.h — the bootstrap channel of one job: a directory every rank can see, where a
// rank publishes small byte strings (NCCL's unique id, CUDA IPC handles, topology views) under a
// key and the others wait for them. Writes are atomic (temporary file + rename), so a reader
// never sees half a value. It carries start-up data only, never tensors, and holds no GPU state.
//
// Keys are single path components of [A-Za-z0-9._-] not starting with '.' (names the store keeps
// for itself); every collective call (allgather, barrier) takes a name that must be unique within
// the job and identical on all ranks.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace splitflow::comm {

class FileStore {
 public:
  // Creates `dir` if missing. `timeout` bounds every wait; a rank that waits longer throws.
  FileStore(std::string dir, int rank, int world_size, std::chrono::milliseconds timeout = std::chrono::seconds(120));

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::string& dir() const { return dir_; }

  void set(const std::string& key, const std::string& value);
  // Waits until `key` exists, then returns its value. Throws splitflow::Error naming the key, the
  // directory and the timeout when it does not appear in time.
  std::string get(const std::string& key) const;
  // Rank r publishes `value` as <name>.r; returns every rank's value in rank order.
  std::vector<std::string> allgather(const std::string& name, const std::string& value);
  // Rank 0's `value` (ignored on other ranks) on every rank.
  std::string broadcast(const std::string& name, const std::string& value);
  void barrier(const std::string& name);
  // Last call of a job: every rank announces it is done; rank 0 waits for all (bounded by the
  // timeout) and removes the directory. No rank may use the store afterwards.
  void finish();

 private:
  std::string path(const std::string& key) const;  // checks the key
  std::string finish_mark(int rank) const;
  void write(const std::string& file, const std::string& value);
  // Waits until `file` exists, then returns its contents; `key` names it in the timeout's message.
  std::string wait_read(const std::string& file, const std::string& key) const;

  std::string dir_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
};

}  // namespace splitflow::comm
