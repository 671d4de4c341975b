// Two subjects that misbehave the way a broken kernel can, for the sweep's
// isolation tests (linked only into flashcheck-testing, registered as mutants
// so that `all` never includes them):
//   misbehave-crash  kills its process with SIGSEGV (an access violation);
//   misbehave-hang   never returns (a kernel stuck in a loop).
#include <signal.h>
#include <unistd.h>

#include "core/subject.hpp"

namespace flashcheck {
namespace {

inline constexpr Capabilities kSmallDomain = {
    .dtypes = {DType::f32},
    .min_head_dim = 1,
    .max_head_dim = 32,
    .max_head_dim_v = 32,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
};

class Misbehaving : public Subject {
 public:
  Misbehaving(std::string_view name, bool hang) : name_(name), hang_(hang) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override {
    return hang_ ? "never returns (tests the sweep's watchdog)" : "dies of SIGSEGV (tests the sweep's isolation)";
  }
  const Capabilities& capabilities() const override { return kSmallDomain; }
  RunResult run(const Problem& problem, const Inputs&) override {
    if (auto refused = refuse_outside(kSmallDomain, problem)) return *refused;
    if (hang_)
      while (true) ::pause();
    ::raise(SIGSEGV);
    return {};
  }

 private:
  std::string_view name_;
  bool hang_;
};

MutantRegistration crash([] { return std::make_unique<Misbehaving>("misbehave-crash", false); });
MutantRegistration hang([] { return std::make_unique<Misbehaving>("misbehave-hang", true); });

}  // namespace
}  // namespace flashcheck
