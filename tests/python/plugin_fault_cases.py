"""The one list of plugin faults both hosts are held to: ampkit-train and ampkit.GradScaler
load the same broken plugins (tests/plugins/broken) and must give the same line, Python's as a
PluginError where the interpreter can go on, as exit 3 where it cannot. test_plugin_faults.py runs
each case in both hosts; docs/python.md's fault table is checked against this list."""

from typing import NamedTuple, Optional


class Fault(NamedTuple):
    defect: str  # the fault's name (P1, P2, ...), as in docs/python.md's table
    kind: str  # scaler | nan_policy
    plugin: str  # the broken plugin's name; its file is <folder>/libampkit-<kind>-<plugin>.so
    folder: str  # under build/tests/broken-plugins
    call: str  # the call the line names
    message: str  # what both hosts' line says (after "<program>: error: ")
    python: str  # "PluginError" (the interpreter goes on) or "exit 3"
    open_in_python: Optional[str] = None  # why Python does not give it yet (None: it does)


FAULTS = [
    Fault("P1, P2", "scaler", "init_throw_int", "after/init_throw_int", "while being loaded",
          "threw something that is not a std::exception while being loaded", "PluginError"),
    Fault("P3", "scaler", "create_hang", "faults/hang", "its constructor",
          "did not return (time limit reached) in its constructor", "exit 3"),
    Fault("P3", "scaler", "update_hang", "after/update_hang", "update()",
          "did not return (time limit reached) in update()", "exit 3"),
    Fault("P3", "nan_policy", "decide_hang", "after/decide_hang", "decide()",
          "did not return (time limit reached) in decide()", "exit 3"),
    Fault("P4", "scaler", "create_os_exit", "faults/os_exit", "its constructor",
          "called _exit() in its constructor", "exit 3"),
    Fault("P5", "scaler", "thread_segv", "after/thread_segv", "its own thread",
          "crashed (SIGSEGV, invalid memory access) outside any plugin call", "exit 3"),
    Fault("P5", "scaler", "thread_exit", "after/thread_exit", "its own thread",
          "exit() was called outside any plugin call", "exit 3"),
]
