// mha-bench's plumbing shared by its suites: the status line on stderr, output files opened
// before a run, the runs cap and the percentile of sorted samples.
#ifndef MHA_TOOLS_BENCH_OUTPUT_H_
#define MHA_TOOLS_BENCH_OUTPUT_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace mha {
namespace bench {

// Measured runs per case stop here even before --min-time: bounds the sample memory for tiny
// cases with a long --min-time.
inline constexpr int64_t kMaxRuns = 1000000;

// Linear interpolation between closest ranks (numpy's default), p in [0, 1].
double Percentile(const std::vector<double>& sorted, double p);

// A status line on stderr, redrawn in place; only when stderr is a terminal, so logs and pipes
// get no carriage returns.
class Progress {
 public:
  Progress();
  void Show(const std::string& text);
  // Show(text), or Clear() for "" (the peers' status callback).
  void ShowOrClear(const std::string& text);
  // Erases the line before anything else is printed.
  void Clear();

 private:
  bool enabled_;
  bool shown_ = false;
};

// `text` with its line breaks turned into spaces: an error message stays one line on stderr.
std::string OneLine(std::string text);

// Opens an output file at start-up, so that a bad path fails before a long run, not after. An
// empty path is no file. Errors are printed, naming `flag`.
bool OpenOutput(const char* flag, const std::string& path, std::ofstream* out);
// Closes it; false (printed) if writing failed.
bool FinishOutput(const char* flag, const std::string& path, std::ofstream* out);

}  // namespace bench
}  // namespace mha

#endif  // MHA_TOOLS_BENCH_OUTPUT_H_
