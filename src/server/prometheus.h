// Prometheus text exposition (version 0.0.4), written by hand: counters, gauges and histograms with labels.
// A family is written once with its HELP and TYPE lines, then its samples.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qspec::server {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Cumulative histogram of observations with fixed upper bounds (an implicit +Inf bucket at the end).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative_counts;  // one per bound, then +Inf (= count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> upper_bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
};

class PrometheusText {
 public:
  // `type`: "counter" or "gauge". Counter names end in _total.
  void add(std::string_view name, std::string_view type, std::string_view help, const Labels& labels,
           double value);
  // A family of several samples (one per label set).
  void add(std::string_view name, std::string_view type, std::string_view help,
           const std::vector<std::pair<Labels, double>>& samples);
  void add_histogram(std::string_view name, std::string_view help, const Labels& labels,
                     const Histogram::Snapshot& histogram);
  const std::string& text() const { return text_; }

 private:
  void family(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, const Labels& labels, double value);

  std::string text_;
};

}  // namespace qspec::server
