"""ampkit-train's --config file that fails while it is read (EIO: /proc/self/mem reads its own
address 0, as a failing disk would) is a usage error naming the file, not exit 1 "internal error"."""

import os
import subprocess

BUILD = os.path.abspath(
    os.environ.get("AMPKIT_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
)


def test_a_config_file_whose_read_fails_is_named_with_exit_2():
    run = subprocess.run(
        [os.path.join(BUILD, "bin", "ampkit-train"), "--config", "/proc/self/mem", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr == "ampkit-train: error: config file /proc/self/mem cannot be read: Input/output error\n"
