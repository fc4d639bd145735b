"""ampkit-train refuses at once, with exit 2 and one line naming what is wrong: a --config file that
fails while it is read (EIO: /proc/self/mem reads its own address 0, as a failing disk would; it was
exit 1 "internal error"), a MASTER_ADDR with a newline (it was used, and the rendezvous failed with
exit 7 after --dist-timeout, its message split over two lines)."""

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


def test_a_master_address_with_a_space_or_control_character_is_refused_at_once():
    for address in ("10.0.0.2\nevil", "a b", "\t"):
        run = subprocess.run(
            [os.path.join(BUILD, "bin", "ampkit-train"), "--workload", "synthetic", "--steps", "2", "--threads", "1"],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, MASTER_ADDR=address, WORLD_SIZE="2", RANK="0"),
        )
        assert run.returncode == 2, run.stderr
        assert run.stderr == (
            "ampkit-train: error: master address (--master-addr or MASTER_ADDR) holds a space or a control "
            "character; give a host name or an IP address\n"
        )
