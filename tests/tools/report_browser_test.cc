// ctest-labels: browser
// The pages open in a real browser: Debian's chromium, headless and offline, loads the run report
// (zest-train --report) and the plan (zest-estimate --fit --html) with a check inserted at the
// top of the page that records every script error and console error or warning, and, once the
// page has loaded, whether each canvas holds a Chart.js chart with data and drawn pixels. The
// pages are also captured as PNG screenshots under <build>/screenshots/. Without chromium (not
// installed: tools/setup/install-deps.sh browser) the tests skip and say so.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"

namespace {

using ::testing::HasSubstr;
using zest::testing::ProcessResult;
using zest::testing::read_file;

const std::string kTrain = ZEST_BINARY_DIR "/bin/zest-train";
const std::string kEstimate = ZEST_BINARY_DIR "/bin/zest-estimate";
const std::string kMlpConfig = ZEST_SOURCE_DIR "/configs/mlp.json";
const std::string kGptConfig = ZEST_SOURCE_DIR "/configs/default.json";
const std::filesystem::path kScreenshots = ZEST_BINARY_DIR "/screenshots";

// ZEST_CHROMIUM, or the first of Debian's names found on PATH; empty when there is none.
std::string find_chromium() {
  if (const char* given = std::getenv("ZEST_CHROMIUM"); given != nullptr && *given != '\0') {
    return ::access(given, X_OK) == 0 ? given : "";
  }
  const char* path = std::getenv("PATH");
  std::string folders = path != nullptr ? path : "/usr/bin:/bin";
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    std::size_t begin = 0;
    while (begin <= folders.size()) {
      const std::size_t end = std::min(folders.find(':', begin), folders.size());
      const std::string candidate = folders.substr(begin, end - begin) + "/" + name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      begin = end + 1;
    }
  }
  return "";
}

// Put first in <head>, so it sees errors of every script after it, the inlined library's too.
constexpr const char* kCheck = R"(<script>
window.zestProblems = [];
window.addEventListener('error', (event) => zestProblems.push('error: ' + event.message));
for (const level of ['error', 'warn']) {
  const original = console[level];
  console[level] = function (...args) {
    zestProblems.push(level + ': ' + args.join(' '));
    original.apply(console, args);
  };
}
window.addEventListener('load', () => {
  const result = {canvases: 0, drawn: 0, undrawn: [], problems: zestProblems};
  for (const canvas of document.querySelectorAll('canvas')) {
    result.canvases++;
    const chart = typeof Chart === 'undefined' ? undefined : Chart.getChart(canvas);
    const hasData = chart !== undefined &&
        chart.data.datasets.some((set) => set.data.some((value) => value !== null));
    const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    let inked = 0;
    for (let i = 3; i < pixels.length; i += 4) if (pixels[i] !== 0) inked++;
    if (hasData && inked > 0) result.drawn++; else result.undrawn.push(canvas.id);
  }
  const out = document.createElement('pre');
  out.id = 'zest-check';
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script>
)";

class ReportBrowser : public zest::testing::ScratchDirectoryTest {
 protected:
  void SetUp() override {
    ScratchDirectoryTest::SetUp();
    chromium_ = find_chromium();
    if (chromium_.empty()) {
      GTEST_SKIP() << "no chromium to open the pages in (install it with "
                      "tools/setup/install-deps.sh browser, or set ZEST_CHROMIUM)";
    }
  }

  ProcessResult run(const std::string& binary, const std::vector<std::string>& args) const {
    return zest::testing::run_program(binary, args, {path("stdout.txt"), path("stderr.txt")});
  }

  // Headless and offline (every host name resolves to nothing), in a profile of its own.
  ProcessResult browse(std::vector<std::string> args) const {
    std::vector<std::string> common = {
        "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--no-first-run", "--user-data-dir=" + path("profile"),
        "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=5000"};
    common.insert(common.end(), args.begin(), args.end());
    const zest::testing::OutputFiles files{path("browser.out"), path("browser.err")};
    return zest::testing::wait_for_program_within(
        zest::testing::start_program(chromium_, common, files), files, std::chrono::seconds(60));
  }

  // Opens `page` with the check inserted, expects every chart drawn and no problem, and saves a
  // screenshot of the page itself as <build>/screenshots/<name>.png.
  void expect_page_draws(const std::string& page, std::size_t charts, const std::string& name) {
    std::string text = read_file(page);
    const std::size_t head = text.find("<head>");
    ASSERT_NE(head, std::string::npos);
    text.insert(head + 6, std::string("\n") + kCheck);
    const std::string checked = write("checked-" + name + ".html", text);
    const ProcessResult dom = browse({"--dump-dom", "file://" + checked});
    ASSERT_EQ(dom.status, 0) << dom.err;
    const std::size_t begin = dom.out.find("<pre id=\"zest-check\">");
    ASSERT_NE(begin, std::string::npos) << "the check never ran: " << dom.out.substr(0, 400);
    const std::size_t start = begin + std::string("<pre id=\"zest-check\">").size();
    std::string found = dom.out.substr(start, dom.out.find("</pre>", start) - start);
    // The DOM dump writes the text's & < > as entities; the JSON had none of its own.
    for (const auto& [entity, c] : {std::pair{"&lt;", "<"}, {"&gt;", ">"}, {"&amp;", "&"}}) {
      for (std::size_t at = found.find(entity); at != std::string::npos; at = found.find(entity)) {
        found.replace(at, std::string(entity).size(), c);
      }
    }
    const nlohmann::json result = nlohmann::json::parse(found);
    EXPECT_EQ(result["canvases"], charts) << result.dump();
    EXPECT_EQ(result["drawn"], charts) << result.dump();
    EXPECT_TRUE(result["problems"].empty()) << result.dump();

    std::filesystem::create_directories(kScreenshots);
    const std::filesystem::path png = kScreenshots / (name + ".png");
    std::filesystem::remove(png);
    const ProcessResult shot =
        browse({"--window-size=1280,2400", "--screenshot=" + png.string(), "file://" + page});
    ASSERT_EQ(shot.status, 0) << shot.err;
    ASSERT_TRUE(std::filesystem::exists(png)) << shot.err;
    EXPECT_GT(std::filesystem::file_size(png), 20000u) << "an empty screenshot";
  }

  std::string chromium_;
};

TEST_F(ReportBrowser, RunReportDrawsEveryChart) {
  // fp16 for the loss-scale chart, a trace for the timeline, evaluations for validation loss.
  const ProcessResult train =
      run(kTrain, {"--config", kMlpConfig, "--set", "steps=40", "--set", "eval_every=10",
                   "--set", "fp16.enabled=true", "--set", "log.trace=" + path("trace.json"),
                   "--metrics", path("run.jsonl"), "--report", path("run.html")});
  ASSERT_EQ(train.status, 0) << train.err;
  expect_page_draws(path("run.html"), 8, "run_report");
}

TEST_F(ReportBrowser, EstimatePageDrawsEveryChart) {
  const ProcessResult estimate =
      run(kEstimate, {"--config", kGptConfig, "--fit", "--html", path("plan.html")});
  ASSERT_EQ(estimate.status, 0) << estimate.err;
  expect_page_draws(path("plan.html"), 2, "estimate");
}

}  // namespace
