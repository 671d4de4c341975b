// Explicit registration of a subject: a call in the program's own code
// (main, a test fixture), never a static object.
//
// flashcheck's own kernels register themselves from static objects
// (SubjectRegistration in subject.hpp), which only works because the build
// links them as OBJECT libraries. A project that links flashcheck's installed
// static libraries, or puts its kernel in a static library of its own, would
// silently lose such an object (the linker drops an object file that nothing
// references). Registering from code has no such trap:
//
//   #include "flashcheck/core/registration.hpp"
//   int main(int argc, char** argv) {
//     flashcheck::Subject& kernel = flashcheck::register_subject<MyKernel>();
//     ...  // judge(kernel, problem), Registry::instance().find("my-kernel"), ...
//   }
//
// The subject is constructed now, owned by the process-wide Registry and
// alive until the process ends; the reference returned stays valid.
#pragma once

#include <fmt/format.h>

#include <memory>
#include <stdexcept>
#include <utility>

#include "flashcheck/core/subject.hpp"

namespace flashcheck {

/// Hands `subject` to Registry::instance() as a `kind` (a subject under test
/// by default; a mutant, fixture or smoke test otherwise) and returns it.
/// Throws std::invalid_argument for a null subject, or when the Registry
/// already holds one of the same name (Registry::find would then be ambiguous).
inline Subject& register_subject(std::unique_ptr<Subject> subject, Registry::Kind kind = Registry::Kind::subject) {
  if (!subject) throw std::invalid_argument("register_subject: no subject given (a null pointer)");
  Registry& registry = Registry::instance();
  if (registry.find(subject->name()) != nullptr)
    throw std::invalid_argument(fmt::format("register_subject: a subject named '{}' is already registered",
                                            std::string_view(subject->name())));
  Subject* registered = subject.get();
  // The Registry holds factories; this one hands over the subject made here.
  auto holder = std::make_shared<std::unique_ptr<Subject>>(std::move(subject));
  registry.add([holder] { return std::move(*holder); }, kind);
  // Constructed now, in registration order (the factory has run once, for good).
  switch (kind) {
    case Registry::Kind::mutant: registry.mutants(); break;
    case Registry::Kind::fixture: registry.fixtures(); break;
    case Registry::Kind::smoke: registry.smoke_tests(); break;
    case Registry::Kind::subject: registry.subjects(); break;
  }
  return *registered;
}

/// Constructs a SubjectType from `arguments`, registers it (as above) and
/// returns it with its own type:
///   MyKernel& kernel = flashcheck::register_subject<MyKernel>(tile_size);
template <typename SubjectType, typename... Arguments>
SubjectType& register_subject(Arguments&&... arguments) {
  auto subject = std::make_unique<SubjectType>(std::forward<Arguments>(arguments)...);
  SubjectType& typed = *subject;
  register_subject(std::move(subject));
  return typed;
}

}  // namespace flashcheck
