// Reads a plugin file's identity from ELF (no plugin code runs) and checks it against the host.
#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "ampkit/plugin.h"
#include "ampkit/registry.h"

namespace fs = std::filesystem;

namespace ampkit {

namespace {

[[noreturn]] void fail(const fs::path& file, const std::string& what) {
  throw Error(ErrorCategory::plugin, "plugin file " + file.string() + ": " + what);
}

// A bounds-checked reader of an ELF64 file's sections and symbols: every offset and size is
// checked against the file, so a truncated or hostile file yields an error, never a crash.
class ElfFile {
 public:
  explicit ElfFile(const fs::path& file) : file_(file), in_(file, std::ios::binary) {
    if (!in_) fail(file_, "cannot be opened");
    in_.seekg(0, std::ios::end);
    size_ = static_cast<uint64_t>(in_.tellg());
    Elf64_Ehdr eh;
    read_at(0, &eh, sizeof eh);
    if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shstrndx >= eh.e_shnum)
      fail(file_, "has a malformed ELF section table");
    sections_.resize(eh.e_shnum);
    read_at(eh.e_shoff, sections_.data(), sizeof(Elf64_Shdr) * eh.e_shnum);
    names_ = content(sections_[eh.e_shstrndx], "section-name table", 1u << 20);
    check_segments(eh);
  }

  // Index of the section called `wanted`, or 0 (SHN_UNDEF) when there is none.
  size_t index_of(const std::string& wanted) const {
    for (size_t i = 1; i < sections_.size(); ++i)
      if (name_at(names_, sections_[i].sh_name) == wanted) return i;
    return 0;
  }

  std::optional<std::string> section(const std::string& wanted) {
    const size_t i = index_of(wanted);
    if (i == 0) return std::nullopt;
    return content(sections_[i], "'" + wanted + "' section", 1u << 16);
  }

  // Default-visibility symbols defined in section `wanted`, from .dynsym (what a stripped
  // library keeps) and .symtab, each name once.
  std::vector<std::string> symbols_in(const std::string& wanted) {
    std::vector<std::string> out;
    const size_t target = index_of(wanted);
    if (target == 0) return out;
    for (const auto& s : sections_) {
      if (s.sh_type != SHT_DYNSYM && s.sh_type != SHT_SYMTAB) continue;
      if (s.sh_entsize != sizeof(Elf64_Sym) || s.sh_link >= sections_.size())
        fail(file_, "has a malformed ELF symbol table");
      const std::string table = content(s, "symbol table", 1u << 26);
      const std::string strings = content(sections_[s.sh_link], "symbol-name table", 1u << 26);
      for (size_t off = 0; off + sizeof(Elf64_Sym) <= table.size(); off += sizeof(Elf64_Sym)) {
        Elf64_Sym sym;
        std::memcpy(&sym, table.data() + off, sizeof sym);
        if (sym.st_shndx != target || ELF64_ST_VISIBILITY(sym.st_other) != STV_DEFAULT) continue;
        const std::string name = name_at(strings, sym.st_name);
        if (!name.empty() && std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
      }
    }
    return out;
  }

 private:
  static std::string name_at(const std::string& table, uint64_t offset) {
    if (offset >= table.size()) return "";
    const char* start = table.data() + offset;
    return std::string(start, strnlen(start, table.size() - offset));
  }

  // The program headers the dynamic loader maps and protects, checked before it sees them: the
  // probe's child and the host must load a file alike, and a segment that reaches past its
  // mapping (a GNU_RELRO range larger than its LOAD segment makes mprotect hit what follows) can
  // pass in a short-lived child and crash the host long after the load.
  void check_segments(const Elf64_Ehdr& eh) {
    if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phnum > 256)
      fail(file_, "has a malformed ELF program header table");
    std::vector<Elf64_Phdr> segments(eh.e_phnum);
    read_at(eh.e_phoff, segments.data(), sizeof(Elf64_Phdr) * eh.e_phnum);
    std::vector<const Elf64_Phdr*> loads;
    for (const Elf64_Phdr& s : segments) {
      if (s.p_type != PT_LOAD) continue;
      if (s.p_filesz > s.p_memsz || s.p_offset > size_ || s.p_filesz > size_ - s.p_offset ||
          s.p_memsz > (uint64_t{1} << 40) || (s.p_align > 1 && (s.p_align & (s.p_align - 1)) != 0) ||
          (s.p_align > 1 && (s.p_vaddr - s.p_offset) % s.p_align != 0))
        fail(file_, "has a malformed ELF LOAD segment (offset, sizes or alignment)");
      if (!loads.empty() && s.p_vaddr < loads.back()->p_vaddr + loads.back()->p_memsz)
        fail(file_, "has ELF LOAD segments that overlap or are out of order");
      loads.push_back(&s);
    }
    if (loads.empty()) fail(file_, "has no ELF LOAD segment");
    const auto inside_a_load = [&](const Elf64_Phdr& s) {
      return std::any_of(loads.begin(), loads.end(), [&](const Elf64_Phdr* l) {
        return s.p_vaddr >= l->p_vaddr && s.p_memsz <= l->p_memsz &&
               s.p_vaddr - l->p_vaddr <= l->p_memsz - s.p_memsz;
      });
    };
    for (const Elf64_Phdr& s : segments) {
      // (TLS is not checked: its .tbss part lies beside its LOAD segment by design.)
      const char* name = s.p_type == PT_GNU_RELRO ? "GNU_RELRO"
                         : s.p_type == PT_DYNAMIC ? "DYNAMIC"
                                                  : nullptr;
      if (name != nullptr && !inside_a_load(s))
        fail(file_, std::string("has an ELF ") + name + " segment that reaches outside its LOAD segment");
    }
  }

