// A self-contained HTML page of charts and tables, for the tools' reports (zest-train --report,
// zest-report, zest-estimate --html). Charts are drawn in the browser by Chart.js, inlined into
// the page from the copy compiled into the tools (cmake/EmbedChartJs.cmake): the file opens
// offline, from anywhere, in any browser, and loads nothing.
// Invariant: a page reaches disk whole under its final name or not at all (write_html_page).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace zest {

// The Chart.js build compiled into the tools and its version ("3.9.1"); both empty in a build
// made without Debian's libjs-chart.js.
std::string_view chartjs_source();
std::string_view chartjs_version();

// Throws a kUsage Error naming `option` when this build has no Chart.js to draw with; called
// before any work whose only output is a page.
void require_html_support(const std::string& option);

// `text` with &, <, >, " and ' as entities.
std::string html_escape(std::string_view text);

// One colour per dataset index, the same on every page, so that a category has one colour.
std::string chart_colour(std::size_t index);

class HtmlPage {
 public:
  // `title`: the <title> and the top heading; `subtitle`: the line under it.
  HtmlPage(std::string title, std::string subtitle);

  void heading(const std::string& text);
  void paragraph(const std::string& text);
  // A chart under `caption`, drawn from `config`, Chart.js's own configuration (type, data,
  // options); the page adds what every chart shares (no animation, the size of its box).
  void chart(const std::string& caption, nlohmann::ordered_json config);
  // A table of text cells; `numeric` right-aligns every column after the first.
  void table(const std::vector<std::string>& header,
             const std::vector<std::vector<std::string>>& rows, bool numeric = false);

  std::size_t chart_count() const { return charts_.size(); }
  std::string render() const;

 private:
  std::string title_;
  std::string subtitle_;
  std::string body_;
  nlohmann::ordered_json charts_ = nlohmann::ordered_json::array();
};

// Writes the rendered page at `path` through a DurableFile (temporary, fsync, rename).
void write_html_page(const std::string& path, const HtmlPage& page);

}  // namespace zest
