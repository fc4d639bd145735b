// Fuzz target: files given to --init-from (read_pytorch_file: the zip archive torch.save writes,
// then the restricted unpickler). A first byte of 'z' makes the rest the archive's data.pkl inside
// a valid archive (what the unpickler sees); anything else is the whole file.
#include <caffe2/serialize/inline_container.h>

#include "ampkit/pytorch_state.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::filesystem::path file;
  if (size > 0 && data[0] == 'z') {
    file = ampkit::fuzz::scratch() / "archive.pt";
    caffe2::serialize::PyTorchStreamWriter writer(file.string());
    writer.writeRecord("byteorder", "little", 6);
    writer.writeRecord("data.pkl", data + 1, size - 1);
    writer.writeRecord("data/0", "\0\0\0\0\0\0\0\0", 8);  // one storage: 2 floats or 1 double
    writer.writeEndOfFile();
  } else {
    file = ampkit::fuzz::write_file("file.pt", data, size);
  }
  ampkit::fuzz::refuse_only_with_error(
      [&] { (void)ampkit::read_pytorch_file(file, "--init-from " + file.string()); });
  return 0;
}
