#include "flashcheck/cli/options.hpp"

#include <fmt/core.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace flashcheck::cli {

namespace {

/// A token quoted in an error: at most 80 characters of it.
std::string quote_token(const std::string& text) {
  constexpr std::size_t kMost = 80;
  return text.size() <= kMost ? fmt::format("'{}'", text)
                              : fmt::format("'{}...' ({} characters)", text.substr(0, kMost), text.size());
}

template <typename Integer>
CLI::Option* add_integer_impl(CLI::App& command, const std::string& name, Integer& target, const std::string& help,
                              Integer low, Integer high) {
  const auto check = [low, high](std::string& text) -> std::string {
    Integer value{};
    const char* first = text.data();
    const char* last = text.data() + text.size();
    if (first != last && *first == '+') ++first;  // from_chars refuses a '+'
    const auto [end, error] = std::from_chars(first, last, value, 10);
    if (error == std::errc::result_out_of_range)
      return fmt::format("{} is out of range: expected an integer in [{}, {}]", quote_token(text), low, high);
    if (error != std::errc() || end != last || first == last)
      return fmt::format("{} is not a decimal integer in [{}, {}]", quote_token(text), low, high);
    if (value < low || value > high) return fmt::format("{} is outside [{}, {}]", quote_token(text), low, high);
    return {};
  };
  return command
      .add_option_function<std::string>(
          name,
          [&target](const std::string& text) {
            Integer value{};
            const char* first = text.data() + (!text.empty() && text[0] == '+');
            std::from_chars(first, text.data() + text.size(), value, 10);  // checked above
            target = value;
          },
          help)
      ->check(CLI::Validator(check, fmt::format("[{}, {}]", low, high)))
      ->type_name("INT")
      ->default_str(fmt::format("{}", target));
}

}  // namespace

CLI::Option* add_subjects(CLI::App& command, std::vector<std::string>& names) {
  return command.add_option("-s,--subjects,--subject", names, kSubjectsHelp)->delimiter(',')->type_name("NAME,...");
}

CLI::Validator finite_in(double low, double high, bool low_exclusive) {
  const auto check = [=](std::string& text) -> std::string {
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size()) return fmt::format("{} is not a number", quote_token(text));
    if (!std::isfinite(value)) return fmt::format("{} is not a finite number", quote_token(text));
    if (value < low || (low_exclusive && value == low) || value > high)
      return fmt::format("{} is outside {}{:g}, {:g}]", quote_token(text), low_exclusive ? "(" : "[", low, high);
    return {};
  };
  return CLI::Validator(check, fmt::format("{}{:g}, {:g}]", low_exclusive ? "(" : "[", low, high));
}

CLI::Option* add_integer(CLI::App& command, const std::string& name, std::uint64_t& target, const std::string& help,
                         std::uint64_t low, std::uint64_t high) {
  return add_integer_impl(command, name, target, help, low, high);
}

CLI::Option* add_integer(CLI::App& command, const std::string& name, std::int64_t& target, const std::string& help,
                         std::int64_t low, std::int64_t high) {
  return add_integer_impl(command, name, target, help, low, high);
}

}  // namespace flashcheck::cli
