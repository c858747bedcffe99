// train_digits: a C++ learner that trains a small MLP on the digits data set
// through a blkps model device, with libblkps's double-buffered engine.
//
//   blkps-train-digits --params                  print the parameter count
//   blkps-train-digits --target URL [--learner K --learners N] [--epochs E]
//                      [--batch B] [--hidden H] [--no-double-buffering]
//                      [--no-adaptive-pull] [--control URL] [--sync]
//   blkps-train-digits --target URL --evaluate [--min-accuracy A]
//
// Every iteration computes a minibatch gradient with OpenBLAS on the weights
// the engine hands out, and Step() gives the gradient to the engine: its
// communication threads push it and pull the next weights while the next
// minibatch is computed. The server applies w -= lr * g (or its rule).
//
// The model and its flat layout are those of learner/examples/train_digits.py
// (64 -> hidden (ReLU) -> 10 (softmax); W1 64 x hidden, b1, W2 hidden x 10,
// b2, row-major), so the two learners can share one model. The data is the
// UCI digits file that Debian's python3-sklearn ships (1797 8x8 images);
// image i is a test image when i % 4 == 3, else a training image, and learner
// K of N trains on every N-th training image starting at K.

#include <cblas.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "blkps/engine.hpp"
#include "blkps/model.hpp"

namespace {

constexpr int kInputs = 64;
constexpr int kClasses = 10;
constexpr const char* kDigitsFile = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "train_digits: %s\n", message.c_str());
  std::exit(1);
}

// Images scaled to [0, 1], row-major (count x 64), and their labels.
struct Examples {
  std::vector<float> pixels;
  std::vector<int> labels;
  size_t count() const { return labels.size(); }
  const float* image(size_t i) const { return &pixels[i * kInputs]; }
};

// Reads the gzipped CSV (64 pixel values 0..16, then the label, per line).
void LoadDigits(Examples* train, Examples* test) {
  gzFile file = gzopen(kDigitsFile, "rb");
  if (file == nullptr) {
    Die(std::string("cannot open ") + kDigitsFile + " (install python3-sklearn: scripts/setup.sh)");
  }
  char line[1024];
  for (size_t i = 0; gzgets(file, line, sizeof(line)) != nullptr; ++i) {
    Examples* into = (i % 4 == 3) ? test : train;
    char* at = line;
    for (int c = 0; c <= kInputs; ++c) {
      char* end = nullptr;
      long value = std::strtol(at, &end, 10);
      if (end == at) Die("malformed line " + std::to_string(i + 1) + " in " + kDigitsFile);
      if (c < kInputs) {
        into->pixels.push_back(static_cast<float>(value) / 16.0f);
      } else {
        into->labels.push_back(static_cast<int>(value));
      }
      at = (*end == ',') ? end + 1 : end;
    }
  }
  gzclose(file);
  if (train->count() == 0) Die(std::string("no images in ") + kDigitsFile);
}

// The MLP over a flat parameter vector; scratch buffers sized for one batch.
class Mlp {
 public:
  explicit Mlp(int hidden) : hidden_(hidden) {}

  uint64_t num_params() const {
    return uint64_t(kInputs) * hidden_ + hidden_ + uint64_t(hidden_) * kClasses + kClasses;
  }

