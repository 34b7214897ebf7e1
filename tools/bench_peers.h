// mha-bench --compare: times peer libraries (PyTorch, ONNX Runtime, OpenVINO, through
// tools/peers.py) on the weights, inputs and shape of a case mha just measured.
#ifndef MHA_TOOLS_BENCH_PEERS_H_
#define MHA_TOOLS_BENCH_PEERS_H_

#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tools/bench_args.h"
#include "tools/bench_report.h"
#include "tools/bench_workload.h"

namespace mha {
namespace bench {

// A bf16 peer's output is compared with mha's f32 output at this bound: bf16 keeps 8
// significant bits (relative rounding 2^-9 ~ 2e-3 per operand) in inputs, weights and
// intermediates of three chained products; f32 peers use --tolerance. Peers that quantize the
// activations to int8 (ort-int8, 127 levels per block) are held to the same bound.
inline constexpr double kBf16PeerTolerance = 5e-2;

// One decode step for the peers (mha-bench --decode --compare): a layer with separate q/k/v
// weights in nn.Linear layout, the cache mha's step attended (context - 1 positions per entry
// and kv head before the step's own token), the step's input and mha's output; all f32.
struct DecodePeerCase {
  int64_t batch = 0, context = 0, embed = 0, heads = 0, kv_heads = 0;
  const float* q_weight = nullptr;    // [E, E]
  const float* k_weight = nullptr;    // [kv_heads * head_dim, E]
  const float* v_weight = nullptr;    // [kv_heads * head_dim, E]
  const float* in_bias = nullptr;     // [E + 2 * kv_heads * head_dim]: q, k, v
  const float* out_weight = nullptr;  // [E, E]
  const float* out_bias = nullptr;    // [E]
  // Cached position p of kv head g of entry n: head_dim values at keys (values) + n *
  // batch_stride + g * head_stride + p * head_dim.
  const float* keys = nullptr;
  const float* values = nullptr;
  int64_t batch_stride = 0, head_stride = 0;
  const float* x = nullptr;       // [batch, 1, E], the step's token
  const float* output = nullptr;  // [batch, 1, E], mha's output of the step
  // Quantized weights (tools/weights_dtype.h's name: "i8", "i4", "i4-128"), whose dequantized
  // values the weight arrays hold; empty for f32 and 16-bit weights.
  std::string quantized;
};

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
  // One decode step (tools/peers.py --decode), in two calls: WriteDecode writes the case's data
  // file (a note if it cannot), TimeDecode times every peer on it, each for its 1/rounds share
  // of --min-time and --min-runs (mha-bench --decode --rounds alternates mha's share and the
  // peers' on the file written once), and fills *peers by peer name.
  void WriteDecode(const DecodePeerCase& c);
  void TimeDecode(const DecodePeerCase& c, size_t threads, int64_t rounds,
                  const std::function<void(const std::string&)>& status,
                  std::map<std::string, PeerResult>* peers);

  // The peers' versions and precisions as reported so far (by peer name), and the interpreter.
  void Describe(RunHeader* header) const;

 private:
  // A tensor of the peers' data file: f32, dense.
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    const float* data;
  };
  // Writes `tensors` to data_path_; false after a note.
  bool WriteData(const std::vector<Tensor>& tensors);
  // Runs every peer of options.compare on the data file just written (`data_ok`: it was),
  // with `case_args` (tools/peers.py's --case or --decode) and `threads`, each for 1/rounds of
  // --min-time and --min-runs; `label` names the case in notes and progress.
  void RunPeers(bool data_ok, const std::string& label, const std::string& case_args,
                size_t threads, int64_t rounds,
                const std::function<void(const std::string&)>& status,
                std::map<std::string, PeerResult>* peers);
  void Note(const std::string& text);

  const BenchOptions& options_;
  std::string python_, script_;
  std::string dir_, data_path_;  // dir_ empty: no temporary directory
  bool usable_ = true;           // false: python, script or directory missing (one note)
  bool decode_data_ok_ = false;  // WriteDecode wrote the data file
  std::set<std::string> unavailable_;  // peers that said they cannot run any case
  std::set<std::string> notes_;
  std::map<std::string, std::string> versions_, precisions_;
};

}  // namespace bench
}  // namespace mha

#endif  // MHA_TOOLS_BENCH_PEERS_H_
