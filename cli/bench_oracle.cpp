// bench-oracle: cpu_f64 throughput next to the plain dgemm rate of the same
// machine, measured in the same run, and the peak resident memory. With
// --kokkos host|device: the Kokkos reference instead (on a GPU where a CUDA
// Kokkos is built in), every row timed end to end (inputs staged and decoded,
// the kernel, O and LSE copied back), then checked against cpu_f64 on sampled
// rows; with a pass=bwd problem, the every-row gradient reference (with the
// conditioning the judge records) and its same-precision baseline.
#include <fmt/core.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <memory>
#include <vector>

#include "flashcheck/cli/commands.hpp"
#include "flashcheck/core/random.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/oracles/blas.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "flashcheck/oracles/cpu_f64_backward.hpp"
#include "flashcheck/oracles/cpu_lowp.hpp"
#include "flashcheck/judge/every_row.hpp"
#include "flashcheck/oracles/kokkos/kokkos_backward.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

namespace flashcheck::cli {
namespace {

struct BenchOptions {
  std::int64_t batch = 1, heads = 16, seqlen = 4096, head_dim = 128, rows = 0;
  int repeats = 3;
  std::string dtype = "bf16";
  std::string problem_line;  // overrides the shape options
  std::string kokkos;        // "", "host" or "device"
  KokkosTiling tiling;
  std::int64_t check_rows = 256;
  bool baseline = false;  // also time the Kokkos same-precision baseline
  std::string pass = "fwd";  // "bwd": the gradient oracle
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// The machine's dgemm rate with the same threads as the oracle: every thread
// runs single-threaded dgemm on its own n x n x n product, as the oracle's blocks do.
double dgemm_gflops(int repeats) {
  constexpr int n = 1024;
  const int threads = omp_get_max_threads();
  use_single_threaded_blas();
  std::vector<std::vector<double>> a(threads), b(threads), c(threads);
  for (int t = 0; t < threads; ++t) {
    CounterRng rng(static_cast<std::uint64_t>(t), 7);
    a[t].resize(n * n);
    b[t].resize(n * n);
    c[t].assign(n * n, 0.0);
    for (int i = 0; i < n * n; ++i) {
      a[t][i] = rng.uniform(2 * i) - 0.5;
      b[t][i] = rng.uniform(2 * i + 1) - 0.5;
    }
  }
  std::vector<double> times;
  for (int r = 0; r < repeats + 1; ++r) {  // the first is a warm-up
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, a[t].data(), n, b[t].data(), n, 0.0,
                  c[t].data(), n);
    }
    if (r > 0) times.push_back(seconds_since(start));
  }
  return 2.0 * n * n * n * threads / median(times) / 1e9;
}

// The two products: 2*d FLOPs per (query, key) pair each for Q K^T and P V
// (masked pairs included: a nominal count).
double nominal_flops(const Problem& problem, std::int64_t rows) {
  return 2.0 * problem.batch * problem.heads_q * static_cast<double>(rows) * problem.seqlen_kv *
         (problem.head_dim + problem.head_dim_v);
}

// The Kokkos reference on every row, timed end to end; its first run (Kokkos
// and CUDA start-up) is a warm-up. Then cpu_f64 on sampled rows must agree to
// f64 rounding (the triangulation property's 1e-12 normwise).
// The first lines of a Kokkos bench: what runs where, on which problem, with which tiling.
void print_kokkos_run(const char* what, const Problem& problem, const BenchOptions& options,
                      const KokkosTiling& tiling) {
  fmt::print("bench-oracle: {} on the {} ({}), problem {}\n", what, options.kokkos, kokkos_description(),
             to_line(problem));
  fmt::print("  tiling: {} query rows per team, {} keys per tile, {} threads per team\n", tiling.rows_per_team,
             tiling.key_tile, tiling.team_size);
}

// The every-row gradient reference (Algorithm 2 with the conditioning, as
// the judge's every-row check runs it), timed end to end after a warm-up,
// then cross-checked against cpu_f64's gradients on sampled rows, as the
// judge does; with --baseline, the same-precision gradient baseline too.
int bench_kokkos_gradients(const Problem& problem, const BenchOptions& options, KokkosSpace space) {
  const KokkosTiling tiling = kokkos_fitted_gradient_tiling(problem, options.tiling, space);
  print_kokkos_run("kokkos_f64 gradients", problem, options, tiling);
  auto start = std::chrono::steady_clock::now();
  const Inputs inputs = generate_inputs(problem);
  const HostTensor dout = generate_dout(problem);
  fmt::print("  inputs and dO generated in {:.2f} s\n", seconds_since(start));
  const RowSet rows = all_rows(problem), keys = all_key_rows(problem);
  GradientRows every;
  std::vector<double> times;
  for (int r = 0; r < options.repeats + 1; ++r) {
    start = std::chrono::steady_clock::now();
    every = kokkos_gradients(problem, inputs, dout, rows, keys, tiling, space, /*with_condition=*/true);
    if (r > 0) times.push_back(seconds_since(start));
  }
  const double tflops = 2.5 * nominal_flops(problem, rows.size()) / median(times) / 1e12;
  fmt::print("  every query and key row, with the conditioning: median {:.3f} s of {} (after a warm-up) -> {:.3g} "
             "TFLOP/s (2.5x forward){}\n",
             median(times), times.size(), tflops, problem.mask == MaskKind::none ? "" : " (nominal: masked pairs counted)");

  const RowSet sample = sample_rows(problem, options.check_rows, 1);
  const RowSet key_sample = sample_key_rows(problem, options.check_rows, 2);
  start = std::chrono::steady_clock::now();
  const GradientRows sampled = cpu_f64_gradients(problem, inputs, dout, sample, key_sample);
  const double oracle_seconds = seconds_since(start);
  const GradientCrossCheck check = cross_check_gradients(problem, every, sampled, gradient_condition(problem, every));
  fmt::print("  cross-check: cpu_f64 gradients on {} query and {} key rows per head ({:.2f} s): worst {} at {:.3g} of "
             "the allowed difference (normwise {:.3g}), {} non-finite position(s) differ -> {}\n",
             sample.size(), key_sample.size(), oracle_seconds, check.worst, check.worst_ratio, check.worst_normwise,
             check.nonfinite_mismatches, check.agrees() ? "agree" : "DISAGREE");
  if (options.baseline) {
    start = std::chrono::steady_clock::now();
    const GradientRows baseline = kokkos_gradient_baseline(problem, inputs, dout, rows, keys, problem.dtype, space);
    fmt::print("  gradient baseline ({}) on every row: {:.3f} s\n", to_string(problem.dtype), seconds_since(start));
    if (baseline.dk.size() != every.dk.size()) throw std::runtime_error("gradient baseline produced the wrong size");
  }
  fmt::print("  peak resident memory: {:.0f} MiB\n", peak_rss_mib());
  return check.agrees() ? kExitPass : kExitFail;
}

int bench_kokkos(const Problem& problem, const BenchOptions& options) {
  const KokkosSpace space = options.kokkos == "device" ? KokkosSpace::device : KokkosSpace::host;
  if (problem.pass == Pass::bwd) return bench_kokkos_gradients(problem, options, space);
  const KokkosTiling tiling = kokkos_fitted_tiling(problem, options.tiling, space);
  print_kokkos_run("kokkos_f64", problem, options, tiling);
  auto start = std::chrono::steady_clock::now();
  const Inputs inputs = generate_inputs(problem);
  fmt::print("  inputs generated in {:.2f} s\n", seconds_since(start));
  const RowSet rows = all_rows(problem);
  AttentionRows reference;
  std::vector<double> times;
  for (int r = 0; r < options.repeats + 1; ++r) {
    start = std::chrono::steady_clock::now();
    reference = kokkos_reference(problem, inputs, rows, Accumulation::f64, tiling, space);
    if (r > 0) times.push_back(seconds_since(start));
  }
  const double tflops = nominal_flops(problem, rows.size()) / median(times) / 1e12;
  fmt::print("  every row ({} per head): median {:.3f} s of {} (after a warm-up) -> {:.3g} TFLOP/s{}\n", rows.size(),
             median(times), times.size(), tflops, problem.mask == MaskKind::none ? "" : " (nominal: masked pairs counted)");

  const RowSet sample = sample_rows(problem, options.check_rows, 1);
  start = std::chrono::steady_clock::now();
  const AttentionRows oracle = cpu_f64_reference(problem, inputs, sample);
  const double oracle_seconds = seconds_since(start);
  const CrossCheck check = cross_check(problem, reference, oracle);
  fmt::print("  cross-check: cpu_f64 on {} sampled rows per head ({:.2f} s): normwise O difference {:.3g}, LSE {:.3g} "
             "(relative to 1 + |LSE|), {} non-finite position(s) differ -> {}\n",
             sample.size(), oracle_seconds, check.o_normwise, check.lse_relative, check.nonfinite_mismatches,
             check.agrees() ? "agree" : "DISAGREE");
  if (options.baseline) {
    // The same-precision baseline on every row, and its error on the sampled
    // rows next to cpu_lowp's (the same arithmetic on the host).
    start = std::chrono::steady_clock::now();
    const AttentionRows baseline = kokkos_baseline(problem, inputs, rows, problem.dtype, space);
    const double baseline_seconds = seconds_since(start);
    const AttentionRows host_baseline = cpu_lowp_rows(problem, inputs, sample, problem.dtype);
    const CrossCheck device_error = cross_check(problem, baseline, oracle);
    const CrossCheck host_error = cross_check(problem, host_baseline, oracle);
    fmt::print("  baseline ({}) on every row: {:.3f} s; normwise O error on the sampled rows {:.4g} (cpu_lowp: {:.4g})\n",
               to_string(problem.dtype), baseline_seconds, device_error.o_normwise, host_error.o_normwise);
  }
  fmt::print("  peak resident memory: {:.0f} MiB\n", peak_rss_mib());
  return check.agrees() ? kExitPass : kExitFail;
}

int bench(const BenchOptions& options) {
  Problem problem;
  if (!options.problem_line.empty()) {
    problem = parse_problem(options.problem_line);
  } else {
    auto dtype = parse_dtype(options.dtype);
    if (!dtype) throw std::invalid_argument(fmt::format("--dtype '{}': unknown dtype (f32, f16, bf16)", options.dtype));
    problem = make_problem(options.batch, options.heads, options.heads, options.seqlen, options.seqlen,
                           options.head_dim, *dtype);
  }
  if (options.pass == "bwd") problem.pass = Pass::bwd;  // a problem line's pass=bwd counts too
  validate(problem);
  if (!options.kokkos.empty()) return bench_kokkos(problem, options);
  fmt::print("bench-oracle: {} threads, problem {}\n", omp_get_max_threads(), to_line(problem));
  const double dgemm = dgemm_gflops(options.repeats);
  fmt::print("  dgemm (OpenBLAS single-threaded per thread, n=1024): {:.1f} GFLOP/s\n", dgemm);

  auto start = std::chrono::steady_clock::now();
  const Inputs inputs = generate_inputs(problem);
  fmt::print("  inputs generated in {:.2f} s\n", seconds_since(start));
  const RowSet rows = options.rows > 0 ? sample_rows(problem, options.rows, 1) : all_rows(problem);
  std::vector<double> times;
  if (problem.pass == Pass::bwd) {
    // dQ on the rows, dK and dV on every key row (each a sum over every query
    // row: all of them are computed whatever the sample). The FLOP count is
    // the convention of cuDNN's and FlashAttention's benchmarks, 2.5x the
    // forward's (five products of the forward's size for d = dv), over every
    // query row since dK and dV need them all.
    const HostTensor dout = generate_dout(problem);
    const RowSet keys = all_key_rows(problem);
    for (int r = 0; r < options.repeats; ++r) {
      start = std::chrono::steady_clock::now();
      const GradientRows gradients = cpu_f64_gradients(problem, inputs, dout, rows, keys);
      times.push_back(seconds_since(start));
      if (gradients.dk.empty()) throw std::runtime_error("gradient oracle produced nothing");
    }
    const double rate = 2.5 * nominal_flops(problem, problem.seqlen_q) / median(times) / 1e9;
    fmt::print("  cpu_f64 gradients (dQ on {} row(s) per head, dK/dV on every key row): median {:.3f} s of {} -> "
               "{:.1f} GFLOP/s (2.5x forward) = {:.0f}% of dgemm\n",
               rows.size(), median(times), times.size(), rate, 100.0 * rate / dgemm);
    fmt::print("  peak resident memory: {:.0f} MiB\n", peak_rss_mib());
    return kExitPass;
  }
  for (int r = 0; r < options.repeats; ++r) {
    start = std::chrono::steady_clock::now();
    const AttentionRows reference = cpu_f64_reference(problem, inputs, rows);
    times.push_back(seconds_since(start));
    if (reference.o.empty() && rows.size() > 0) throw std::runtime_error("oracle produced nothing");
  }
  const double oracle = nominal_flops(problem, rows.size()) / median(times) / 1e9;
  fmt::print("  cpu_f64 on {} row(s) per head: median {:.3f} s of {} -> {:.1f} GFLOP/s = {:.0f}% of dgemm\n",
             rows.size(), median(times), times.size(), oracle, 100.0 * oracle / dgemm);
  fmt::print("  peak resident memory: {:.0f} MiB\n", peak_rss_mib());
  return kExitPass;
}

}  // namespace

