"""`edgellm info` on damaged files: one line on stderr, exit 1, no traceback."""

import subprocess
import sys


def run_info(path):
    return subprocess.run([sys.executable, "-m", "edgellm", "info", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_bad_files_give_one_line_and_exit_1(converted, tmp_path):
    good = converted("llama", "q8_0").read_bytes()
    cases = {
        "truncated": good[:len(good) // 2],
        "magic": b"GGUF" + good[4:],
        "tiny": good[:20],
    }
    # a tensor table whose offset points past the end (header rewritten consistently)
    import json
    import struct

    from edgellm import format as fmt

    hlen = struct.unpack_from("<Q", good, 16)[0]
    header = json.loads(good[64:64 + hlen])
    next(iter(header["tensors"].values()))["offset"] = 1 << 40
    new = json.dumps(header, separators=(",", ":")).encode().ljust(hlen)
    cases["offset past end"] = fmt.encode_preamble(new) + new + good[64 + hlen:]
    for name, data in cases.items():
        p = tmp_path / f"{name}.edgellm"
        p.write_bytes(data)
        r = run_info(p)
        assert r.returncode == 1, name
        assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, (name, r.stderr)
        assert str(p) in r.stderr, name
