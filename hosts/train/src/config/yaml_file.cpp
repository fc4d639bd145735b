// Reading --config's file with yaml-cpp, around yaml-cpp 0.7's LoadAll (Debian 12's): on some
// malformed streams it never returns and allocates until the machine runs out of memory. After a
// stray ',' every HandleNextDocument reports one more empty document without consuming any input
// (jbeder/yaml-cpp#1040; fixed upstream by #1319, "leave at first empty root"). So the documents
// are counted with the parser's own event API, which stops as soon as a document starts where the
// previous one did, and the one document is then read with Load.
#include "config/yaml_file.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/mark.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "ampkit/error.h"

namespace ampkit {

namespace {

// Records where each document starts; ignores the rest of the events.
class DocumentStarts final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
  }
  void OnMapEnd() override {}
};

// The number of documents in `text`; Error(usage) when the parser stops consuming input.
size_t count_documents(const std::string& text, const std::string& file) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  while (parser.HandleNextDocument(starts)) {
    const size_t n = starts.marks.size();
    if (n >= 2 && starts.marks[n - 1].pos == starts.marks[n - 2].pos)
      throw Error(ErrorCategory::usage, "config file " + file +
                                            " is not valid YAML: unexpected character at line " +
                                            std::to_string(starts.marks[n - 1].line + 1) + ", column " +
                                            std::to_string(starts.marks[n - 1].column + 1));
  }
  return starts.marks.size();
}

}  // namespace

YAML::Node load_config_yaml(const std::string& file) {
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw Error(ErrorCategory::usage, "config file " + file + " cannot be read: " + ec.message());
  if (ec || !std::filesystem::exists(status))
    throw Error(ErrorCategory::usage, "config file " + file + " does not exist");
  if (!std::filesystem::is_regular_file(status))
    throw Error(ErrorCategory::usage, "config file " + file + " is not a regular file");
  std::ifstream in(file, std::ios::binary);
  std::string text;
  try {  // a read error (EIO: /proc/self/mem, a failing disk) is thrown by the stream buffer itself
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception&) {
    throw Error(ErrorCategory::usage, "config file " + file + " cannot be read: " + std::strerror(errno));
  }
  if (!in.is_open() || in.bad()) throw Error(ErrorCategory::usage, "config file " + file + " cannot be read");
  try {
    const size_t documents = count_documents(text, file);
    if (documents > 1)
      throw Error(ErrorCategory::usage, "config file " + file + " holds " + std::to_string(documents) +
                                            " YAML documents; give one (its '---' separators split them)");
    return documents == 0 ? YAML::Node() : YAML::Load(text);
  } catch (const YAML::DeepRecursion&) {
    throw Error(ErrorCategory::usage, "config file " + file + " is nested too deeply to be a configuration");
  } catch (const YAML::Exception& e) {
    throw Error(ErrorCategory::usage, "config file " + file + " is not valid YAML: " + e.what());
  }
}

}  // namespace ampkit
