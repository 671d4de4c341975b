// fuzz/: the nightly sweep. A driver draws cases from each subject's own
// generator (the properties' gen_problem_in), hands them one at a time to a
// worker process, and appends each case's record to OUT/records.jsonl.
//
// Isolation: a worker that dies (a signal), reports a sticky CUDA fault, or
// outlives the per-case watchdog becomes a recorded failure with its problem
// line and replay command; the driver starts a new worker and goes on.
// Resume: a case is recorded (flushed and fsync'd) only after it finished, and
// a re-run with the same OUT skips recorded cases, so a kill -9 of the driver
// loses nothing and records nothing twice (a torn last line is cut off).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashcheck/core/subject.hpp"
#include "flashcheck/judge/judge.hpp"

namespace flashcheck::fuzz {

struct FuzzOptions {
  std::vector<Subject*> subjects;  // resolved by the caller (cli resolve_subjects)
  std::int64_t cases = 0;  // cases this shard runs (0: until the time budget)
  double minutes = 0;      // time budget (0: until `cases`)
  std::uint64_t seed = 1;
  int shard = 0, shards = 1;  // this shard takes cases k with k % shards == shard
  std::string out;            // output folder (required)
  double watchdog_seconds = 0;  // per case; 0: scaled to the problem's size
  int shrink_runs = 200;  // most runs spent shrinking one failure
  std::vector<int> gpus;  // one worker per listed device (empty: one worker, devices as inherited)
  std::string worker_exe;  // the binary whose `fuzz-worker` runs cases (this one)
  // A case whose subject cannot run on this machine (verdict `unavailable`) is
  // a failure, not a skip (--require-gpu).
  bool require_gpu = false;
  // Where a case's rows are sampled, the workers judge it again on every row
  // (JudgeOptions::every_row; the CLI's --every-row).
  EveryRow every_row = EveryRow::off;
  // Sanitizer mode: a few small cases per subject, each in a worker under
  // `compute-sanitizer --tool <sanitize>` (memcheck, racecheck, initcheck or
  // synccheck), instead of the sweep. Findings are failed records.
  std::string sanitize;
  int sanitize_cases = 4;  // cases per subject
  // The share of a backward subject's cases drawn as backward problems
  // (pass=bwd; generators' DomainLimits::backward_share): 0 forward only,
  // 1 backward only. Part of the case stream: resume with the same share.
  double backward_share = 1.0 / 3;
};

/// Runs a sweep; returns 0 when every case that ran passed (with mutants in
/// it: when every mutant was caught and no other subject failed), 1 otherwise
/// (also for an unavailable case under require_gpu); throws
/// std::invalid_argument on bad input. Unsupported and unavailable cases are
/// counted apart, never as passes.
int run_sweep(const FuzzOptions& options);

/// The worker loop: reads "case<TAB>subject<TAB>problem" lines on stdin and
/// writes one JSON record line per case on stdout, until stdin closes.
int run_worker(EveryRow every_row = EveryRow::off);

/// Parses "i/n" (0 <= i < n); throws std::invalid_argument.
void parse_shard(const std::string& text, int& shard, int& shards);

}  // namespace flashcheck::fuzz
