"""`edgellm transcribe` on the tiny random Whisper checkpoint (no tokenizer: empty texts,
real timestamps): every format's structure, several files, -o DIR, and the refusals as one
line with exit 1 (2 for usage)."""

import json
import re

import pytest
from conftest import FIXTURES, name_whisper_segments

from edgellm import cli

CLIPS = FIXTURES / "whisper"
FOX, GERMAN = str(CLIPS / "fox.wav"), str(CLIPS / "german.wav")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from converter.hf_source import open_hf
    from converter.pack import convert

    path = tmp_path_factory.mktemp("whisper") / "tiny.edgellm"
    convert(open_hf(FIXTURES / "whisper-tiny-random"), path, "f32", progress=False)
    return str(path)


@pytest.fixture(autouse=True)
def texts(monkeypatch):
    name_whisper_segments(monkeypatch)  # the tiny model has no tokenizer


def run(capsys, *argv):
    """`edgellm transcribe argv`, greedy unless argv says otherwise: the tiny random model
    falls back through every temperature on every window (test_decoding_options runs the
    search and the fallback)."""
    greedy = [] if {"--beam-size", "--temperature"} & set(argv) else \
        ["--beam-size", "1", "--temperature", "0"]
    code = cli.main(["transcribe", *greedy, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def seconds(stamp: str) -> float:
    parts = [float(x) for x in stamp.replace(",", ".").split(":")]
    return sum(x * 60 ** i for i, x in enumerate(reversed(parts)))


def monotonic(pairs) -> None:
    assert pairs
    last = 0.0
    for start, end in pairs:
        assert last <= start < end
        last = start


def test_timestamp_formatting():
    from edgellm.commands.transcribe import timestamp

    assert timestamp(0) == "00:00:00.000"
    assert timestamp(3661.2345, ",") == "01:01:01,234"
    assert timestamp(59.9996, hours=False) == "01:00.000"
    assert timestamp(3600, hours=False) == "01:00:00.000"


def test_text(capsys, tiny):
    code, out, _ = run(capsys, "-m", tiny, "-t", "1", "--language", "en", FOX)
    assert code == 0
    lines = out.splitlines()
    stamp = r"(\d\d:\d\d\.\d{3})"
    stamps = [re.fullmatch(rf"\[{stamp} --> {stamp}\] segment \d+", x) for x in lines]
    assert all(stamps), lines
    monotonic([(seconds(m[1]), seconds(m[2])) for m in stamps])
    code, out, _ = run(capsys, "-m", tiny, "-t", "1", "--no-timestamps", FOX)
    assert code == 0 and "-->" not in out and len(out.splitlines()) == len(lines)


def test_srt(capsys, tiny):
    code, out, _ = run(capsys, "-m", tiny, "--language", "en", "--format", "srt", FOX)
    assert code == 0
    blocks = out.split("\n\n")
    assert blocks[-1] == ""  # every cue ends with a blank line
    pairs = []
    for n, block in enumerate(blocks[:-1], 1):
        index, times, *text = block.split("\n")
        assert index == str(n) and text == [f"segment {n - 1}"]
        m = re.fullmatch(r"(\d\d:\d\d:\d\d,\d{3}) --> (\d\d:\d\d:\d\d,\d{3})", times)
        pairs.append((seconds(m[1]), seconds(m[2])))
    monotonic(pairs)


def test_vtt(capsys, tiny):
    code, out, _ = run(capsys, "-m", tiny, "--format", "vtt", "--no-condition", "--task",
                       "translate", FOX)
    assert code == 0 and out.startswith("WEBVTT\n\n")
    blocks = out[len("WEBVTT\n\n"):].split("\n\n")
    assert blocks[-1] == ""
    pairs = []
    for block in blocks[:-1]:
        times, *text = block.split("\n")
        m = re.fullmatch(r"(\d\d:\d\d:\d\d\.\d{3}) --> (\d\d:\d\d:\d\d\.\d{3})", times)
        assert m and len(text) == 1 and text[0].startswith("segment ")
        pairs.append((seconds(m[1]), seconds(m[2])))
    monotonic(pairs)


def test_json_several_files(capsys, tiny):
    code, out, _ = run(capsys, "-m", tiny, "--format", "json", FOX, GERMAN)
    assert code == 0
    docs = [json.loads(x) for x in out.splitlines()]
    assert [d["file"] for d in docs] == [FOX, GERMAN]
    for d in docs:
        assert d["language"] in ("en", "de", "fr") and 0 < d["language_probability"] <= 1
        assert d["duration"] > 0
        assert [s["id"] for s in d["segments"]] == list(range(len(d["segments"])))
        monotonic([(s["start"], s["end"]) for s in d["segments"]])
        assert all(s["end"] <= d["duration"] and isinstance(s["text"], str)
                   for s in d["segments"])


def test_text_several_files_have_headers(capsys, tiny):
    code, out, _ = run(capsys, "-m", tiny, "--language", "en", FOX, GERMAN)
    assert code == 0
    heads = [x for x in out.splitlines() if x.startswith("==> ")]
    assert heads == [f"==> {FOX} <==", f"==> {GERMAN} <=="]


def test_output_dir_writes_one_file_per_input(capsys, tiny, tmp_path):
    code, out, err = run(capsys, "-m", tiny, "--language", "en", "--format", "srt",
                         "-o", str(tmp_path), FOX, GERMAN)
    assert code == 0 and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fox.srt", "german.srt"]
    assert (tmp_path / "fox.srt").read_text("utf-8").startswith("1\n00:00:")
    assert "wrote" in err


def one_line_error(capsys, tiny_or_model, *argv, match):
    code, out, err = run(capsys, "-m", tiny_or_model, *argv)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and re.search(match, err), err


def test_refusals(capsys, tiny, tmp_path, converted):
    one_line_error(capsys, tiny, str(tmp_path / "missing.wav"), match="no such file")
    text = tmp_path / "notes.wav"
    text.write_text("hello")
    one_line_error(capsys, tiny, str(text), match="not a WAV file")
    one_line_error(capsys, tiny, "--format", "srt", FOX, GERMAN, match="needs -o DIR")
    one_line_error(capsys, tiny, "-o", str(tmp_path / "nodir"), FOX, match="not a directory")
    one_line_error(capsys, tiny, "--language", "xx", FOX, match="language must be one of")
    # the prompt reaches the API, which needs the tokenizer the tiny model lacks
    one_line_error(capsys, tiny, "--initial-prompt", "Hi", FOX, match="has no tokenizer")
    one_line_error(capsys, str(converted("llama", "f32")), FOX, match="needs a Whisper model")
    with pytest.raises(SystemExit) as e:  # usage errors: argparse's exit 2
        cli.main(["transcribe", "-m", tiny, "--format", "tsv", FOX])
    assert e.value.code == 2
    capsys.readouterr()


def test_progress_on_stderr(capsys, tiny, tmp_path):
    """--progress: one line per window on stderr (not a terminal here), up to 100%; stdout
    the same as without it; none without --progress when stderr is not a terminal."""
    import numpy as np

    from edgellm.audio import load_audio
    from edgellm.audio.wav import write_wav

    long = tmp_path / "long.wav"
    fox = load_audio(CLIPS / "fox.wav")
    write_wav(long, np.concatenate([fox, np.zeros(16000 * 32, np.float32), fox]), 16000)
    opts = ("-m", tiny, "-t", "1", "--language", "en", "--beam-size", "1", "--temperature", "0")
    code, out, err = run(capsys, *opts, "--progress", str(long))
    assert code == 0
    bars = [x for x in err.splitlines() if x.startswith(f"{long} [")]
    assert len(bars) >= 3 and bars[0].endswith("0% 00:00.000/00:38.182")
    assert bars[-1].endswith("100% 00:38.182/00:38.182") and "#" * 30 in bars[-1]
    code, plain, err = run(capsys, *opts, str(long))
    assert code == 0 and plain == out and "%" not in err


def test_progress_bar_on_a_terminal_is_cleared_around_segments():
    import io

    from edgellm.commands.transcribe import Progress

    s = io.StringIO()
    bar = Progress("a.wav", s, tty=True)
    bar.update(15.0, 60.0)
    assert s.getvalue() == "\r\033[Ka.wav [" + "#" * 8 + "." * 22 + "]  25% 00:15.000/01:00.000"
    bar.clear()
    assert s.getvalue().endswith("\r\033[K")
    bar.draw()
    bar.close()
    assert s.getvalue().endswith("/01:00.000\r\033[K")


def test_decoding_options(capsys, tiny):
    code, out, _ = run(capsys, "-m", tiny, "-t", "1", "--language", "en", "--beam-size", "2",
                       "--best-of", "2", "--temperature", "0,0.5", "--vad", FOX)
    assert code == 0 and out
    with pytest.raises(SystemExit) as e:  # usage errors: argparse's exit 2
        cli.main(["transcribe", "-m", tiny, "--temperature", "0,hot", FOX])
    assert e.value.code == 2 and "must be numbers in [0, 2]" in capsys.readouterr().err
