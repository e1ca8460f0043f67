#include "comm/file_store.h"

#include "core/error.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace splitflow::comm {

namespace fs = std::filesystem;

namespace {

// Names starting with '.' belong to the store itself (temporary files, finish marks), so no key a
// caller picks can collide with them.
void check_key(const std::string& key) {
  SF_CHECK(!key.empty() && key[0] != '.', "file store: empty key, or key '{}' starts with '.' (reserved for the store)",
           key);
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.';
    SF_CHECK(ok, "file store: key '{}' has a character outside [A-Za-z0-9._-]", key);
  }
}

}  // namespace

FileStore::FileStore(std::string dir, int rank, int world_size, std::chrono::milliseconds timeout)
    : dir_(std::move(dir)), rank_(rank), world_size_(world_size), timeout_(timeout) {
  SF_CHECK(!dir_.empty(), "file store: empty directory");
  SF_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "file store: rank {} of world size {}", rank,
           world_size);
  std::error_code error;
  fs::create_directories(dir_, error);
  SF_CHECK(fs::is_directory(dir_), "file store: cannot create directory '{}': {}", dir_, error.message());
}

std::string FileStore::path(const std::string& key) const {
  check_key(key);
  return dir_ + "/" + key;
}

std::string FileStore::finish_mark(int rank) const { return dir_ + "/.finished." + std::to_string(rank); }

void FileStore::set(const std::string& key, const std::string& value) { write(path(key), value); }

std::string FileStore::get(const std::string& key) const { return wait_read(path(key), key); }

void FileStore::write(const std::string& final_path, const std::string& value) {
  // The temporary name is unique per writer, and rename() is atomic within a directory.
  const std::string tmp_path =
      dir_ + "/.tmp." + fs::path(final_path).filename().string() + "." + std::to_string(::getpid());
  {
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    SF_CHECK(out.good(), "file store: cannot write '{}'", tmp_path);
  }
  std::error_code error;
  fs::rename(tmp_path, final_path, error);
  SF_CHECK(!error, "file store: cannot rename '{}' to '{}': {}", tmp_path, final_path, error.message());
}

std::string FileStore::wait_read(const std::string& file, const std::string& key) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  auto pause = std::chrono::microseconds(50);
  while (true) {
    std::ifstream in(file, std::ios::binary);
    if (in) {
      std::ostringstream value;
      value << in.rdbuf();
      return value.str();
    }
    SF_CHECK(std::chrono::steady_clock::now() < deadline,
             "file store: rank {} waited {} ms for key '{}' in '{}' (did every rank start, with the same store?)", rank_,
             timeout_.count(), key, dir_);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

std::vector<std::string> FileStore::allgather(const std::string& name, const std::string& value) {
  set(name + "." + std::to_string(rank_), value);
  std::vector<std::string> values(world_size_);
  for (int r = 0; r < world_size_; ++r) values[r] = r == rank_ ? value : get(name + "." + std::to_string(r));
  return values;
}

std::string FileStore::broadcast(const std::string& name, const std::string& value) {
  if (rank_ == 0) {
    set(name, value);
    return value;
  }
  return get(name);
}

void FileStore::barrier(const std::string& name) { allgather(name, ""); }

void FileStore::finish() {
  write(finish_mark(rank_), "");
  if (rank_ != 0) return;
  for (int r = 1; r < world_size_; ++r) wait_read(finish_mark(r), "finish mark of rank " + std::to_string(r));
  std::error_code error;
  fs::remove_all(dir_, error);
}

}  // namespace splitflow::comm
