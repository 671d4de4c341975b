// The typed record (core/record.hpp): every kind written by the one writer
// reads back, through the one reader, as the same struct; the histogram edges
// the records carry are the bins core/metrics.hpp counts into; records that
// are not records are refused with the field named. The schema side is
// record_schema_test.py (the same samples, validated against
// docs/record.schema.json).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "properties/unit/record_samples.hpp"

namespace flashcheck {
namespace {

using testing_records::record_samples;

bool has_judged(const Record& record, CaseVerdict verdict) {
  const auto* r = std::get_if<CaseRecord>(&record);
  return r && r->verdict == verdict && r->judged;
}

TEST(Record, TheSamplesCoverEveryKindAndVerdict) {
  const auto samples = record_samples();
  std::set<std::string> kinds;
  for (const auto& [name, record] : samples) {
    if (const auto* r = std::get_if<CaseRecord>(&record)) kinds.insert(std::string(to_string(r->verdict)));
    if (std::holds_alternative<BenchRecord>(record)) kinds.insert("bench");
    if (std::holds_alternative<CeilingRecord>(record)) kinds.insert("ceiling");
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"pass", "fail", "vacuous", "deviation", "unsupported", "unavailable", "fault",
                                          "error", "crash", "timeout", "bench", "ceiling"}));
  // The judge's verdicts came from the judge, with their metrics.
  for (CaseVerdict v : {CaseVerdict::pass, CaseVerdict::fail, CaseVerdict::vacuous, CaseVerdict::deviation}) {
    bool found = false;
    for (const auto& sample : samples) found = found || has_judged(sample.record, v);
    EXPECT_TRUE(found) << to_string(v);
  }
  const auto& with_peer = std::get<CaseRecord>(samples.at(0).record);
  ASSERT_TRUE(with_peer.judged && with_peer.judged->peer) << "the peer ran on the f16 case";
  EXPECT_TRUE(with_peer.judged->metrics.has_lse);
  EXPECT_GT(with_peer.judged->metrics.o.errors.count, 0);
}

TEST(Record, EveryKindReadsBackAsTheSameStruct) {
  for (const auto& [name, record] : record_samples()) {
    const std::string line = dump_record(record);
    EXPECT_EQ(line.find('\n'), std::string::npos) << name;
    const Record back = parse_record(line);
    ASSERT_EQ(back.index(), record.index()) << name;
    // Written again, byte for byte the same line (NaN included, written "nan").
    EXPECT_EQ(dump_record(back), line) << name;
    if (line.find("\"nan\"") == std::string::npos) {
      EXPECT_TRUE(back == record) << name << ": the struct read back differs\n" << line;
    }
  }
}

