#include "server/prometheus.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace qspec::server {

namespace {

// Label values escape backslash, double quote and newline; HELP text escapes backslash and newline.
std::string escaped(std::string_view text, bool quote) {
  std::string out;
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string number(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value)) return "NaN";
  return fmt::format("{}", value);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket =
      size_t(std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snapshot;
  snapshot.upper_bounds = upper_bounds_;
  std::lock_guard lock(mutex_);
  uint64_t total = 0;
  for (const uint64_t count : counts_) snapshot.cumulative_counts.push_back(total += count);
  snapshot.sum = sum_;
  snapshot.count = total;
  return snapshot;
}

void PrometheusText::add(std::string_view name, std::string_view type, std::string_view help,
                         const Labels& labels, double value) {
  add(name, type, help, {{labels, value}});
}

void PrometheusText::add(std::string_view name, std::string_view type, std::string_view help,
                         const std::vector<std::pair<Labels, double>>& samples) {
  family(name, type, help);
  for (const auto& [labels, value] : samples) sample(name, labels, value);
}

void PrometheusText::add_histogram(std::string_view name, std::string_view help, const Labels& labels,
                                   const Histogram::Snapshot& histogram) {
  family(name, "histogram", help);
  const std::string bucket = std::string(name) + "_bucket";
  for (size_t i = 0; i < histogram.cumulative_counts.size(); ++i) {
    Labels with_bound = labels;
    const double bound = i < histogram.upper_bounds.size() ? histogram.upper_bounds[i] : INFINITY;
    with_bound.emplace_back("le", number(bound));
    sample(bucket, with_bound, double(histogram.cumulative_counts[i]));
  }
  sample(std::string(name) + "_sum", labels, histogram.sum);
  sample(std::string(name) + "_count", labels, double(histogram.count));
}

void PrometheusText::family(std::string_view name, std::string_view type, std::string_view help) {
  text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escaped(help, false), name, type);
}

void PrometheusText::sample(std::string_view name, const Labels& labels, double value) {
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i)
      text_ += fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first, escaped(labels[i].second, true));
    text_ += '}';
  }
  text_ += ' ' + number(value) + '\n';
}

}  // namespace qspec::server
