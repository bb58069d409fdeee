// coccl-perf --plot and coccl-init-bench --plot: the data files, the gnuplot script, and running
// gnuplot.
#include "perf_plot.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

extern char** environ;

namespace perf {
namespace {

// A gnuplot single-quoted string (a quote inside is written twice).
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string script(const std::string& dir, const std::string& path, const std::string& title,
                   const PlotAxes& axes, const std::vector<PlotSeries>& series) {
  const int panels = axes.bandwidth_label.empty() ? 1 : 2;
  const int width = 600 * panels;
  std::ostringstream s;
  if (ends_with(path, ".png"))
    s << "set terminal pngcairo size " << width << ",480 font 'sans,10'\n";
  else
    s << "set terminal svg size " << width
      << ",480 dynamic font 'sans,11' background rgb 'white'\n";
  s << "set output " << quoted(path) << "\n"
    << "set multiplot layout 1," << panels << " title " << quoted(title) << "\n"
    << "set logscale xy\n"
    // Byte marks at powers of 16 counted from 1 B: a bare 'set xtics 16' leaves gnuplot free to
    // place them at powers of 10 on a short range (256 MiB to 1 GiB was marked "95 MiB").
    << (axes.x_in_bytes ? "set format x '%.0b %BB'\nset xtics 1,16\n" : "set xtics 2\n")
    << "set grid\nset key top left\nset xlabel " << quoted(axes.x_label) << "\n";
  // Column 2 is the time, column 3 the bandwidth.
  for (int panel = 2 - panels; panel < 2; ++panel) {
    s << "set ylabel " << quoted(panel == 0 ? axes.bandwidth_label : axes.time_label) << "\nplot ";
    for (std::size_t i = 0; i < series.size(); ++i)
      s << (i ? ", " : "") << quoted(dir + "/" + std::to_string(i) + ".dat")
        << " using 1:" << (panel == 0 ? 3 : 2) << " with linespoints title "
        << quoted(series[i].title);
    s << "\n";
  }
  s << "unset multiplot\n";
  return s.str();
}

}  // namespace

std::string plot(const std::string& path, const std::string& title, const PlotAxes& axes,
                 const std::vector<PlotSeries>& series) {
  char tmpl[] = "/tmp/coccl-perf-plot-XXXXXX";
  if (!::mkdtemp(tmpl))
    return std::string("cannot make a temporary directory: ") + std::strerror(errno);
  const std::string dir = tmpl;
  std::string why;
  for (std::size_t i = 0; i < series.size(); ++i) {
    std::ofstream f(dir + "/" + std::to_string(i) + ".dat");
    f << "# x time bandwidth_GBps\n";
    for (const auto& p : series[i].points) f << p.x << ' ' << p.time << ' ' << p.bandwidth << '\n';
  }
  const std::string script_path = dir + "/plot.gp", log_path = dir + "/gnuplot.log";
  std::ofstream(script_path) << script(dir, path, title, axes, series);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  const char* argv[] = {"gnuplot", script_path.c_str(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, "gnuplot", &fa, nullptr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc == ENOENT) {
    why = "gnuplot is not installed (apt-get install gnuplot-nox); no plot written";
  } else if (rc != 0) {
    why = std::string("cannot run gnuplot: ") + std::strerror(rc);
  } else {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::ifstream log(log_path);
      std::string line, last;
      while (std::getline(log, line))
        if (!line.empty()) last = line;
      why = "gnuplot failed: " + (last.empty() ? std::string("no message") : last);
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return why;
}

}  // namespace perf
