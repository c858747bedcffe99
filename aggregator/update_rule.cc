#include "update_rule.h"

#include <cblas.h>

#include <cmath>

namespace blkps {
namespace {

// w -= lr * g
class SgdRule final : public UpdateRule {
 public:
  explicit SgdRule(float lr) : lr_(lr) {}
  const char* name() const override { return "sgd"; }
  size_t state_bytes_per_param() const override { return 0; }
  void Apply(uint64_t, float* w, const float* g, size_t n) override {
    cblas_saxpy(static_cast<blasint>(n), -lr_, g, 1, w, 1);
  }

 private:
  const float lr_;
};

}  // namespace

Status MakeUpdateRule(const RuleOptions& opts, uint64_t /*num_params*/,
                      std::unique_ptr<UpdateRule>* out) {
  if (!std::isfinite(opts.lr) || opts.lr <= 0) {
    return Status::InvalidArgument("lr: expected a finite number > 0, got " +
                                   std::to_string(opts.lr));
  }
  if (opts.name == "sgd") {
    *out = std::make_unique<SgdRule>(opts.lr);
    return Status::OK();
  }
  return Status::InvalidArgument("rule: unknown update rule '" + opts.name +
                                 "' (known: " + kUpdateRuleNames + ")");
}

}  // namespace blkps
