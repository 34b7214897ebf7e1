// mha-bench's shared plumbing (tools/bench_output.h).
#include "tools/bench_output.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace mha {
namespace bench {

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Progress::Progress() : enabled_(isatty(STDERR_FILENO) == 1) {}

void Progress::Show(const std::string& text) {
  if (!enabled_) return;
  std::fprintf(stderr, "\r\033[K%s", text.c_str());
  std::fflush(stderr);
  shown_ = true;
}

void Progress::ShowOrClear(const std::string& text) {
  if (text.empty()) {
    Clear();
  } else {
    Show(text);
  }
}

void Progress::Clear() {
  if (!enabled_ || !shown_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  shown_ = false;
}

std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

bool OpenOutput(const char* flag, const std::string& path, std::ofstream* out) {
  if (path.empty()) return true;
  out->open(path, std::ios::out | std::ios::trunc);
  if (!out->is_open()) {
    std::fprintf(stderr, "mha-bench: %s: expected a writable file, got '%s': %s\n", flag,
                 path.c_str(), std::strerror(errno));
    return false;
  }
  return true;
}

bool FinishOutput(const char* flag, const std::string& path, std::ofstream* out) {
  out->close();
  if (out->fail()) {
    std::fprintf(stderr, "mha-bench: %s: writing '%s' failed\n", flag, path.c_str());
    return false;
  }
  return true;
}

}  // namespace bench
}  // namespace mha
