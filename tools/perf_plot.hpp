// coccl-perf --plot: bus bandwidth and time against message size, one series per library, drawn
// by gnuplot (run as a separate program; coccl-perf works without it).
#pragma once

#include <string>
#include <vector>

namespace perf {

/// One curve: a library's results for one collective.
struct PlotSeries {
  std::string title;
  struct Point {
    double bytes, time_us, bandwidth;  // bandwidth in GB/s
  };
  std::vector<Point> points;
};

/// Writes the data and a gnuplot script to a fresh directory under /tmp and runs gnuplot on
/// them, drawing two panels side by side (bandwidth and time against size, log-scaled axes) into
/// `path`: an SVG, or a PNG when `path` ends in ".png". `bandwidth_label` names the bandwidth
/// axis. Returns an empty string on success, else one line saying why no plot was written
/// (gnuplot not installed, or its own error message).
std::string plot(const std::string& path, const std::string& title,
                 const std::string& bandwidth_label, const std::vector<PlotSeries>& series);

}  // namespace perf
