// The loaded plugin's image (plugin_image.h): its dynamic section and segments as the dynamic
// linker mapped them (dlinfo + dl_iterate_phdr), never the file on disk, which may have changed.
#include "plugin_image.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace ampkit::detail {

namespace {

#if defined(__x86_64__)
constexpr bool kKnownMachine = true;
constexpr uint64_t kJumpSlot = R_X86_64_JUMP_SLOT, kGlobalData = R_X86_64_GLOB_DAT, kAbsolute = R_X86_64_64;
#elif defined(__aarch64__)
constexpr bool kKnownMachine = true;
constexpr uint64_t kJumpSlot = R_AARCH64_JUMP_SLOT, kGlobalData = R_AARCH64_GLOB_DAT,
                   kAbsolute = R_AARCH64_ABS64;
#else
constexpr bool kKnownMachine = false;
constexpr uint64_t kJumpSlot = ~0ull, kGlobalData = ~0ull, kAbsolute = ~0ull;
#endif

#if __ELF_NATIVE_CLASS == 64
uint64_t relocation_type(const ElfW(Rela) & r) {
  return ELF64_R_TYPE(r.r_info);
}
size_t relocation_symbol(const ElfW(Rela) & r) {
  return ELF64_R_SYM(r.r_info);
}
#else
uint64_t relocation_type(const ElfW(Rela) & r) {
  return ELF32_R_TYPE(r.r_info);
}
size_t relocation_symbol(const ElfW(Rela) & r) {
  return ELF32_R_SYM(r.r_info);
}
#endif

// The object as mapped: its load bias (l_addr) and program headers.
struct Image {
  ElfW(Addr) bias = 0;
  const ElfW(Phdr) * phdr = nullptr;
  ElfW(Half) phnum = 0;
  ElfW(Addr) low = ~ElfW(Addr){0}, high = 0;  // the span of its PT_LOAD segments, in memory

  const ElfW(Phdr) * segment(ElfW(Word) type) const {
    for (ElfW(Half) i = 0; i < phnum; ++i)
      if (phdr[i].p_type == type) return &phdr[i];
    return nullptr;
  }
  // A dynamic-section address: glibc relocates them in place unless .dynamic is read-only, so
  // one already inside the image is taken as it is and any other is a file address.
  ElfW(Addr) address(ElfW(Addr) value) const { return value >= low && value < high ? value : bias + value; }
};

bool find_image(void* handle, Image& image) {
  link_map* map = nullptr;
  if (handle == nullptr || ::dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr) return false;
  struct Search {
    const link_map* map;
    Image* image;
    bool found;
  } search{map, &image, false};
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        if (info->dlpi_addr != s->map->l_addr || info->dlpi_name == nullptr ||
            std::strcmp(info->dlpi_name, s->map->l_name) != 0)
          return 0;
        s->image->bias = info->dlpi_addr;
        s->image->phdr = info->dlpi_phdr;
        s->image->phnum = info->dlpi_phnum;
        s->found = true;
        return 1;
      },
      &search);
  if (!search.found) return false;
  for (ElfW(Half) i = 0; i < image.phnum; ++i) {
    const ElfW(Phdr)& p = image.phdr[i];
    if (p.p_type != PT_LOAD) continue;
    image.low = std::min(image.low, image.bias + p.p_vaddr);
    image.high = std::max(image.high, image.bias + p.p_vaddr + p.p_memsz);
  }
  return image.low < image.high;
}

// What the relocation walk needs from the dynamic section.
struct DynamicTables {
  const ElfW(Sym) * symbols = nullptr;
  const char* strings = nullptr;
  size_t strings_size = 0;
  const ElfW(Rela) * rela = nullptr;  // DT_RELA: GLOB_DAT and absolute references
  size_t rela_size = 0;
  const ElfW(Rela) * plt = nullptr;  // DT_JMPREL: the PLT's slots (DT_PLTREL must be DT_RELA)
  size_t plt_size = 0;
};

bool read_dynamic(const Image& image, DynamicTables& t) {
  const ElfW(Phdr)* dynamic = image.segment(PT_DYNAMIC);
  if (dynamic == nullptr) return false;
  bool plt_is_rela = true;
  for (auto* d = reinterpret_cast<const ElfW(Dyn)*>(image.bias + dynamic->p_vaddr); d->d_tag != DT_NULL;
       ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB:
        t.symbols = reinterpret_cast<const ElfW(Sym)*>(image.address(d->d_un.d_ptr));
        break;
      case DT_STRTAB:
        t.strings = reinterpret_cast<const char*>(image.address(d->d_un.d_ptr));
        break;
      case DT_STRSZ:
        t.strings_size = d->d_un.d_val;
        break;
      case DT_RELA:
        t.rela = reinterpret_cast<const ElfW(Rela)*>(image.address(d->d_un.d_ptr));
        break;
      case DT_RELASZ:
        t.rela_size = d->d_un.d_val;
        break;
      case DT_JMPREL:
        t.plt = reinterpret_cast<const ElfW(Rela)*>(image.address(d->d_un.d_ptr));
        break;
      case DT_PLTRELSZ:
        t.plt_size = d->d_un.d_val;
        break;
      case DT_PLTREL:
        plt_is_rela = d->d_un.d_val == DT_RELA;
        break;
    }
  }
  if (!plt_is_rela) t.plt = nullptr;
  return t.symbols != nullptr && t.strings != nullptr;
}

