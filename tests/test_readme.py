"""The README and the scripts as a user meets them: the Quickstart runs as
written, the first screen says what the product is and how to get it, the
results are summarised (the full grid lives in bench/NOTES.md), no file speaks
of how the development machines were reached, and bench/device_run.sh takes
its results folder from the caller. CPU-only and fast."""

import os
import re
import shutil
import subprocess

import pytest
import torch

from conftest import REPO, run_python

README = (REPO / "README.md").read_text()
FIRST_SCREEN = "\n".join(README.splitlines()[:40])


def section(title):
    """The text of README section `## title`, up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def quickstart_blocks():
    """The Quickstart's python blocks as (runs_on_cuda, code)."""
    blocks = re.findall(r"^```python\n(.*?)^```", section("Quickstart"), re.M | re.S)
    return [('"cuda"' in code, code) for code in blocks]


def test_quickstart_has_a_cuda_and_a_cpu_variant():
    kinds = sorted(cuda for cuda, _ in quickstart_blocks())
    assert kinds == [False, True], "the Quickstart should have one CPU block and one CUDA block"


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda"])
def test_quickstart_runs_as_written(cuda):
    if cuda and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    codes = [code for is_cuda, code in quickstart_blocks() if is_cuda == cuda]
    assert len(codes) == 1, f"the Quickstart should have one {'CUDA' if cuda else 'CPU'} block"
    code = codes[0]
    # It converts an nn.RNN it builds itself, in one step (from_rnn copies the weights).
    assert re.search(r"^rnn = torch\.nn\.RNN\(", code, re.M), code
    assert "torch_prnn.PersistentRNN.from_rnn(rnn)" in code, code
    assert "load_state_dict" not in code, "from_rnn already copies the weights"
    returncode, output = run_python(["-c", code], timeout=120)
    assert returncode == 0, output


def test_first_screen():
    """What it is, what it needs to be fast, how to install, the two commands,
    and the start of the Quickstart, all in the first 40 lines."""
    for needed in [
        "torch_prnn.PersistentRNN", "torch.nn.RNN", "drop-in", "small batches",  # what, for whom
        "NVIDIA GPU", "H200", "sm_90", "sm_80", "CPU",  # where it is fast, where it runs
        "pip install --no-build-isolation .", "torch first",  # install
        "make demo", "make test", "## Quickstart",
    ]:
        assert needed in FIRST_SCREEN, f"the README's first 40 lines lack {needed!r}"


def test_results_are_a_summary():
    """Results: the headline table, the plot and how to re-run; the full grid,
    commit hashes and NOTES step numbers belong in bench/NOTES.md."""
    results = section("Results")
    assert "![" in results and "bench/results/NVIDIA_H200.png" in results
    assert "bench/device_run.sh" in results and "bench/plot.py" in results
    assert "bench/NOTES.md" in results
    rows = [line for line in results.splitlines() if line.startswith("|")]
    assert 3 <= len(rows) <= 12, f"the headline table has {len(rows)} lines; the full grid goes to bench/NOTES.md"
    # A 7+ character hex word with a digit and a letter is a commit hash, not prose.
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", README) if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert not hashes, f"commit hashes in the README: {hashes}"
    steps = re.findall(r"\bsteps? \d+\b(?! (?:ms|µs|us))", README)
    assert not steps, f"NOTES step numbers in the README: {steps}"


# Words of the development setup, not of the product: how a GPU machine was
# obtained, the tool that ran a call and its return folder, the sessions and
# helpers of the work, the machines' kind names (the pattern below). Matching
# phrases, not words: "helpers" in C code or start_new_session in Python are
# the product's own.
DEV_WORDS = re.compile(
    r"\blent\b|device[ -]tool|\$\{?OUT\b|return folder|build/device\b"
    r"|\b(?:this|that|last|earlier|previous|next|the|device|whole) session\b|\bsession's"
    r"|read-only\s+helper|\bnvidia-h200|KINDS\.md|\bx[248] machine",
    re.IGNORECASE,
)


def tracked_files():
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [path for path in listing.decode().split("\0") if path]


def test_no_development_setup_words():
    # bench/results/ keeps the runs' raw logs as they were; this file spells the phrases out.
    skipped = ("bench/results/", "tests/test_readme.py")
    found = []
    for path in tracked_files():
        file = REPO / path
        if path.startswith(skipped) or not file.is_file():
            continue
        data = file.read_bytes()
        if b"\0" in data:  # binary
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if DEV_WORDS.search(line):
                found.append(f"{path}:{number}: {line.strip()}")
    assert not found, "development-setup words:\n" + "\n".join(found)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_device_run_results_folder(tmp_path):
    """--help prints the results folder without running anything: --results DIR,
    else $RESULTS_DIR, else build/gpu."""
    def results_folder(*args, results_dir=None):
        env = {k: v for k, v in os.environ.items() if k != "RESULTS_DIR"}
        if results_dir is not None:
            env["RESULTS_DIR"] = str(results_dir)
        proc = subprocess.run(["bash", str(REPO / "bench" / "device_run.sh"), *args, "--help"],
                              capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "--results DIR" in proc.stdout, proc.stdout
        (line,) = [line for line in proc.stdout.splitlines() if line.startswith("results folder: ")]
        return line.removeprefix("results folder: ")

    from_env, from_arg = tmp_path / "env", tmp_path / "arg"
    assert results_folder() == "build/gpu"
    assert results_folder(results_dir=from_env) == str(from_env)
    assert results_folder("--results", str(from_arg), results_dir=from_env) == str(from_arg)
    assert results_folder(f"--results={from_arg}") == str(from_arg)
    assert not from_env.exists() and not from_arg.exists(), "--help should create nothing"