  // Forward pass over `n` images; fills hidden_act_ and probs_.
  void Forward(const float* w, const float* x, int n) {
    const float* w1 = w;
    const float* b1 = w1 + kInputs * hidden_;
    const float* w2 = b1 + hidden_;
    const float* b2 = w2 + hidden_ * kClasses;
    hidden_act_.resize(size_t(n) * hidden_);
    probs_.resize(size_t(n) * kClasses);
    for (int i = 0; i < n; ++i) std::copy(b1, b1 + hidden_, &hidden_act_[size_t(i) * hidden_]);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hidden_, kInputs, 1.0f, x, kInputs, w1, hidden_, 1.0f,
                hidden_act_.data(), hidden_);
    for (float& h : hidden_act_) h = std::max(h, 0.0f);
    for (int i = 0; i < n; ++i) std::copy(b2, b2 + kClasses, &probs_[size_t(i) * kClasses]);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, kClasses, hidden_, 1.0f, hidden_act_.data(), hidden_, w2,
                kClasses, 1.0f, probs_.data(), kClasses);
    for (int i = 0; i < n; ++i) {
      float* p = &probs_[size_t(i) * kClasses];
      const float top = *std::max_element(p, p + kClasses);
      float sum = 0;
      for (int c = 0; c < kClasses; ++c) sum += (p[c] = std::exp(p[c] - top));
      for (int c = 0; c < kClasses; ++c) p[c] /= sum;
    }
  }

  // Mean cross-entropy gradient of the batch into `grad` (num_params floats);
  // returns the batch loss and adds the correctly classified count to *correct.
  float LossAndGradient(const float* w, const float* x, const int* y, int n, float* grad, int* correct) {
    Forward(w, x, n);
    const float* w2 = w + kInputs * hidden_ + hidden_;
    float* dw1 = grad;
    float* db1 = dw1 + kInputs * hidden_;
    float* dw2 = db1 + hidden_;
    float* db2 = dw2 + hidden_ * kClasses;
    float loss = 0;
    dlogits_.assign(probs_.begin(), probs_.end());
    for (int i = 0; i < n; ++i) {
      float* d = &dlogits_[size_t(i) * kClasses];
      loss -= std::log(d[y[i]] + 1e-12f);
      *correct += (std::max_element(d, d + kClasses) - d) == y[i];
      d[y[i]] -= 1.0f;
      for (int c = 0; c < kClasses; ++c) d[c] /= float(n);
    }
    // dW2 = H^T dlogits; db2 = column sums of dlogits.
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hidden_, kClasses, n, 1.0f, hidden_act_.data(), hidden_,
                dlogits_.data(), kClasses, 0.0f, dw2, kClasses);
    ColumnSums(dlogits_.data(), n, kClasses, db2);
    // dH = dlogits W2^T, masked by the ReLU; dW1 = X^T dH; db1 = column sums.
    dhidden_.resize(size_t(n) * hidden_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, hidden_, kClasses, 1.0f, dlogits_.data(), kClasses, w2,
                kClasses, 0.0f, dhidden_.data(), hidden_);
    for (size_t k = 0; k < dhidden_.size(); ++k) {
      if (hidden_act_[k] <= 0) dhidden_[k] = 0;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kInputs, hidden_, n, 1.0f, x, kInputs, dhidden_.data(),
                hidden_, 0.0f, dw1, hidden_);
    ColumnSums(dhidden_.data(), n, hidden_, db1);
    return loss / float(n);
  }

  double Accuracy(const float* w, const Examples& data) {
    Forward(w, data.pixels.data(), int(data.count()));
    size_t right = 0;
    for (size_t i = 0; i < data.count(); ++i) {
      const float* p = &probs_[i * kClasses];
      right += (std::max_element(p, p + kClasses) - p) == data.labels[i];
    }
    return double(right) / double(data.count());
  }

 private:
  static void ColumnSums(const float* m, int rows, int cols, float* out) {
    std::fill(out, out + cols, 0.0f);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) out[c] += m[size_t(r) * cols + c];
    }
  }

  const int hidden_;
  std::vector<float> hidden_act_, probs_, dlogits_, dhidden_;
};

struct Args {
  std::string target, control;
  int learner = 0, learners = 1, epochs = 20, batch = 32, hidden = 128;
  bool params = false, evaluate = false, sync = false, start_gate = false;
  bool double_buffering = true, adaptive_pull = true;
  double min_accuracy = -1;
};

void Usage(FILE* out) {
  std::fprintf(out, "usage: blkps-train-digits --target URL [options]   train (one learner)\n"
                    "       blkps-train-digits --target URL --evaluate [--min-accuracy A]\n"
                    "       blkps-train-digits --params                  print the parameter count\n"
                    "  --target URL            model device: iscsi://, iser://, layout:, file or block device\n"
                    "  --learner K --learners N  this learner's index and the number of learners (0, 1)\n"
                    "  --epochs E --batch B    passes over this learner's data (20), minibatch size (32)\n"
                    "  --hidden H              hidden units (128); must match the server's params\n"
                    "  --no-double-buffering   push then pull while compute waits (the baseline)\n"
                    "  --no-adaptive-pull      start each pull at once instead of after the bubble\n"
                    "  --control URL           the model's control LUN: metrics include staleness\n"
                    "  --sync                  fsync the device when done: the server checkpoints\n"
                    "  --start-gate            once the model is open, print 'learner K: ready' and wait for a\n"
                    "                          line on stdin before training (blkps demo starts learners so)\n");
}

int ParseInt(const char* flag, const char* value, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v < lo || v > hi) {
    Die(std::string(flag) + " wants an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not '" +
        value + "'");
  }
  return int(v);
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) Die(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--target") a.target = value();
    else if (flag == "--control") a.control = value();
    else if (flag == "--learner") a.learner = ParseInt("--learner", value(), 0, 1 << 20);
    else if (flag == "--learners") a.learners = ParseInt("--learners", value(), 1, 1 << 20);
    else if (flag == "--epochs") a.epochs = ParseInt("--epochs", value(), 1, 1 << 20);
    else if (flag == "--batch") a.batch = ParseInt("--batch", value(), 1, 1 << 16);
    else if (flag == "--hidden") a.hidden = ParseInt("--hidden", value(), 1, 1 << 16);
    else if (flag == "--min-accuracy") a.min_accuracy = std::atof(value());
    else if (flag == "--params") a.params = true;
    else if (flag == "--evaluate") a.evaluate = true;
    else if (flag == "--sync") a.sync = true;
    else if (flag == "--start-gate") a.start_gate = true;
    else if (flag == "--no-double-buffering") a.double_buffering = false;
    else if (flag == "--no-adaptive-pull") a.adaptive_pull = false;
    else if (flag == "-h" || flag == "--help") {
      Usage(stdout);
      std::exit(0);
    } else {
      Usage(stderr);
      Die("unknown option '" + flag + "'");
    }
  }
  if (!a.params && a.target.empty()) Die("--target is required (see --help)");
  if (a.learner >= a.learners) Die("--learner must be below --learners");
  return a;
}

