#!/usr/bin/env python3
"""Build checks of ampkit's CUDA kernels (core/engine/src/cuda/grad_stats_kernel.cu).

  check_kernel_image.py fatbin FATBIN --sm 75,80,... --ptx 75,120
      The fatbin's images, read from its header (nvcc's fatbin layout, as core/engine/src/
      kernel_image.cpp reads it at run time), are exactly that machine code and that PTX.
  check_kernel_image.py ptx --nvcc=NVCC --source=KERNEL.cu --arch=75,120 -- NVCC_FLAGS...
      nvcc -ptx with the build's flags, for each PTX architecture: the rules kernel
      (ampkit_step_rules_kernel and every function it calls) holds no fused multiply-add (fma.,
      mad.) and no flush-to-zero (.ftz), so it rounds every value as the host function does.
  check_kernel_image.py --self-test
      Both checks on fixtures (a fatbin made here, PTX with and without an fma), so neither can
      pass by not looking.

Exits 0 when the check holds, 1 with one line per finding, 77 (ctest's skip) with a line saying
why where the build has no kernel (no nvcc).
"""

import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
SKIP = 77


def fatbin_images(data: bytes):
    """[(arch, is_ptx)] in file order; raises ValueError where the bytes are not a fatbin."""
    if len(data) < 16:
        raise ValueError("shorter than a fatbin header")
    magic, _version, header, size = struct.unpack_from("<IHHQ", data, 0)
    if magic != FATBIN_MAGIC:
        raise ValueError(f"magic {magic:#x}, not a fatbin's {FATBIN_MAGIC:#x}")
    end, offset, images = header + size, header, []
    if end > len(data):
        raise ValueError(f"header says {end} bytes, the file has {len(data)}")
    while end - offset >= 64:
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, offset)
        if entry_header < 64 or offset + entry_header + payload > end:
            raise ValueError(f"entry at {offset} runs past the fatbin")
        (arch,) = struct.unpack_from("<I", data, offset + 28)
        if kind in (1, 2):
            images.append((arch, kind == 1))
        offset += entry_header + payload
    return images


def check_fatbin(path: Path, sm, ptx):
    if not path.is_file():
        print(f"skipped: no fatbin at {path} (this build found no nvcc, so it has no kernel)")
        return SKIP
    images = fatbin_images(path.read_bytes())
    got = sorted(images)
    want = sorted([(a, False) for a in sm] + [(a, True) for a in ptx])
    names = lambda xs: ", ".join(("compute_" if p else "sm_") + str(a) for a, p in xs)  # noqa: E731
    if got != want:
        print(f"{path}: holds {names(got)}; the build asks for {names(want)}")
        return 1
    print(f"{path}: {names(got)}")
    return 0


def rules_kernel_ptx(ptx: str) -> str:
    """The rules kernel's entry and every .func it calls (transitively), as text."""
    bodies = {}
    for m in re.finditer(r"^(?:\.visible\s+|\.weak\s+)*\.(entry|func)\s+(?:\([^)]*\)\s*)?(\w+)", ptx, re.M):
        end = ptx.find("\n}", m.start())
        bodies[m.group(2)] = ptx[m.start() : end + 2 if end >= 0 else len(ptx)]
    if "ampkit_step_rules_kernel" not in bodies:
        raise ValueError("the PTX has no ampkit_step_rules_kernel")
    seen, todo = set(), ["ampkit_step_rules_kernel"]
    while todo:
        name = todo.pop()
        if name in seen or name not in bodies:
            continue
        seen.add(name)
        todo += re.findall(r"call(?:\.uni)?\s+(?:\([^)]*\),\s*)?(\w+)", bodies[name])
    return "\n".join(bodies[n] for n in sorted(seen))


def rounding_findings(ptx: str):
    return [line.strip() for line in rules_kernel_ptx(ptx).splitlines() if re.search(r"\b(fma|mad)\.|\.ftz\b", line)]


def check_ptx(nvcc: str, source: str, archs, flags):
    if not nvcc or not Path(nvcc).is_file():
        print("skipped: no nvcc (this build has no kernel)")
        return SKIP
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            out = Path(tmp) / f"compute_{arch}.ptx"
            cmd = [nvcc, "-ptx", *flags, f"-arch=compute_{arch}", "-o", str(out), source]
            subprocess.run(cmd, check=True)
            findings = rounding_findings(out.read_text())
            for f in findings[:5]:
                print(f"compute_{arch}: the rules kernel rounds unlike the host: {f}")
            failed |= bool(findings)
            if not findings:
                print(f"compute_{arch}: the rules kernel has no fma, mad or .ftz instruction")
    return 1 if failed else 0


def self_test():
    entry = struct.pack("<HHIQ", 2, 0x101, 64, 16) + bytes(12) + struct.pack("<I", 86) + bytes(32) + bytes(16)
    ptx_entry = struct.pack("<HHIQ", 1, 0x101, 64, 0) + bytes(12) + struct.pack("<I", 75) + bytes(32)
    body = entry + ptx_entry
    fatbin = struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body
    assert fatbin_images(fatbin) == [(86, False), (75, True)], fatbin_images(fatbin)
    try:
        fatbin_images(fatbin[:-20])
        raise AssertionError("a cut fatbin was read")
    except ValueError:
        pass
    clean = (
        ".visible .entry ampkit_step_rules_kernel(\n.param .u64 p\n)\n{\n\tmul.rn.f64 %fd1, %fd2, %fd3;\n"
        "\tcall.uni helper;\n}\n.func helper()\n{\n\tadd.rn.f64 %fd4, %fd1, %fd5;\n}\n"
        ".visible .entry ampkit_grad_stats_float()\n{\n\tfma.rn.f64 %fd1, %fd2, %fd3, %fd4;\n}\n"
    )
    assert rounding_findings(clean) == [], rounding_findings(clean)  # another kernel's fma is not its
    for bad in ("fma.rn.f64 %fd4, %fd1, %fd5, %fd6;", "max.ftz.f32 %f1, %f2, %f3;"):
        planted = clean.replace("add.rn.f64 %fd4, %fd1, %fd5;", bad)
        assert rounding_findings(planted) == [bad], (bad, rounding_findings(planted))
    print("self-test passed: fatbin images read, a cut fatbin refused, fma and .ftz found in a called function")
    return 0


def main(argv):
    if argv[:1] == ["--self-test"]:
        return self_test()
    if argv[:1] == ["fatbin"] and len(argv) == 6 and argv[2] == "--sm" and argv[4] == "--ptx":
        return check_fatbin(Path(argv[1]), [int(a) for a in argv[3].split(",")], [int(a) for a in argv[5].split(",")])
    if argv[:1] == ["ptx"] and "--" in argv:
        opts, flags = argv[1 : argv.index("--")], argv[argv.index("--") + 1 :]
        o = dict(opt.split("=", 1) for opt in opts if "=" in opt)
        return check_ptx(o.get("--nvcc", ""), o["--source"], [int(a) for a in o["--arch"].split(",")], flags)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