// Writes `target` into the slot; a slot the dynamic linker made read-only after relocating (the
// pages of PT_GNU_RELRO it protects: both ends rounded down to a page) is opened for the write.
bool write_slot(const Image& image, ElfW(Addr) slot, void* target) {
  const ElfW(Addr) page_size = static_cast<ElfW(Addr)>(::sysconf(_SC_PAGESIZE));
  const ElfW(Addr) page = slot & ~(page_size - 1);
  bool read_only = false;
  if (const ElfW(Phdr)* relro = image.segment(PT_GNU_RELRO)) {
    const ElfW(Addr) begin = (image.bias + relro->p_vaddr) & ~(page_size - 1);
    const ElfW(Addr) end = (image.bias + relro->p_vaddr + relro->p_memsz) & ~(page_size - 1);
    read_only = page >= begin && page < end;
  }
  auto* p = reinterpret_cast<void*>(page);
  if (read_only && ::mprotect(p, page_size, PROT_READ | PROT_WRITE) != 0) return false;
  __atomic_store_n(reinterpret_cast<void**>(slot), target, __ATOMIC_RELEASE);  // one aligned word
  if (read_only) ::mprotect(p, page_size, PROT_READ);
  return true;
}

size_t rebind_table(const Image& image, const DynamicTables& t, const ElfW(Rela) * table, size_t bytes,
                    const Rebinding* rebindings, size_t count) {
  size_t rewritten = 0;
  for (size_t i = 0; table != nullptr && i < bytes / sizeof(ElfW(Rela)); ++i) {
    const ElfW(Rela)& r = table[i];
    const uint64_t type = relocation_type(r);
    if ((type != kJumpSlot && type != kGlobalData && type != kAbsolute) || r.r_addend != 0) continue;
    const ElfW(Sym)& symbol = t.symbols[relocation_symbol(r)];
    if (symbol.st_shndx != SHN_UNDEF || symbol.st_name == 0 || symbol.st_name >= t.strings_size) continue;
    const char* name = t.strings + symbol.st_name;
    for (size_t k = 0; k < count; ++k)
      if (std::strcmp(name, rebindings[k].name) == 0 &&
          write_slot(image, image.bias + r.r_offset, rebindings[k].target))
        ++rewritten;
  }
  return rewritten;
}

// The executable segments of the objects passed to record_plugin_code; the count is published
// after the entry is written, so a signal handler reads only complete entries.
struct CodeRange {
  uintptr_t begin, end;
};
constexpr size_t kMaxCodeRanges = 64;
CodeRange g_code[kMaxCodeRanges];
std::atomic<size_t> g_code_count{0};

}  // namespace

size_t rebind_references(void* handle, const Rebinding* rebindings, size_t count) {
  Image image;
  DynamicTables t;
  if (!kKnownMachine || !find_image(handle, image) || !read_dynamic(image, t)) return 0;
  return rebind_table(image, t, t.rela, t.rela_size, rebindings, count) +
         rebind_table(image, t, t.plt, t.plt_size, rebindings, count);
}

void record_plugin_code(void* handle) {
  static std::mutex adding;
  const std::lock_guard<std::mutex> lock(adding);
  Image image;
  if (!find_image(handle, image)) return;
  for (ElfW(Half) i = 0; i < image.phnum; ++i) {
    const ElfW(Phdr)& p = image.phdr[i];
    if (p.p_type != PT_LOAD || (p.p_flags & PF_X) == 0) continue;
    const CodeRange range{image.bias + p.p_vaddr, image.bias + p.p_vaddr + p.p_memsz};
    const size_t n = g_code_count.load(std::memory_order_relaxed);
    bool known = false;
    for (size_t k = 0; k < n; ++k)
      known = known || (g_code[k].begin == range.begin && g_code[k].end == range.end);
    if (known || n == kMaxCodeRanges) continue;
    g_code[n] = range;
    g_code_count.store(n + 1, std::memory_order_release);
  }
}

bool is_plugin_code(uintptr_t pc) noexcept {
  const size_t n = g_code_count.load(std::memory_order_acquire);
  for (size_t k = 0; k < n; ++k)
    if (pc >= g_code[k].begin && pc < g_code[k].end) return true;
  return false;
}

}  // namespace ampkit::detail