int Evaluate(const Args& args, Mlp& mlp, const Examples& test) {
  std::string error;
  auto model = blkps::Model::Open(args.target, blkps::OpenOptions(), &error);
  if (!model) Die(error);
  std::vector<float> w(mlp.num_params());
  if (model->Pull(0, w.data(), w.size()) != 0) Die(model->last_error());
  if (!std::all_of(w.begin(), w.end(), [](float v) { return std::isfinite(v); })) {
    Die("the model holds NaN or infinite weights");
  }
  const double accuracy = mlp.Accuracy(w.data(), test);
  std::printf("held-out test accuracy: %.4f (%zu images)\n", accuracy, test.count());
  if (accuracy < args.min_accuracy) {
    Die("test accuracy below --min-accuracy " + std::to_string(args.min_accuracy));
  }
  return 0;
}

int Train(const Args& args, Mlp& mlp, const Examples& train) {
  // This learner's share of the training images.
  std::vector<size_t> mine;
  for (size_t i = args.learner; i < train.count(); i += args.learners) mine.push_back(i);
  // Equal iterations for every learner: in bsp one that stopped early would
  // hold the others back until the server declared it dead.
  const int steps_per_epoch = std::max<int>(1, int(train.count() / args.learners / args.batch));

  blkps::EngineOptions options;
  options.param_count = mlp.num_params();
  options.double_buffering = args.double_buffering;
  options.adaptive_pull = args.adaptive_pull;
  options.control_target = args.control;
  std::string error;
  auto engine = blkps::Engine::Open(args.target, options, &error);
  if (!engine) Die(error);
  // The start gate, as digits_mlp.py's wait_at_start_gate: no learner
  // trains alone while another is still starting.
  if (args.start_gate) {
    std::printf("learner %d: ready\n", args.learner);
    std::fflush(stdout);
    char line[64];
    if (!std::fgets(line, sizeof line, stdin)) Die("the start gate closed (stdin ended) before the start");
  }

  std::mt19937 rng(1000 + args.learner);
  std::vector<float> batch_x(size_t(args.batch) * kInputs);
  std::vector<int> batch_y(args.batch);
  const int total_steps = args.epochs * steps_per_epoch;
  int step = 0;
  for (int epoch = 1; epoch <= args.epochs; ++epoch) {
    std::shuffle(mine.begin(), mine.end(), rng);
    double loss_sum = 0, compute_s = 0, stall_s = 0, iteration_s = 0;
    int correct = 0, seen = 0;
    for (int b = 0; b < steps_per_epoch; ++b) {
      int n = 0;
      for (; n < args.batch; ++n) {
        const size_t at = size_t(b * args.batch + n) % mine.size();
        std::memcpy(&batch_x[size_t(n) * kInputs], train.image(mine[at]), kInputs * sizeof(float));
        batch_y[n] = train.labels[mine[at]];
      }
      loss_sum +=
          n * mlp.LossAndGradient(engine->weights(), batch_x.data(), batch_y.data(), n, engine->gradient(), &correct);
      seen += n;
      ++step;
      // The last gradient goes out with Finish(), which pushes the current
      // gradient and pulls no more weights.
      if (step == total_steps) {
        if (engine->Finish() != 0) Die(engine->last_error());
        break;
      }
      if (engine->Step() != 0) Die(engine->last_error());
      const blkps::IterationMetrics& m = engine->last_metrics();
      compute_s += m.compute_s;
      stall_s += m.stall_s;
      iteration_s += m.compute_s + m.stall_s;
    }
    std::printf("learner %d: epoch %3d iteration %5d loss %.4f train-accuracy %.3f "
                "compute %.2f ms stall %.1f%% of iteration time\n",
                args.learner, epoch, step, loss_sum / seen, double(correct) / seen, 1e3 * compute_s / steps_per_epoch,
                iteration_s > 0 ? 100.0 * stall_s / iteration_s : 0.0);
    std::fflush(stdout);
  }
  if (args.sync) {
    auto model = blkps::Model::Open(args.target, blkps::OpenOptions(), &error);
    if (!model || model->Sync() != 0) Die(model ? model->last_error() : error);
    std::printf("learner %d: checkpointed the model (fsync)\n", args.learner);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Whole lines, each written when done: learners sharing a terminal or a
  // pipe must not run their progress lines together (a pipe is otherwise
  // block-buffered and cut anywhere).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Args args = ParseArgs(argc, argv);
  Mlp mlp(args.hidden);
  if (args.params) {
    std::printf("%llu\n", static_cast<unsigned long long>(mlp.num_params()));
    return 0;
  }
  Examples train, test;
  LoadDigits(&train, &test);
  return args.evaluate ? Evaluate(args, mlp, test) : Train(args, mlp, train);
}
