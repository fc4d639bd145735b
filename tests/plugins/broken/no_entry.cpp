// A real shared library that was not built with AMPKIT_PLUGIN: it has code but no ampkit entry.
extern "C" __attribute__((visibility("default"))) int ampkit_test_not_a_plugin(int x) {
  return x + 1;
}
