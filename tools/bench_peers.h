// mha-bench --compare: times peer libraries (PyTorch, ONNX Runtime, OpenVINO, through
// tools/peers.py) on the weights, inputs and shape of a case mha just measured.
#ifndef MHA_TOOLS_BENCH_PEERS_H_
#define MHA_TOOLS_BENCH_PEERS_H_

#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "tools/bench_args.h"
#include "tools/bench_report.h"
#include "tools/bench_workload.h"

namespace mha {
namespace bench {

// A bf16 peer's output is compared with mha's f32 output at this bound: bf16 keeps 8
// significant bits (relative rounding 2^-9 ~ 2e-3 per operand) in inputs, weights and
// intermediates of three chained products; f32 peers use --tolerance.
inline constexpr double kBf16PeerTolerance = 5e-2;

class PeerComparison {
 public:
  // Resolves the interpreter and the script (see --help) and makes a temporary directory for
  // the data files.
  explicit PeerComparison(const BenchOptions& options);
  ~PeerComparison();
  PeerComparison(const PeerComparison&) = delete;
  PeerComparison& operator=(const PeerComparison&) = delete;

  // Times every peer of options.compare on `w` with `threads` threads, one process each, and
  // fills result->peers (a peer that did not run gets a note). `status` shows progress, ""
  // clears it. Notes go to stderr, each text once; nothing here is fatal: mha's figures stand
  // on their own.
  void Run(const Workload& w, size_t threads,
           const std::function<void(const std::string&)>& status, CaseResult* result);

  // The peers' versions and precisions as reported so far (by peer name), and the interpreter.
  void Describe(RunHeader* header) const;

 private:
  // Writes the weights, inputs and mha's output of `w` to data_path_; false after a note.
  bool WriteData(const Workload& w);
  void Note(const std::string& text);

  const BenchOptions& options_;
  std::string python_, script_;
  std::string dir_, data_path_;  // dir_ empty: no temporary directory
  bool usable_ = true;           // false: python, script or directory missing (one note)
  std::set<std::string> unavailable_;  // peers that said they cannot run any case
  std::set<std::string> notes_;
  std::map<std::string, std::string> versions_, precisions_;
};

}  // namespace bench
}  // namespace mha

#endif  // MHA_TOOLS_BENCH_PEERS_H_
