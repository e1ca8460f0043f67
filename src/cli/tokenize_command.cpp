// cli/tokenize_command.cpp — `splitflow tokenize`: text -> ids (or ids -> text with --decode).
// --input-file takes one JSON value per line (a string to encode, or an array of ids with
// --decode) and prints one result line per input line, so tests can check thousands of strings
// in one process.
#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>

namespace splitflow::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string tokenizer;
  std::string text;
  std::string input_file;
  bool add_special = false;
  bool decode = false;
  bool skip_special = false;
};

std::string ids_line(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ' ';
    line += std::to_string(ids[i]);
  }
  return line;
}

std::string decode_line(const Tokenizer& tokenizer, const nlohmann::json& value, const std::string& where,
                        bool skip_special) {
  SF_CHECK(value.is_array(), "{}: --decode expects a JSON array of token ids", where);
  std::vector<int32_t> ids;
  for (const auto& id : value) {
    SF_CHECK(id.is_number_integer(), "{}: token id {} is not an integer", where, id.dump());
    ids.push_back(id.get<int32_t>());
  }
  return nlohmann::json(tokenizer.decode(ids, skip_special)).dump();
}

void run_tokenize(const TokenizeOptions& options) {
  const auto tokenizer = load_tokenizer_for_model(options.model, options.tokenizer);
  if (options.input_file.empty()) {
    if (options.decode) {
      nlohmann::json value;
      try {
        value = nlohmann::json::parse(options.text);
      } catch (const nlohmann::json::exception&) {
        fail("--text with --decode must be a JSON array of ids, got '{}'", options.text);
      }
      fmt::print("{}\n", decode_line(*tokenizer, value, "--text", options.skip_special));
    } else {
      fmt::print("{}\n", ids_line(tokenizer->encode(options.text, options.add_special)));
    }
    return;
  }
  std::ifstream in(options.input_file);
  SF_CHECK(in.good(), "cannot open --input-file '{}'", options.input_file);
  std::string line, out;
  for (size_t number = 1; std::getline(in, line); ++number) {
    const std::string where = fmt::format("'{}' line {}", options.input_file, number);
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& error) {
      fail("{}: not a JSON value: {}", where, error.what());
    }
    if (options.decode) {
      out += decode_line(*tokenizer, value, where, options.skip_special);
    } else {
      SF_CHECK(value.is_string(), "{}: expected a JSON string", where);
      out += ids_line(tokenizer->encode(value.get<std::string>(), options.add_special));
    }
    out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  auto* command = app.add_subcommand("tokenize", "Print the token ids of a text (or the text of ids with --decode)");
  command->add_option("--model", options->model, "HF model directory, GGUF file or llama2.c checkpoint")->required();
  command->add_option("--tokenizer", options->tokenizer,
                      "tokenizer to use instead of the model's (tokenizer.json, .gguf or llama2.c tokenizer .bin)");
  auto* text = command->add_option("--text", options->text, "text to encode");
  auto* file = command->add_option("--input-file", options->input_file,
                                   "one JSON string per line (JSON array of ids with --decode); one output line each");
  text->excludes(file);
  command->add_flag("--add-special", options->add_special, "add the BOS/EOS (CLS/SEP) the tokenizer asks for");
  command->add_flag("--decode", options->decode, "decode JSON arrays of ids to JSON strings instead");
  command->add_flag("--skip-special", options->skip_special, "with --decode: drop special tokens");
  command->callback([options] { run_tokenize(*options); });
}

}  // namespace splitflow::cli
