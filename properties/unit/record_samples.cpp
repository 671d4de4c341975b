// Writes one record of every kind and shape (record_samples.hpp) through the
// one writer, for record_schema_test.py to validate against
// docs/record.schema.json. Usage: record_samples OUT.jsonl
#include <fmt/core.h>

#include <exception>

#include "properties/unit/record_samples.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: record_samples OUT.jsonl\n");
    return 2;
  }
  try {
    flashcheck::RecordWriter writer(argv[1]);
    for (const auto& sample : flashcheck::testing_records::record_samples()) writer.write(sample.record);
  } catch (const std::exception& error) {
    fmt::print(stderr, "record_samples: {}\n", error.what());
    return 1;
  }
  return 0;
}
