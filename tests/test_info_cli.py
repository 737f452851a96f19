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

    from edgellm.modelfile import format as fmt

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


def test_command_keeps_scipy_out(converted):
    """The command line makes numba skip scipy (17 MiB of RSS when it is installed), and the
    command still works: a generation runs the kernels."""
    code = ("import sys; from edgellm import cli; "
            f"sys.argv = ['edgellm', 'generate', '-m', {str(converted('llama', 'q4_0'))!r}, "
            "'-p', 'Hi', '-n', '2', '--temp', '0']; "
            # as the program, main() exits through _exit_now: report instead
            "cli._exit_now = lambda rc: print('scipy loaded:', "
            "sys.modules.get('scipy') is not None, 'rc', rc); cli.main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("scipy loaded: False rc 0"), r.stdout


def test_memory_sizes_read_and_shown():
    from edgellm.commands.info import _mb, parse_size

    assert parse_size("1TB") == 2**40 and parse_size("1.5G") == 3 * 2**29  # T: was refused
    assert parse_size("512MB") == 512 * 2**20 and parse_size("100") == 100
    assert _mb(1024) == "1024 bytes" and _mb(3 * 2**20) == "3.0 MiB"  # not "0.0 MiB" for 1KB
