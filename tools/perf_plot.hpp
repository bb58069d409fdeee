// coccl-perf --plot: bus bandwidth and time against message size, one series per library, drawn
// by gnuplot (run as a separate program; coccl-perf works without it).
#pragma once

#include <string>
#include <vector>

namespace perf {

/// One curve: a library's results for one collective (or one library's times against ranks).
struct PlotSeries {
  std::string title;
  struct Point {
    double x;          // message size in bytes, or what PlotAxes::x_label names
    double time;       // in PlotAxes::time_label's unit
    double bandwidth;  // GB/s; unused without a bandwidth panel
  };
  std::vector<Point> points;
};

/// What the axes show. The defaults are coccl-perf's: bandwidth and time against message size.
struct PlotAxes {
  std::string x_label = "message size";
  bool x_in_bytes = true;       // x tics as 1 KiB, 1 MiB...; false: plain numbers
  std::string bandwidth_label;  // the left panel's axis; empty: the time panel alone
  std::string time_label = "time (us)";
};

/// Writes the data and a gnuplot script to a fresh directory under /tmp and runs gnuplot on
/// them, drawing the bandwidth panel (when `axes` names one) and the time panel side by side,
/// log-scaled, into `path`: an SVG, or a PNG when `path` ends in ".png". Returns an empty string
/// on success, else one line saying why no plot was written (gnuplot not installed, or its own
/// error message).
std::string plot(const std::string& path, const std::string& title, const PlotAxes& axes,
                 const std::vector<PlotSeries>& series);

}  // namespace perf
