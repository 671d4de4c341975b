// Three subjects that misbehave the way a broken kernel can, for the sweep's
// isolation tests (linked only into flashcheck-testing, registered as
// fixtures, so that neither `all` nor `mutants` includes them; the GPU
// variants are in misbehaving_gpu_subjects.cu):
//   misbehave-crash  kills its process with SIGSEGV (an access violation);
//   misbehave-hang   never returns (a kernel stuck in a loop);
//   misbehave-fault  reports a sticky device fault (what a GPU subject returns
//                    after an illegal address), so the worker exits after it;
//   misbehave-unavailable  reports that this machine cannot run it (what a GPU
//                    subject returns without a usable GPU), on any machine.
#include <signal.h>
#include <unistd.h>

#include "flashcheck/core/subject.hpp"
#include "properties/fuzz/misbehaving.hpp"

namespace flashcheck {
namespace {

using fixtures::kSmallDomain;

class Misbehaving : public Subject {
 public:
  enum class How { crash, hang, fault, unavailable };
  Misbehaving(std::string_view name, How how) : name_(name), how_(how) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override {
    switch (how_) {
      case How::hang: return "never returns (tests the sweep's watchdog)";
      case How::fault: return "reports a sticky device fault (tests the sweep's worker restart)";
      case How::unavailable: return "reports that it cannot run here (tests that unavailable is never a pass)";
      default: return "dies of SIGSEGV (tests the sweep's isolation)";
    }
  }
  const Capabilities& capabilities() const override { return kSmallDomain; }
  RunResult run(const Problem& problem, const Inputs&) override {
    if (auto refused = refuse_outside(kSmallDomain, problem)) return *refused;
    if (how_ == How::hang)
      while (true) ::pause();
    if (how_ == How::fault) {
      RunResult result;
      result.status = Status::fault;
      result.message = "an illegal memory access was encountered (emulated)";
      return result;
    }
    if (how_ == How::unavailable) {
      RunResult result;
      result.status = Status::unavailable;
      result.message = "needs a device this machine lacks (emulated)";
      return result;
    }
    ::raise(SIGSEGV);
    return {};
  }

 private:
  std::string_view name_;
  How how_;
};

FixtureRegistration crash([] { return std::make_unique<Misbehaving>("misbehave-crash", Misbehaving::How::crash); });
FixtureRegistration hang([] { return std::make_unique<Misbehaving>("misbehave-hang", Misbehaving::How::hang); });
FixtureRegistration fault([] { return std::make_unique<Misbehaving>("misbehave-fault", Misbehaving::How::fault); });
FixtureRegistration unavailable(
    [] { return std::make_unique<Misbehaving>("misbehave-unavailable", Misbehaving::How::unavailable); });

}  // namespace
}  // namespace flashcheck