  void read_at(uint64_t offset, void* out, uint64_t n) {
    if (offset > size_ || n > size_ - offset)
      fail(file_, "is truncated or malformed (ELF offsets point past the end)");
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
    if (!in_) fail(file_, "could not be read");
  }

  std::string content(const Elf64_Shdr& s, const std::string& what, uint64_t limit) {
    if (s.sh_type == SHT_NOBITS || s.sh_size > limit) fail(file_, "has a malformed " + what);
    std::string data(s.sh_size, '\0');
    read_at(s.sh_offset, data.data(), data.size());
    return data;
  }

  fs::path file_;
  std::ifstream in_;
  uint64_t size_ = 0;
  std::vector<Elf64_Shdr> sections_;
  std::string names_;
};

}  // namespace

namespace {

// A readable 64-bit little-endian ELF shared library for this CPU, or one line saying what it is.
void check_elf_header(const fs::path& file) {
  std::error_code ec;
  const auto status = fs::status(file, ec);
  if (ec || !fs::exists(status)) fail(file, "does not exist");
  if (!fs::is_regular_file(status)) fail(file, "is not a regular file");
  char magic[5] = {};
  {
    std::ifstream in(file, std::ios::binary);
    if (!in) fail(file, "cannot be opened (permission denied?)");
    in.read(magic, 5);
    if (in.gcount() < 5 || std::string(magic, 4) !=
                               "\x7f"
                               "ELF")
      fail(file, "is not an ELF shared library");
    if (magic[4] != ELFCLASS64) fail(file, "is a 32-bit ELF file; ampkit plugins are 64-bit");
  }
  Elf64_Ehdr eh{};
  std::ifstream in(file, std::ios::binary);
  in.read(reinterpret_cast<char*>(&eh), sizeof eh);
  if (!in || eh.e_type != ET_DYN) fail(file, "is an ELF file but not a shared library");
#if defined(__x86_64__)
  constexpr uint16_t kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
  constexpr uint16_t kHostMachine = EM_AARCH64;
#else
  constexpr uint16_t kHostMachine = EM_NONE;  // unchecked; dlopen will refuse a foreign file
#endif
  if (eh.e_ident[EI_DATA] != ELFDATA2LSB || (kHostMachine != EM_NONE && eh.e_machine != kHostMachine))
    fail(file, "is built for another CPU (ELF machine " + std::to_string(eh.e_machine) + ")");
}

// The one ampkit_v<abi>_<kind>_<name> symbol of the file's 'ampkit' section.
std::string plugin_entry(const fs::path& file, ElfFile& elf) {
  std::vector<std::string> entries;
  for (const auto& s : elf.symbols_in("ampkit"))
    if (s.rfind("ampkit_v", 0) == 0) entries.push_back(s);
  if (entries.empty())
    fail(file,
         "has no ampkit plugin entry (no ampkit_v<abi>_<kind>_<name> symbol in ELF section "
         "'ampkit'); it was not built with AMPKIT_PLUGIN");
  if (entries.size() > 1)
    fail(file, "exports " + std::to_string(entries.size()) + " ampkit entries; a plugin file holds one");
  return entries.front();
}

// The key=value lines of the metadata section into `info`.
void read_metadata(const fs::path& file, const std::string& meta, PluginInfo& info) {
  std::map<std::string, std::string> fields;
  std::istringstream lines(meta.substr(0, meta.find('\0')));
  std::string line;
  while (std::getline(lines, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  auto field = [&](const std::string& key) {
    auto it = fields.find(key);
    if (it == fields.end()) fail(file, "metadata lacks '" + key + "'");
    return it->second;
  };
  try {
    info.abi_version = std::stoi(field("abi"));
    info.cxx11_abi = std::stoi(field("cxx11_abi"));
  } catch (const std::logic_error&) {
    fail(file, "has malformed metadata (abi or cxx11_abi is not a number)");
  }
  info.kind = field("kind");
  info.name = field("name");
  info.version = field("version");
  info.summary = field("summary");
  info.torch_version = field("torch");
  info.compiler = field("compiler");
}

// The layout record this host expects from a plugin of `kind` (ampkit/layout.h).
std::string host_layout(const std::string& kind) {
  detail::LayoutText t{};
  if (kind == "scaler") t = detail::plugin_layout<interface_of::scaler>();
  if (kind == "clipper") t = detail::plugin_layout<interface_of::clipper>();
  if (kind == "nan_policy") t = detail::plugin_layout<interface_of::nan_policy>();
  if (kind == "comm") t = detail::plugin_layout<interface_of::comm>();
  if (kind == "fp8_recipe") t = detail::plugin_layout<interface_of::fp8_recipe>();
  return std::string(t.text, t.size);
}

// "StepStats" -> its line ("StepStats 168 0,8,...") in a layout record.
std::map<std::string, std::string> layout_lines(const std::string& record) {
  std::map<std::string, std::string> lines;
  std::istringstream in(record);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines[line.substr(0, line.find(' '))] = line;
  return lines;
}

// A plugin built against headers whose boundary types differ from the host's (a field added
// without an ABI bump) would misread every value; refuse it naming the first differing type.
void check_layout(const PluginInfo& info) {
  const std::string file = "plugin file " + info.path.string();
  if (info.layout.empty())
    throw Error(ErrorCategory::plugin,
                file + " has no '" AMPKIT_PLUGIN_LAYOUT_SECTION
                       "' layout record; it was not built with AMPKIT_PLUGIN of this SDK");
  const auto theirs = layout_lines(info.layout);
  for (const auto& [type, line] : layout_lines(host_layout(info.kind))) {
    const auto it = theirs.find(type);
    if (it == theirs.end() || it->second != line)
      throw Error(ErrorCategory::plugin, file + " was built with another layout of " + type + " (plugin: '" +
                                             (it == theirs.end() ? "absent" : it->second) + "', host: '" +
                                             line + "') under the same ABI " +
                                             std::to_string(AMPKIT_ABI_VERSION) +
                                             "; rebuild the plugin against this ampkit SDK");
  }
}

}  // namespace

PluginInfo inspect_plugin_file(const fs::path& file) {
  check_elf_header(file);
  ElfFile elf(file);
  PluginInfo info;
  info.path = file;
  info.entry = plugin_entry(file, elf);
  const auto meta = elf.section(AMPKIT_PLUGIN_META_SECTION);
  if (!meta)
    fail(file, "has the entry " + info.entry +
                   " but no '" AMPKIT_PLUGIN_META_SECTION
                   "' metadata section; it was not built with AMPKIT_PLUGIN");
  read_metadata(file, *meta, info);
  if (const auto layout = elf.section(AMPKIT_PLUGIN_LAYOUT_SECTION))
    info.layout = layout->substr(0, layout->find('\0'));
  const std::string expected_entry =
      "ampkit_v" + std::to_string(info.abi_version) + "_" + info.kind + "_" + info.name;
  if (info.entry != expected_entry)
    fail(file, "entry " + info.entry + " does not match its metadata (" + expected_entry + ")");
  return info;
}

void check_compatible(const PluginInfo& info) {
  const std::string host_abi = std::to_string(AMPKIT_ABI_VERSION);
  if (info.abi_version != AMPKIT_ABI_VERSION || info.torch_version != AMPKIT_TORCH_VERSION)
    throw Error(ErrorCategory::plugin, "plugin file " + info.path.string() + " was built for ampkit ABI " +
                                           std::to_string(info.abi_version) + " / torch " +
                                           info.torch_version + ", host has ABI " + host_abi +
                                           " / torch " AMPKIT_TORCH_VERSION
                                           "; rebuild the plugin against this ampkit SDK");
  if (info.cxx11_abi != AMPKIT_CXX11_ABI)
    throw Error(ErrorCategory::plugin,
                "plugin file " + info.path.string() + " was built with _GLIBCXX_USE_CXX11_ABI=" +
                    std::to_string(info.cxx11_abi) + ", host uses " + std::to_string(AMPKIT_CXX11_ABI));
  if (find_kind(info.kind) == nullptr)
    throw Error(ErrorCategory::plugin, "plugin file " + info.path.string() + " is of unknown kind '" +
                                           info.kind + "' (kinds: " + kind_names() + ")");
  if (!info.is_static) check_layout(info);
}

std::string untrusted_reason(const fs::path& file) {
  auto problem = [](const fs::path& p, const char* what) -> std::string {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return std::string(what) + " " + p.string() + " cannot be inspected";
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      return std::string(what) + " " + p.string() + " is writable by group or others (mode " + mode +
             "; fix: chmod go-w " + p.string() + ")";
    }
    if (st.st_uid != ::geteuid() && st.st_uid != 0)
      return std::string(what) + " " + p.string() + " is owned by another user (uid " +
             std::to_string(st.st_uid) + ")";
    return "";
  };
  // Judge what would be loaded: through a symlink, that is the target and the target's folder.
  std::error_code ec;
  const fs::path real = fs::canonical(file, ec);
  const fs::path target = ec ? fs::absolute(file) : real;
  std::string why = problem(target, "the file");
  if (why.empty()) why = problem(target.parent_path(), "its folder");
  return why;
}

std::string check_trusted(const fs::path& file, bool allow_untrusted, const std::string& override_name) {
  return check_trusted(file, file, allow_untrusted, override_name);
}

std::string check_trusted(const fs::path& file, const fs::path& opened, bool allow_untrusted,
                          const std::string& override_name) {
  const std::string why = untrusted_reason(opened);
  if (why.empty()) return "";
  if (!allow_untrusted)
    throw Error(ErrorCategory::plugin, "refusing untrusted plugin " + file.string() + ": " + why + "; " +
                                           override_name + " overrides");
  const std::string warning =
      "loading untrusted plugin " + file.string() + ": " + why + " (allowed by " + override_name + ")";
  std::cerr << "ampkit: WARNING: " << warning << "\n";
  return warning;
}

}  // namespace ampkit