TEST(Record, NonFiniteNumbersReadBackAsThemselves) {
  const auto samples = record_samples();
  CaseRecord r = std::get<CaseRecord>(samples.at(0).record);
  ASSERT_TRUE(r.judged);
  r.judged->metrics.o.errors.max_abs = std::numeric_limits<double>::quiet_NaN();
  r.judged->metrics.o.errors.rmse = std::numeric_limits<double>::infinity();
  r.judged->tolerance.worst_ratio = -std::numeric_limits<double>::infinity();
  r.worst_ratio = std::numeric_limits<double>::infinity();
  const nlohmann::json j = r;
  EXPECT_EQ(j["metrics"]["o"]["errors"]["max_abs"], "nan");
  EXPECT_EQ(j["worst_ratio"], "inf");
  const auto back = std::get<CaseRecord>(parse_record(j.dump()));
  EXPECT_TRUE(std::isnan(back.judged->metrics.o.errors.max_abs));
  EXPECT_EQ(back.judged->metrics.o.errors.rmse, std::numeric_limits<double>::infinity());
  EXPECT_EQ(back.judged->tolerance.worst_ratio, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(back.worst_ratio, std::numeric_limits<double>::infinity());
  // Older writers wrote NaN as null: read as NaN, not refused.
  nlohmann::json older = j;
  older["metrics"]["o"]["errors"]["p99"] = nullptr;
  EXPECT_TRUE(std::isnan(std::get<CaseRecord>(read_record(older)).judged->metrics.o.errors.p99));
}

TEST(Record, EveryJudgedCaseCarriesTheHistogramEdges) {
  const HistogramEdges& edges = histogram_edges();
  for (const auto& [name, record] : record_samples()) {
    const nlohmann::json j = nlohmann::json::parse(dump_record(record));
    const bool judged = std::holds_alternative<CaseRecord>(record) && std::get<CaseRecord>(record).judged;
    ASSERT_EQ(j.contains("histogram_edges"), judged) << name;
    if (!judged) continue;
    ASSERT_EQ(j["histogram_edges"]["log10"].size(), edges.log10.size()) << name;
    EXPECT_EQ(j["histogram_edges"]["log10"].back(), "inf");
    EXPECT_EQ(j["histogram_edges"]["ulp_log2"].size(), edges.ulp_log2.size()) << name;
    const nlohmann::json& errors = j.contains("gradients") ? j["gradients"]["dk"]["errors"] : j["metrics"]["o"]["errors"];
    EXPECT_EQ(errors["histogram_log10"].size() + 1, j["histogram_edges"]["log10"].size());
    EXPECT_EQ(errors["histogram_ulp_log2"].size() + 1, j["histogram_edges"]["ulp_log2"].size());
  }
}

// The edges are the bins metrics.cpp counts into: each edge's value falls in
// its bin and the value just below it in the bin before.
TEST(Record, TheEdgesAreTheBinsTheMetricsCountInto) {
  const HistogramEdges& edges = histogram_edges();
  ASSERT_EQ(edges.log10.size(), static_cast<std::size_t>(kHistogramBins + 1));
  ASSERT_EQ(edges.ulp_log2.size(), static_cast<std::size_t>(kUlpHistogramBins + 1));
  for (const auto& [values, bin_of] :
       {std::pair{&edges.log10, &histogram_bin}, std::pair{&edges.ulp_log2, &ulp_histogram_bin}}) {
    const auto& e = *values;
    EXPECT_EQ(e[0], 0.0);
    EXPECT_EQ(e[1], 0.0);
    EXPECT_EQ(bin_of(0.0), 0);
    EXPECT_EQ(bin_of(std::numeric_limits<double>::denorm_min()), 1);
    EXPECT_TRUE(std::isinf(e.back()));
    for (std::size_t i = 2; i + 1 < e.size(); ++i) {
      EXPECT_EQ(bin_of(e[i]), static_cast<int>(i)) << "edge " << i << " = " << e[i];
      EXPECT_EQ(bin_of(std::nextafter(e[i], 0.0)), static_cast<int>(i) - 1) << "below edge " << i;
    }
    EXPECT_EQ(bin_of(std::numeric_limits<double>::infinity()), static_cast<int>(e.size()) - 2);
  }
}

TEST(Record, WhatIsNotARecordIsRefusedWithTheFieldNamed) {
  const auto expect_refused = [](const std::string& line, const std::string& says) {
    try {
      (void)parse_record(line);
      ADD_FAILURE() << "accepted: " << line;
    } catch (const RecordError& error) {
      EXPECT_NE(std::string(error.what()).find(says), std::string::npos) << error.what();
    }
  };
  expect_refused("{\"schema\": 4, \"verdict\": \"pass\"", "not JSON");
  expect_refused("[1, 2]", "not an object");
  expect_refused("{\"verdict\": \"pass\"}", "no 'schema'");
  expect_refused("{\"schema\": 6, \"verdict\": \"crash\"}", "schema 6");
  expect_refused("{\"schema\": 4, \"verdict\": \"maybe\"}", "unknown verdict 'maybe'");
  expect_refused("{\"schema\": 4, \"verdict\": \"pass\", \"subject\": \"s\", \"problem\": \"p\"}", "no 'rule'");
  expect_refused("{\"schema\": 4, \"kind\": \"bench\", \"subject\": \"s\", \"problem\": \"p\", \"median_ms\": 1}",
                 "no 'min_ms'");
  expect_refused("{\"schema\": 4, \"kind\": \"plot\"}", "unknown kind 'plot'");
  // A judged case whose metrics are broken deep inside: the path is named.
  nlohmann::json j = std::get<CaseRecord>(record_samples().at(0).record);
  j["metrics"]["o"]["errors"]["histogram_log10"][3] = "many";
  expect_refused(j.dump(), "metrics.o.errors.histogram_log10[3]: not an integer");
  // The same in a backward case's gradients.
  for (const auto& [name, record] : record_samples())
    if (name == "backward fail") {
      j = std::get<CaseRecord>(record);
      j["gradients"]["dk"]["errors"]["histogram_log10"][2] = "many";
      expect_refused(j.dump(), "gradients.dk.errors.histogram_log10[2]: not an integer");
      j = std::get<CaseRecord>(record);
      j["gradients"].erase("dv");
      expect_refused(j.dump(), "no 'dv'");
    }
  // Counts binned with other edges cannot be read into this build's histograms.
  j = std::get<CaseRecord>(record_samples().at(0).record);
  j["histogram_edges"]["log10"][5] = 1.0;
  expect_refused(j.dump(), "histogram_edges.log10: edge 5");
}

TEST(Record, BackwardCasesCarryTheirGradientsBaselineAndPeer) {
  bool seen_pass = false, seen_fail = false;
  for (const auto& [name, record] : record_samples()) {
    const auto* r = std::get_if<CaseRecord>(&record);
    if (!r || !r->judged || !r->judged->gradients) continue;
    SCOPED_TRACE(name);
    const Judgement& d = *r->judged;
    EXPECT_NE(r->problem.find("pass=bwd"), std::string::npos);
    EXPECT_GT(d.gradients->dq.errors.count, 0);
    EXPECT_GT(d.gradients->dk.errors.count, 0);
    EXPECT_GT(d.gradients->dv.errors.count, 0);
    EXPECT_GT(d.kv_rows_checked, 0);
    ASSERT_TRUE(d.baseline.gradients);
    EXPECT_GT(d.baseline.gradients->dq.errors.count, 0);
    EXPECT_TRUE(d.gradient_condition);
    EXPECT_EQ(d.metrics.o.errors.count, 0);  // a backward record has no forward metrics
    const std::string line = dump_record(record);
    EXPECT_EQ(line.find("\"metrics\""), std::string::npos) << line;
    if (r->verdict == CaseVerdict::pass && d.peer) {
      seen_pass = true;
      ASSERT_TRUE(d.peer->gradients);
      EXPECT_DOUBLE_EQ(d.peer->gradient_max_ratio, 1.0);  // the same arithmetic as the subject
    }
    if (r->verdict == CaseVerdict::fail) {
      seen_fail = true;
      EXPECT_NE(d.tolerance.rule.find("dq"), std::string::npos) << d.tolerance.rule;
    }
  }
  EXPECT_TRUE(seen_pass);
  EXPECT_TRUE(seen_fail);
}

TEST(Record, OlderSchemasStillRead) {
  // A schema-3 pass (no histogram_edges, no magnitude_count) and a schema-1
  // bench record that named cuDNN in speed_vs_cudnn.
  nlohmann::json j = std::get<CaseRecord>(record_samples().at(0).record);
  j["schema"] = 3;
  j.erase("histogram_edges");
  j["metrics"]["o"]["errors"].erase("magnitude_count");
  const auto old_case = std::get<CaseRecord>(read_record(j));
  EXPECT_EQ(old_case.schema, 3);
  EXPECT_EQ(old_case.verdict, CaseVerdict::pass);
  const auto bench = std::get<BenchRecord>(parse_record(
      R"({"schema": 1, "kind": "bench", "subject": "mma", "problem": "p", "median_ms": 2, "min_ms": 1, "max_ms": 3,
          "speed_vs_cudnn": 0.5})"));
  EXPECT_EQ(bench.speed_vs_peer, 0.5);
  EXPECT_EQ(bench.peer_subject, "cudnn");
  // Written again, it is a schema-4 record.
  EXPECT_EQ(nlohmann::json(bench)["schema"], kRecordSchema);
}

TEST(Record, TheWriterAppendsOneLinePerRecordThatTheReaderReads) {
  const auto dir = std::filesystem::temp_directory_path() / ("flashcheck_record_test_" + std::to_string(::getpid()));
  const auto path = dir / "records.jsonl";
  const auto samples = record_samples();
  {
    RecordWriter writer(path.string());
    for (const auto& sample : samples) writer.write(sample.record);
  }
  std::ifstream in(path);
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    ASSERT_LT(n, samples.size());
    EXPECT_EQ(parse_record(line).index(), samples[n].record.index()) << samples[n].name;
    EXPECT_EQ(line, dump_record(samples[n].record)) << samples[n].name;
    ++n;
  }
  EXPECT_EQ(n, samples.size());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace flashcheck