void add_bench_oracle(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<BenchOptions>();
  auto* command = app.add_subcommand(
      "bench-oracle", "Time the f64 oracle against the machine's dgemm rate, or the Kokkos reference (--kokkos)");
  command->add_option("-b,--batch", options->batch, "Batch size")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  command->add_option("--heads", options->heads, "Query and key/value heads")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  command->add_option("-n,--seqlen", options->seqlen, "seqlen_q = seqlen_kv")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30))
      ->capture_default_str();
  command->add_option("-d,--head-dim", options->head_dim, "Head dimension of Q, K and V")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->capture_default_str();
  command->add_option("--rows", options->rows, "Sampled query rows per head (0: all)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 30))
      ->capture_default_str();
  command->add_option("--repeats", options->repeats, "Timed runs (the median is reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  command->add_option("--dtype", options->dtype, "Input dtype: f32, f16 or bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  command->add_option("-p,--problem", options->problem_line,
                      "A problem line (instead of the shape options; README: problem lines)");
  command->add_option("--kokkos", options->kokkos,
                      "Time the Kokkos reference on every row instead, on the host or the device (a GPU) (default: "
                      "cpu_f64)")
      ->check(CLI::IsMember({"host", "device"}));
  command->add_option("--rows-per-team", options->tiling.rows_per_team, "Kokkos: query rows per team")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  command->add_option("--key-tile", options->tiling.key_tile, "Kokkos: keys per tile")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  command->add_option("--team-size", options->tiling.team_size, "Kokkos: threads per team (0: the space's default)")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  command->add_option("--pass", options->pass, "fwd: the forward oracle; bwd: the gradient oracle (dQ, dK, dV)")
      ->check(CLI::IsMember({"fwd", "bwd"}))
      ->capture_default_str();
  command->add_flag("--baseline", options->baseline,
                    "Kokkos: also time the same-precision baseline on every row (its error next to cpu_lowp's)");
  command->add_option("--check-rows", options->check_rows, "Kokkos: rows per head cross-checked with cpu_f64")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  command->footer(fmt::format("Example: flashcheck bench-oracle -n 2048 --rows 256\n"
                              "Exit codes: 0 timed (with --kokkos: and it agreed with cpu_f64), 1 the Kokkos reference\n"
                              "disagreed with cpu_f64, 2 bad input, 3 internal error."));
  command->callback([options, &exit_code] { exit_code = bench(*options); });
}

}  // namespace flashcheck::cli
