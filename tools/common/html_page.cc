#include "tools/common/html_page.h"

#include <array>

#include <fmt/format.h>

#include "base/durable_file.h"
#include "base/error.h"

namespace zest {
namespace {

// JSON inside <script type="application/json">: '<' (and '>' and '&', for good measure) only
// ever stand inside JSON strings, where \u003c means the same, so no "</script>" or "<!--" in a
// config value or a file name can end the element early. Invalid UTF-8 (a path's raw bytes) is
// replaced rather than failing the page.
std::string script_json(const nlohmann::ordered_json& value) {
  const std::string text =
      value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '<': out += "\\u003c"; break;
      case '>': out += "\\u003e"; break;
      case '&': out += "\\u0026"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

constexpr std::string_view kStyle = R"(
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
p.subtitle { color: #555; margin: 0 0 8px; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 16px; }
figure { margin: 0; border: 1px solid #e3e3e3; border-radius: 6px; padding: 8px 12px 12px; }
figcaption { font-weight: 600; margin-bottom: 6px; }
.chart { position: relative; height: 300px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
footer { margin-top: 32px; color: #777; font-size: 12px; }
)";

// Draws every chart of the page from the JSON in #zest-charts. Charts draw at once (no
// animation), so a page printed or captured as it loads shows them whole; a chart that fails
// says so on the console and leaves the others drawn.
constexpr std::string_view kDraw = R"(
(function () {
  const specs = JSON.parse(document.getElementById('zest-charts').textContent);
  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;
  for (const spec of specs) {
    try {
      new Chart(document.getElementById(spec.id), spec.config);
    } catch (error) {
      console.error('zest: ' + spec.id + ' could not be drawn: ' + error);
    }
  }
})();
)";

}  // namespace

void require_html_support(const std::string& option) {
  if (!chartjs_source().empty()) return;
  throw Error(ErrorKind::kUsage,
              option + ": this build has no Chart.js to draw with; install Debian's "
                       "libjs-chart.js (make deps) and rebuild");
}

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string chart_colour(std::size_t index) {
  // Tableau 10: distinct in colour and in lightness, so neighbours in a stack stay apart.
  constexpr std::array<const char*, 10> kColours = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                    "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                                                    "#9c755f", "#bab0ac"};
  return kColours[index % kColours.size()];
}

HtmlPage::HtmlPage(std::string title, std::string subtitle)
    : title_(std::move(title)), subtitle_(std::move(subtitle)) {}

void HtmlPage::heading(const std::string& text) {
  // A heading closes the grid of charts before it; charts after it open a new one.
  if (body_.ends_with("</figure>\n")) body_ += "</div>\n";
  body_ += "<h2>" + html_escape(text) + "</h2>\n";
}

void HtmlPage::paragraph(const std::string& text) {
  if (body_.ends_with("</figure>\n")) body_ += "</div>\n";
  body_ += "<p>" + html_escape(text) + "</p>\n";
}

void HtmlPage::chart(const std::string& caption, nlohmann::ordered_json config) {
  const std::string id = fmt::format("chart-{}", charts_.size());
  if (!body_.ends_with("</figure>\n")) body_ += "<div class=\"charts\">\n";
  body_ += fmt::format(
      "<figure><figcaption>{}</figcaption><div class=\"chart\"><canvas id=\"{}\"></canvas>"
      "</div></figure>\n",
      html_escape(caption), id);
  charts_.push_back({{"id", id}, {"config", std::move(config)}});
}

void HtmlPage::table(const std::vector<std::string>& header,
                     const std::vector<std::vector<std::string>>& rows, bool numeric) {
  if (body_.ends_with("</figure>\n")) body_ += "</div>\n";
  body_ += "<table><thead><tr>";
  for (const std::string& cell : header) body_ += "<th>" + html_escape(cell) + "</th>";
  body_ += "</tr></thead><tbody>\n";
  for (const std::vector<std::string>& row : rows) {
    body_ += "<tr>";
    for (std::size_t i = 0; i < row.size(); ++i) {
      body_ += (numeric && i > 0 ? "<td class=\"num\">" : "<td>") + html_escape(row[i]) + "</td>";
    }
    body_ += "</tr>\n";
  }
  body_ += "</tbody></table>\n";
}

std::string HtmlPage::render() const {
  std::string page;
  page.reserve(chartjs_source().size() + body_.size() + 4096);
  page += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  page += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  page += "<title>" + html_escape(title_) + "</title>\n<style>";
  page += kStyle;
  page += "</style>\n<script>\n/* Chart.js ";
  page += chartjs_version();
  page += " (MIT licence), inlined from Debian's libjs-chart.js */\n";
  page += chartjs_source();
  page += "\n</script>\n</head>\n<body>\n";
  page += "<h1>" + html_escape(title_) + "</h1>\n";
  page += "<p class=\"subtitle\">" + html_escape(subtitle_) + "</p>\n";
  page += body_;
  if (body_.ends_with("</figure>\n")) page += "</div>\n";
  page += fmt::format("<footer>Written by zest; charts drawn by Chart.js {}.</footer>\n",
                      chartjs_version());
  page += "<script type=\"application/json\" id=\"zest-charts\">" + script_json(charts_) +
          "</script>\n<script>";
  page += kDraw;
  page += "</script>\n</body>\n</html>\n";
  return page;
}

void write_html_page(const std::string& path, const HtmlPage& page) {
  write_file_durably(path, page.render());
}

}  // namespace zest
