// The bench: ceilings first, then every (problem, subject) pair timed the same
// way (CUDA events around each launch, warm-up, a rotation over input copies
// larger than L2, median with min and max), printed and recorded.
#include "flashcheck/reports/bench.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "flashcheck/core/gpu/device_info.hpp"
#include "flashcheck/core/record.hpp"
#include "flashcheck/core/paging.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/judge/judge.hpp"
#ifdef FLASHCHECK_HAVE_CUDA
#include "flashcheck/reports/ceilings.hpp"
#endif

namespace flashcheck::reports {

std::string problem_summary(const std::vector<TimedSubject>& timed, std::string_view peer_name) {
  if (timed.empty()) return {};
  const auto best = std::min_element(timed.begin(), timed.end(), [](const TimedSubject& x, const TimedSubject& y) {
    return x.median_ms < y.median_ms;
  });
  const auto peer = std::find_if(timed.begin(), timed.end(), [](const TimedSubject& t) { return t.peer; });
  std::string line = fmt::format("  best: {}{} {:.3f} ms", best->name, best->peer ? " (peer)" : "", best->median_ms);
  if (peer == timed.end())
    return line + (peer_name.empty() ? std::string("; no peer") : fmt::format("; {} not timed on this problem", peer_name));
  auto ratio = [&](const TimedSubject& t) {  // as the table's column: two decimals, or two digits below 0.01
    const double x = peer->median_ms / t.median_ms;
    return x >= 0.01 ? fmt::format("{:.2f}x", x) : fmt::format("{:.1e}x", x);
  };
  if (!best->peer) line += fmt::format(", {} {}", ratio(*best), peer->name);
  std::string others;
  for (const TimedSubject& t : timed)
    if (!t.peer) others += fmt::format("{}{} {}", others.empty() ? "" : ", ", t.name, ratio(t));
  return others.empty() ? line : line + fmt::format("; vs {}: {}", peer->name, others);
}

#ifdef FLASHCHECK_HAVE_CUDA

namespace {

// The inputs a problem is timed on. A paged problem's table is one of private
// pages (shuffled, none shared): a prefix page shared by several sequences is
// read from L2 after its first reader, which would flatter the bandwidth, as
// every logical key is counted as moved.
Inputs bench_inputs(const Problem& p) {
  Inputs inputs = generate_inputs(p);
  if (p.page_size > 0) return paged_inputs(p, logical_inputs(p, inputs), shuffled_page_table(p, /*salt=*/1));
  return inputs;
}

/// Copies of the inputs to rotate through: together at least twice the L2, so
/// that no launch finds its inputs in cache; at least 2, at most 64, and
/// within a quarter of the free device memory.
int input_sets_for(const Problem& p, const Ceilings& c, int asked) {
  if (asked > 0) return asked;
  const double bytes = std::max(1.0, attention_bytes(p));
  int sets = static_cast<int>(std::ceil(2 * c.l2_bytes / bytes));
  sets = std::clamp(sets, 2, 64);
  while (sets > 1 && sets * bytes > c.free_bytes / 4) --sets;
  return sets;
}

struct Row {
  std::string subject;
  bool peer = false;
  Timing timing;
  int input_sets = 0;
};

}  // namespace

int run_bench(const BenchOptions& options) {
  Ceilings ceilings;
  try {
    ceilings = measure_ceilings(options.repeats);
  } catch (const std::exception& error) {
    fmt::print(stderr, "bench: cannot time anything: {}\n", error.what());
    return 2;
  }
  std::unique_ptr<RecordWriter> records;
  if (!options.record_path.empty()) records = std::make_unique<RecordWriter>(options.record_path);
  fmt::print("ceilings on {}: bf16 GEMM {:.0f} TFLOP/s, f32 GEMM {:.1f} TFLOP/s, copy {:.0f} GB/s, read {} GB/s; "
             "L2 {:.0f} MiB\n  ({})\n",
             ceilings.device, ceilings.gemm_bf16_tflops, ceilings.gemm_f32_tflops, ceilings.copy_gbps,
             ceilings.read_gbps > 0 ? fmt::format("{:.0f}", ceilings.read_gbps) : std::string("-"),
             ceilings.l2_bytes / (1 << 20), ceilings.method);
  if (records) records->write(to_record(ceilings));

  // The peer of each problem, timed first (beside the subjects, or as one of them).
  const std::string peer_column =
      options.peers.size() == 1 ? fmt::format("x{}", options.peers[0]->name()) : std::string("xpeer");

  // %copy: GB/s over the copy ceiling (bytes read + written); %read: over the
  // read-only ceiling, the honest one for a decode, which reads K and V and
  // writes almost nothing.
  fmt::print("\n{:<22} {:>9} {:>8} {:>8} {:>8} {:>6} {:>7} {:>6} {:>6} {:>7} {:>4}  {}\n", "subject", "median ms",
             "min", "max", "TFLOP/s", "%GEMM", "GB/s", "%copy", "%read", peer_column.substr(0, 7), "sets", "problem");
  int timed = 0, failed = 0;
  const auto progress = [&options](std::size_t index, std::string_view subject) {
    if (options.progress) options.progress(index, subject);
  };
  for (std::size_t index = 0; index < options.problems.size(); ++index) {
    const Problem& p = options.problems[index];
    const Inputs inputs = bench_inputs(p);
    // A backward's subjects are handed the f64 oracle's forward (core/backward.hpp),
    // computed once here on the CPU (BLAS threads).
    std::optional<BackwardInputs> handed;
    if (p.pass == Pass::bwd) {
      progress(index, "the f64 forward the backward is handed");
      handed = hand_over(p, inputs, generate_dout(p));
      progress(index, {});
    }
    const bool decode = p.seqlen_q <= kDecodeMaxQueries;
    const double gemm = p.dtype == DType::f32 ? ceilings.gemm_f32_tflops : ceilings.gemm_bf16_tflops;
    Subject* const peer = peer_for(options.peers, p);
    const bool peer_added =
        peer && std::find(options.subjects.begin(), options.subjects.end(), peer) == options.subjects.end();
    std::vector<Subject*> order;
    if (peer_added) order.push_back(peer);
    order.insert(order.end(), options.subjects.begin(), options.subjects.end());
    // The peer first, so that every subject after it is compared with it.
    std::stable_partition(order.begin(), order.end(), [peer](const Subject* s) { return s == peer; });
    std::optional<double> peer_ms;
    std::vector<TimedSubject> timed_here;  // for the problem's summary line
    for (Subject* subject : order) {
      const bool is_peer = peer_added && subject == peer;
      std::string why;
      if (auto reason = unsupported_reason(subject->capabilities(), p)) why = "outside its domain: " + *reason;
      if (auto reason = unavailable_reason(subject->capabilities()); reason && why.empty()) {
        // This machine cannot run it (too old a GPU, say): said on every line, not a failed timing.
        fmt::print("{:<22} {:>9}  {} (UNAVAILABLE here: {})\n", subject->name(), "-", to_line(p), *reason);
        continue;
      }
      if (!why.empty()) {
        if (!options.every_subject)
          fmt::print("{:<22} {:>9}  {} ({})\n", subject->name(), "-", to_line(p), why);
        continue;
      }
      Row row{std::string(subject->name()), is_peer, {}, input_sets_for(p, ceilings, options.input_sets)};
      try {
        progress(index, subject->name());
        std::optional<Timing> timing =
            handed ? subject->time_backward(p, *handed, options.warmup, options.repeats, row.input_sets)
                   : subject->time(p, inputs, options.warmup, options.repeats, row.input_sets);
        progress(index, {});
        if (!timing) {
          if (!options.every_subject)
            fmt::print("{:<22} {:>9}  {} (not timed: a CPU subject)\n", subject->name(), "-", to_line(p));
          continue;
        }
        row.timing = std::move(*timing);
      } catch (const std::exception& error) {
        progress(index, {});
        fmt::print("{:<22} {:>9}  {} (failed: {})\n", subject->name(), "-", to_line(p), error.what());
        ++failed;
        continue;
      }
      const double ms = row.timing.median_ms;
      const double tflops = attention_flops(p) / (ms * 1e-3) / 1e12;
      const double gbps = attention_bytes(p) / (ms * 1e-3) / 1e9;  // every tensor moved once
      if (subject == peer) peer_ms = ms;
      const double vs_peer = peer_ms ? *peer_ms / ms : 0;  // 0: the peer not timed on this problem
      fmt::print("{:<22} {:>9.3f} {:>8.3f} {:>8.3f} {:>8.1f} {:>5.0f}% {:>7.0f} {:>5.0f}% {:>6} {:>7} {:>4}  {}\n",
                 row.subject + (is_peer ? " (peer)" : ""), ms, row.timing.min_ms, row.timing.max_ms, tflops,
                 100 * tflops / gemm, gbps, 100 * gbps / ceilings.copy_gbps,
                 ceilings.read_gbps > 0 ? fmt::format("{:.0f}%", 100 * gbps / ceilings.read_gbps) : std::string("-"),
                 vs_peer >= 0.01 ? fmt::format("{:.2f}", vs_peer) : vs_peer > 0 ? fmt::format("{:.1e}", vs_peer) : "-", row.input_sets, to_line(p));
      ++timed;
      timed_here.push_back({row.subject, ms, subject == peer});
      if (!records) continue;
      BenchRecord record;
      record.time = record_time_now();
      record.subject = row.subject;
      record.peer = is_peer;
      record.problem = to_line(p);
      record.dtype = p.dtype;
      record.bound = decode ? "memory" : "compute";
      record.median_ms = ms;
      record.min_ms = row.timing.min_ms;
      record.max_ms = row.timing.max_ms;
      record.samples_ms.assign(row.timing.samples_ms.begin(), row.timing.samples_ms.end());
      record.flops = attention_flops(p);
      record.tflops = tflops;
      record.fraction_of_gemm = tflops / gemm;
      record.bytes = attention_bytes(p);
      record.gbps = gbps;
      record.fraction_of_copy = gbps / ceilings.copy_gbps;
      if (ceilings.read_gbps > 0) record.fraction_of_read = gbps / ceilings.read_gbps;
      record.warmup = options.warmup;
      record.repeats = options.repeats;
      record.input_sets = row.input_sets;
      record.device = ceilings.device;
      if (vs_peer > 0) {
        record.speed_vs_peer = vs_peer;
        record.peer_subject = peer->name();
      }
      records->write(record);
    }
    if (const std::string summary = problem_summary(timed_here, peer ? peer->name() : ""); !summary.empty())
      fmt::print("{}\n", summary);
  }
  fmt::print("\n%GEMM: of the measured cuBLAS GEMM of the problem's class (bf16 for f16/bf16, f32 without TF32 for "
             "f32; fp8 against bf16's, having no fp8 GEMM of its own); %copy: of the measured device copy (the ceiling of "
             "decode, sq <= {}); {}: the peer's time over the subject's on the same problem (above 1: faster than the "
             "peer; the problem's summary names the peer). A pass=bwd line times the backward "
             "alone, on the f64 oracle's O and LSE, and counts {} times the forward's FLOPs (flash-attention's and "
             "cuDNN's convention) and every tensor and its gradient moved once\n",
             kDecodeMaxQueries, peer_column, kBackwardFlopsFactor);
  if (records) fmt::print("records appended to {}\n", records->path());
  if (failed) fmt::print(stderr, "bench: {} timing(s) failed (see above)\n", failed);
  return timed == 0 ? 2 : failed > 0 ? 1 : 0;
}

#else

int run_bench(const BenchOptions&) {
  fmt::print(stderr, "bench: built without CUDA: nothing to time\n");
  return 2;
}

#endif

}  // namespace flashcheck::reports
