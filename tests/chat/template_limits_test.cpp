// The limits every render runs under (chat/template_limits.h): hostile templates fail fast with a
// TemplateLimitError naming the limit they reached, in bounded memory, and never crash; real
// templates render as before under the defaults and fail by the same checks when limits are small.
#include "chat/chat_template.h"
#include "core/error.h"

#include "chat/fixture_cases.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>

namespace splitflow {
namespace {

const nlohmann::json kOneUserMessage = nlohmann::json::parse(R"([{"role": "user", "content": "hi"}])");

// The process's peak resident memory so far.
long peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;
}

// The message of the TemplateLimitError that rendering `chat_template` throws, or a test failure.
std::string limit_error(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) {
  try {
    std::string rendered = chat_template.render(messages, true, extra);
    ADD_FAILURE() << "rendered " << rendered.size() << " bytes without error";
  } catch (const TemplateLimitError& e) {
    return e.what();
  } catch (const Error& e) {
    ADD_FAILURE() << "not a TemplateLimitError: " << e.what();
  }
  return "";
}

std::string limit_error(const std::string& source, const TemplateLimits& limits = {}) {
  return limit_error(ChatTemplate(source, "", "").with_limits(limits), kOneUserMessage);
}

// "(limit NAME)" after the limit's value, as every limit message ends.
bool names_limit(const std::string& message, const std::string& name, uint64_t value) {
  return message.find(fmt::format("{}", value)) != std::string::npos &&
         message.find("(limit " + name + ")") != std::string::npos;
}

TEST(TemplateLimits, DoublingAStringFailsFastAtTheValueLimit) {
  // The template that grew to 4.6 GB in 10 s before any limit existed (issue 24).
  long rss_before = peak_rss_mib();
  auto start = std::chrono::steady_clock::now();
  std::string message = limit_error(
      "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(names_limit(message, "max_value_bytes", TemplateLimits{}.max_value_bytes)) << message;
  EXPECT_NE(message.find("line 1, column 76"), std::string::npos) << message;  // the `~`
  EXPECT_LT(seconds, 1.0);
  EXPECT_LT(peak_rss_mib() - rss_before, 200);
}

struct HostileCase {
  const char* what;
  const char* source;
  const char* limit;  // the TemplateLimits field the render must name
};

const HostileCase kHostileCases[] = {
    {"a range of 10^12", "{% for i in range(10**12) %}{% endfor %}", "max_range_items"},
    {"a string of 10^12 bytes", "{{ 'a' * 10**12 }}", "max_value_bytes"},
    {"a list of 10^12 items", "{{ ([1] * 10**12)|length }}", "max_value_bytes"},
    {"10^5 x 10^5 loop iterations",
     "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "max_steps"},
    {"10^5 x 10^5 loops printing",
     "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}", "max_steps"},
    {"recursive macros", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "max_call_depth"},
    {"recursion through caller",
     "{% macro m() %}{{ caller() }}{% endmacro %}{% macro r() %}{% call m() %}{{ r() }}{% endcall %}{% endmacro %}"
     "{{ r() }}",
     "max_call_depth"},
    {"a join with a huge separator", "{{ range(100000)|join('x' * 1000) }}", "max_value_bytes"},
    {"str.join of huge items", "{{ ''.join(['x' * 1000000] * 20) }}", "max_value_bytes"},
    {"a list grown by +", "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}"
                          "{% endfor %}",
     "max_built_bytes"},
    {"a list of distinct big strings grown by +",
     "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [['x' * 1000000 ~ i]] %}"
     "{% endfor %}",
     "max_built_bytes"},
    // Each append copies the string so far: the copies reach max_built_bytes first.
    {"a string appended to in a loop",
     "{% set ns = namespace(s='') %}{% for i in range(100000) %}{% set ns.s = ns.s ~ ('x' * 1000) %}{% endfor %}",
     "max_built_bytes"},
    {"center to a huge width", "{{ 'x'|center(10**12) }}", "max_value_bytes"},
    {"indent by a huge width", "{{ 'x\\ny'|indent(10**9) }}", "max_value_bytes"},
    {"indent of many lines", "{{ ('x\\n' * 1000000)|indent(100) }}", "max_value_bytes"},
    {"str.ljust to a huge width", "{{ 'x'.ljust(10**12) }}", "max_value_bytes"},
    {"str.zfill to a huge width", "{{ '1'.zfill(10**12) }}", "max_value_bytes"},
    {"%-format to a huge width", "{{ '%*s' % (10**12, 'a') }}", "max_value_bytes"},
    {"the format filter repeating a big value", "{{ ('%(a)s' * 1000)|format(a='x' * 100000) }}", "max_value_bytes"},
    {"str.format repeating a big value", "{{ ('{0}' * 1000).format('x' * 100000) }}", "max_value_bytes"},
    {"replace growth", "{{ ('x' * 1000000).replace('x', 'y' * 1000) }}", "max_value_bytes"},
    {"replace of the empty string", "{{ ('x' * 100000)|replace('', 'y' * 1000) }}", "max_value_bytes"},
    {"tojson of a shared huge value", "{% set a = ['x' * 1000] * 1000 %}{% set b = [a] * 1000 %}{{ b|tojson }}",
     "max_value_bytes"},
    {"tojson with a huge indent", "{{ [1]|tojson(indent=10**9) }}", "max_value_bytes"},
    {"printing a shared huge value", "{% set a = ['x' * 1000] * 1000 %}{% set b = [a] * 1000 %}{{ b }}",
     "max_value_bytes"},
    {"a string turned into a list", "{{ ('x' * 10000000)|list|length }}", "max_value_bytes"},
    {"a split into millions of parts", "{{ ('x,' * 8000000).split(',')|length }}", "max_value_bytes"},
    {"batch filled to a huge size", "{{ [1]|batch(10**12, 0)|list|length }}", "max_value_bytes"},
    {"escape of a big string", "{{ ('<' * 8000000)|escape }}", "max_value_bytes"},
    {"strftime_now with a huge format", "{{ strftime_now('%Y' * 10000000) }}", "max_value_bytes"},
    {"too much output", "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", "max_output_bytes"},
    {"a macro rendering too much",
     "{% macro m() %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endmacro %}{{ m()|length }}",
     "max_value_bytes"},
    {"a worst-case substring search", "{% set h = 'a' * 8000000 %}{% set n = 'a' * 4000000 ~ 'b' %}{{ n in h }}",
     "max_steps"},
    {"comparing big shared lists in a loop",
     "{% set l = [['x' * 10000000]] %}{% for i in range(100000) %}{% for j in range(100) %}"
     "{% if l == [l[0]] %}{% endif %}{% endfor %}{% endfor %}",
     "max_steps"},
    {"copying a big string in a loop",
     "{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{% for j in range(100) %}{% if s|length %}{% endif %}"
     "{% endfor %}{% endfor %}",
     "max_built_bytes"},
    {"lists nested in a loop",
     "{% set ns = namespace(x=none) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}",
     "max_nesting_depth"},
    {"printing a namespace that holds itself",
     "{% set ns = namespace(x=[]) %}{% set ns.x = [ns] %}{{ ns }}", "max_nesting_depth"},
    {"printing a chain of 10^5 namespaces",
     "{% set ns = namespace(cur=namespace()) %}{% set head = ns.cur %}{% for i in range(100000) %}"
     "{% set cur = ns.cur %}{% set n = namespace() %}{% set cur.next = n %}{% set ns.cur = n %}{% endfor %}{{ head }}",
     "max_nesting_depth"},
};

uint64_t default_value(const std::string& limit) {
  const TemplateLimits defaults;
  if (limit == "max_output_bytes") return defaults.max_output_bytes;
  if (limit == "max_value_bytes") return defaults.max_value_bytes;
  if (limit == "max_built_bytes") return defaults.max_built_bytes;
  if (limit == "max_steps") return defaults.max_steps;
  if (limit == "max_call_depth") return defaults.max_call_depth;
  if (limit == "max_nesting_depth") return defaults.max_nesting_depth;
  if (limit == "max_range_items") return defaults.max_range_items;
  ADD_FAILURE() << "unknown limit " << limit;
  return 0;
}

TEST(TemplateLimits, HostileTemplatesFailAtTheirLimitInBoundedMemory) {
  long rss_before = peak_rss_mib();
  for (const HostileCase& c : kHostileCases) {
    auto start = std::chrono::steady_clock::now();
    std::string message = limit_error(c.source);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_TRUE(names_limit(message, c.limit, default_value(c.limit))) << c.what << ": " << message;
    EXPECT_EQ(message.rfind("chat template error at line 1, column ", 0), 0u) << c.what << ": " << message;
    EXPECT_LT(seconds, 3.0) << c.what;
    std::printf("%-45s %6.3f s  %s\n", c.what, seconds, c.limit);
  }
  EXPECT_LT(peak_rss_mib() - rss_before, 200);
}

TEST(TemplateLimits, ExactLimitsRenderAndOneLessFails) {
  TemplateLimits limits;
  limits.max_output_bytes = 10;
  ChatTemplate ten_bytes("{{ 'x' * 10 }}", "", "");
  EXPECT_EQ(ten_bytes.with_limits(limits).render(kOneUserMessage, false), "xxxxxxxxxx");
  limits.max_output_bytes = 9;
  std::string message = limit_error(ten_bytes.with_limits(limits), kOneUserMessage);
  EXPECT_TRUE(names_limit(message, "max_output_bytes", 9)) << message;

  limits = {};
  limits.max_value_bytes = 100;
  EXPECT_EQ(ChatTemplate("{{ ('x' * 100)|length }}", "", "").with_limits(limits).render(kOneUserMessage, false),
            "100");
  message = limit_error("{{ ('x' * 101)|length }}", limits);
  EXPECT_TRUE(names_limit(message, "max_value_bytes", 100)) << message;

  limits = {};
  limits.max_range_items = 3;
  EXPECT_EQ(ChatTemplate("{{ range(3)|list }}", "", "").with_limits(limits).render(kOneUserMessage, false),
            "[0, 1, 2]");
  message = limit_error("{{ range(4)|list }}", limits);
  EXPECT_TRUE(names_limit(message, "max_range_items", 3)) << message;

  limits = {};
  limits.max_call_depth = 2;
  ChatTemplate nested("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(1) }}", "", "");
  EXPECT_EQ(nested.with_limits(limits).render(kOneUserMessage, false), "01");
  limits.max_call_depth = 1;
  message = limit_error(nested.with_limits(limits), kOneUserMessage);
  EXPECT_TRUE(names_limit(message, "max_call_depth", 1)) << message;

  limits = {};
  limits.max_nesting_depth = 3;
  EXPECT_EQ(ChatTemplate("{{ [[[1]]] }}", "", "").with_limits(limits).render(kOneUserMessage, false), "[[[1]]]");
  message = limit_error("{{ [[[[1]]]] }}", limits);
  EXPECT_TRUE(names_limit(message, "max_nesting_depth", 3)) << message;
}

ChatTemplate shared_template(const char* model) {
  return ChatTemplate::from_file(test::shared_path(std::string("models/") + model + "-tokenizer/tokenizer_config.json"));
}

nlohmann::ordered_json conversation_case(const std::string& template_name, const std::string& case_name) {
  const nlohmann::ordered_json fixture = test::load_chat_fixture("conversations.json");
  for (const auto& t : fixture["templates"]) {
    if (t["name"] != template_name) continue;
    for (const auto& c : t["cases"]) {
      if (c["name"] == case_name) return c;
    }
  }
  ADD_FAILURE() << "no fixture " << template_name << "/" << case_name;
  return {};
}

// A real template on a real conversation: each check fires when its limit is set below what the
// render needs.
TEST(TemplateLimits, SmallLimitsMakeARealTemplateFail) {
  const ChatTemplate qwen3 = shared_template("qwen3");
  const auto c = conversation_case("qwen3", "tools_and_calls");
  const std::string expected = c["expected"].get<std::string>();
  ASSERT_EQ(qwen3.render(c["messages"], c["add_generation_prompt"].get<bool>(), c["extra"]), expected);

  auto fails_at = [&](const std::string& name, uint64_t value, auto set) {
    TemplateLimits limits;
    set(limits);
    std::string message = limit_error(qwen3.with_limits(limits), c["messages"], c["extra"]);
    EXPECT_TRUE(names_limit(message, name, value)) << name << ": " << message;
  };
  fails_at("max_output_bytes", expected.size() - 1,
           [&](TemplateLimits& l) { l.max_output_bytes = expected.size() - 1; });
  fails_at("max_value_bytes", 64, [](TemplateLimits& l) { l.max_value_bytes = 64; });
  fails_at("max_built_bytes", 1024, [](TemplateLimits& l) { l.max_built_bytes = 1024; });
  fails_at("max_steps", 100, [](TemplateLimits& l) { l.max_steps = 100; });
  fails_at("max_nesting_depth", 2, [](TemplateLimits& l) { l.max_nesting_depth = 2; });

  const auto tools = conversation_case("tool_macros", "tools_and_calls");
  ChatTemplate tool_macros(test::read_file(test::fixture_path("chat/templates/tool_macros.jinja")), "<bos>", "<eos>");
  TemplateLimits no_calls;
  no_calls.max_call_depth = 0;
  std::string message = limit_error(tool_macros.with_limits(no_calls), tools["messages"], tools["extra"]);
  EXPECT_TRUE(names_limit(message, "max_call_depth", 0)) << message;
}

TEST(TemplateLimits, ReleasesWhatARenderBuilt) {
  // A namespace holding itself is a reference cycle: each render would leak its 2 MB string.
  ChatTemplate cycle("{% set ns = namespace(x=none) %}{% set ns.x = [ns, 'x' * 2000000] %}ok", "", "");
  long rss_before = peak_rss_mib();
  for (int i = 0; i < 400; ++i) ASSERT_EQ(cycle.render(kOneUserMessage, false), "ok");
  EXPECT_LT(peak_rss_mib() - rss_before, 100);
  // A chain of 10^5 namespaces is released one by one, not by a recursion 10^5 deep.
  ChatTemplate chain(
      "{% set ns = namespace(cur=namespace()) %}{% for i in range(100000) %}{% set cur = ns.cur %}"
      "{% set n = namespace() %}{% set cur.next = n %}{% set ns.cur = n %}{% endfor %}done",
      "", "");
  EXPECT_EQ(chain.render(kOneUserMessage, false), "done");
}

TEST(TemplateLimits, LimitErrorsAreErrorsNamingTheLocation) {
  ChatTemplate chat_template("line one\n{{ 'x' * 10**9 }}", "", "");
  try {
    chat_template.render(kOneUserMessage, false);
    FAIL() << "rendered";
  } catch (const Error& e) {  // what the HTTP server turns into a 400
    EXPECT_NE(dynamic_cast<const TemplateLimitError*>(&e), nullptr);
    EXPECT_EQ(std::string(e.what()),
              "chat template error at line 2, column 8: a string of 1000000000 bytes would exceed 16777216 bytes "
              "(limit max_value_bytes)");
  }
}

// printf-style formats: Python's results where they fit, a named error where a width or a value
// does not (fuzz/crashes/chat_template: a width of 22 digits overflowed int64 while it was read).
TEST(TemplateLimits, FormatWidthsAndValuesAreBounded) {
  const auto render = [](const std::string& source) {
    return ChatTemplate(source, "", "").render(kOneUserMessage, false);
  };
  EXPECT_EQ(render("{{ '%5d|%-4s|%.3f|%x' % (42, 'ab', 3.14159, 255) }}"), "   42|ab  |3.142|ff");  // as CPython
  EXPECT_EQ(render("{{ '%*d' % (6, 7) }}"), "     7");
  EXPECT_EQ(render("{{ ('%2000d' % 1)|length }}"), "2000");
  const auto error_of = [&](const std::string& source) {
    try {
      render(source);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(rendered)");
  };
  // Widths too wide for any value: the value-size limit names itself (the digits do not overflow).
  EXPECT_NE(error_of("{{ '%1113333333333333333333d' % 1 }}").find("(limit max_value_bytes)"), std::string::npos);
  EXPECT_NE(error_of("{{ '%1113333333333333333333s' % 'x' }}").find("(limit max_value_bytes)"), std::string::npos);
  EXPECT_NE(error_of("{{ '%.99999999999f' % 1.5 }}").find("(limit max_value_bytes)"), std::string::npos);
  EXPECT_NE(error_of("{{ '%d' % 1e300 }}").find("does not fit a 64-bit integer"), std::string::npos);
}

}  // namespace
}  // namespace splitflow
