"""The dump writer under faults: a full disk, an unwritable output, two writers, a dying rank,
file permissions, untrusted names, and ``torchparity run`` with a script that is missing or fails.

Each test here failed before its fix (see the commit that added it)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchparity
from torchparity.errors import UsageError
from torchparity.toymodels import make_batches, make_model, train

posix_only = pytest.mark.skipif(os.name != "posix", reason="resource limits, fcntl and umask are POSIX")


def _lines(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n"), f"{path} ends with a partial line"
    return [json.loads(x) for x in text.splitlines()]


def _cli(*args: str, timeout: int = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchparity", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


# ---- 1. disk full (a file size limit) in the middle of a tensor-mode dump ------------------------

FSIZE_SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # what `ulimit -f` + Python's default does
    import torch, torchparity

    def train():
        torch.manual_seed(0)
        lin = torch.nn.Linear(128, 128)  # 64 KiB weight: the first tensor file is over the limit
        x, losses = torch.randn(8, 128), []
        for _ in range(12):  # one step (no optimizer): records.jsonl outgrows the limit too
            loss = lin(x).square().mean()
            loss.backward()
            with torch.no_grad():
                for p in lin.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
            losses.append(loss.item())
        return losses

    baseline = train()
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    with torchparity.dump(sys.argv[1], level="aten", mode="tensor", batch_size=16, fsync=False):
        losses = train()
    print("SAME" if losses == baseline else f"DIFFERENT {losses} {baseline}")
    """
)


@posix_only
def test_file_size_limit_mid_dump_keeps_training_records_and_says_so_once(tmp_path: Path) -> None:
    """Before: the first tensor file failed ("internal error in the dump writer: File too large"),
    nothing more was written and records.jsonl stayed empty."""
    script, out = tmp_path / "fsize.py", tmp_path / "d"
    script.write_text(FSIZE_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(out), str(32 * 1024)], capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "SAME"  # the training went on, bitwise unchanged
    told = [x for x in proc.stderr.splitlines() if x.strip()]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert len(told) == 2, told  # the tensor failure once, the record failure once
    assert "saving tensors" in told[0] and "File too large" in told[0] and "records and statistics go on" in told[0]
    assert "records written before are kept" in told[1] and "Free disk space" in told[1]

    rank = out / "step0" / "rank0"
    recs = _lines(rank / "records.jsonl")  # whole lines only, though the limit cut a write short
    assert len(recs) > 16  # records went on after the first tensor file failed
    assert [r["id"] for r in recs] == list(range(len(recs)))
    footer = json.loads((rank / "footer.json").read_text())
    assert footer["complete"] is False and footer["records"] == len(recs)
    assert footer["dropped_records"] > 0 and footer["dropped_tensors"] > 0
    assert "File too large" in footer["error"] and "\n" not in footer["error"]
    assert not list(rank.rglob("*.tmp"))  # the failed tensor file is not left behind
    entries = [e for r in recs for e in r["tensors"] if e["kind"] == "tensor"]
    assert sum("stats" in e for e in entries) > len(entries) // 2  # dropped tensors keep their statistics
    assert all((rank / e["file"]).is_file() for e in entries if "file" in e)  # no reference to a lost file

    from torchparity.dump.reader import load_dump

    frame = load_dump(out)
    assert set(frame["record_id"]) == {r["id"] for r in recs}


def test_a_failed_record_write_leaves_whole_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The append is all or nothing: a short write is cut back to the last complete line."""
    from torchparity.dump.writer import _append

    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"id": 0}\n')

    class ShortFile:  # writes part of the data, then the disk is full
        def __init__(self, fd: int) -> None:
            self.fd = fd

        def fileno(self) -> int:
            return self.fd

    real_write = os.write
    calls = {"n": 0}

    def short_write(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[:5]))
        raise OSError(28, "No space left on device")

    with open(path, "ab", buffering=0) as f:
        monkeypatch.setattr(os, "write", short_write)
        with pytest.raises(OSError):
            _append(ShortFile(f.fileno()), b'{"id": 1}\n{"id": 2}\n')
        monkeypatch.undo()
    assert path.read_bytes() == b'{"id": 0}\n'


# ---- 2. an output that cannot be written: refused before training --------------------------------

def test_output_that_is_a_file_is_refused_at_dump(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(UsageError, match=r"is a file, not a directory"):
        torchparity.dump(str(f))
    assert f.read_text() == "x"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (read-only even for root)")
def test_read_only_output_is_refused_at_dump() -> None:
    with pytest.raises(UsageError, match=r"/proc/torchparity-x.*not writable.*choose a directory") as err:
        torchparity.dump("/proc/torchparity-x/d")
    assert "\n" not in str(err.value)


@posix_only
def test_directory_without_write_permission_is_refused_at_dump(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK) and getattr(os, "geteuid", lambda: 1)() == 0:
            pytest.skip("running as root: permission bits do not stop writes (the /proc test covers it)")
        with pytest.raises(UsageError, match="not writable"):
            torchparity.dump(str(ro / "d"))
    finally:
        ro.chmod(0o755)


def test_cli_run_refuses_an_unwritable_output_before_the_script(tmp_path: Path) -> None:
    if not Path("/proc/self").is_dir():
        pytest.skip("needs Linux /proc")
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    proc = _cli("run", "-o", "/proc/torchparity-x", "--", "python", str(script))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "not writable" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()  # the training never started


# ---- 3. two processes, one directory -------------------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sys, torch, torchparity
    d = torchparity.dump(sys.argv[1], level="aten")
    d.start()
    torch.ones(3).exp()
    d.flush()
    print("READY", flush=True)
    sys.stdin.readline()  # hold the dump open until the test says
    torch.ones(3).sin()
    d.stop()
    """
)
SECOND = textwrap.dedent(
    """
    import sys, torch, torchparity
    from torchparity.errors import UsageError
    try:
        with torchparity.dump(sys.argv[1], level="aten"):
            torch.ones(3).cos()
    except UsageError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    """
)


@posix_only
def test_second_process_dumping_the_same_rank_is_refused_and_a_killed_holder_does_not_block(tmp_path: Path) -> None:
    """Before: both processes exited 0 and their records interleaved in one records.jsonl."""
    (tmp_path / "holder.py").write_text(HOLDER)
    (tmp_path / "second.py").write_text(SECOND)
    out = tmp_path / "d"
    holder = subprocess.Popen([sys.executable, str(tmp_path / "holder.py"), str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "READY"
        second = subprocess.run([sys.executable, str(tmp_path / "second.py"), str(out)], capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        msg = second.stderr.strip()
        assert "\n" not in msg and f"process {holder.pid}" in msg and "in use" in msg and "another output directory" in msg
        ops = [r["op"] for r in _lines(out / "step0" / "rank0" / "records.jsonl")]
        assert ops == ["aten.ones.default", "aten.exp.default"]  # the holder's data, untouched by the second
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding the lock: its lock file stays behind
        holder.communicate(timeout=60)
    assert (out / ".rank0.lock").exists()
    with torchparity.dump(str(out), level="aten"):  # ...and does not block the next run
        torch.ones(3).cos()
    assert not (out / ".rank0.lock").exists()  # released at stop
    assert [r["op"] for r in _lines(out / "step0" / "rank0" / "records.jsonl")] == ["aten.ones.default", "aten.cos.default"]


@posix_only
def test_run_refused_by_another_run_is_exit_2_and_claims_no_dump(tmp_path: Path) -> None:
    """Before: the refused `torchparity run` printed the refusal, let the script train, then said
    "dump written to DIR" (the other process's files were newer than its start) and exited 0."""
    (tmp_path / "holder.py").write_text(HOLDER)
    script = tmp_path / "train.py"
    script.write_text("import torch\ntorch.ones(2).exp()\nprint('trained')\n")
    out = tmp_path / "d"
    holder = subprocess.Popen([sys.executable, str(tmp_path / "holder.py"), str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "READY"
        proc = _cli("run", "-o", str(out), "--", "python", str(script))
    finally:
        holder.communicate(input="\n", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "trained" in proc.stdout  # the user's script ran, untouched
    assert "in use" in proc.stderr and "dump written" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (f"torchparity: error: no dump was written to {out} by this run: "
                                                    f"the dump could not start (see the error above)")
    ops = [r["op"] for r in _lines(out / "step0" / "rank0" / "records.jsonl")]
    assert ops == ["aten.ones.default", "aten.exp.default", "aten.ones.default", "aten.sin.default"]  # the holder's only


@posix_only
def test_two_dumps_of_one_rank_in_one_process_are_refused(tmp_path: Path) -> None:
    first = torchparity.dump(str(tmp_path / "d"), level="aten").start()
    try:
        with pytest.raises(UsageError, match="is in use"):
            torchparity.dump(str(tmp_path / "d"), level="aten").start()
    finally:
        first.stop()
    torchparity.dump(str(tmp_path / "d"), level="aten").start().stop()  # free again once stopped


# ---- 4. a rank dying mid-step in a 2-rank gloo job ----------------------------------------------

GLOO_DIE = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist, torchparity
    rank, out, init = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=2)
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    with torchparity.dump(out, level="aten", batch_size=4, fsync=False) as d:
        for step in range(3):
            y = lin(torch.randn(4, 8) + rank)
            if step == 1 and rank == 1:
                d.flush()
                os._exit(7)  # dies mid-step: no footer, no clean-up
            y.sum().backward()
            for p in lin.parameters():
                dist.all_reduce(p.grad)  # rank 0 finds its peer gone here
            opt.step(); opt.zero_grad()
    """
)


def test_a_rank_dying_mid_step_leaves_both_ranks_readable(tmp_path: Path, gloo_pair) -> None:
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    from torchparity.dump.reader import load_dump, open_dump

    script = tmp_path / "die.py"
    script.write_text(GLOO_DIE)
    codes, errs, work = gloo_pair(script, lambda r, w: [str(r), str(w / "d"), str(w / "init")],
                                  lambda codes, errs: codes[1] == 7)
    out = work / "d"
    assert codes[1] == 7, errs[1][-2000:]
    assert codes[0] != 0, errs[0][-2000:]  # the peer's death reaches rank 0 as an error
    assert "torchparity: the run stopped at step 1 with RuntimeError" in errs[0]

    reader = open_dump(out)
    assert reader.ranks(0) == [0, 1]
    assert len(load_dump(out, step=1, rank=1)) > 0  # what rank 1 wrote before dying
    assert len(load_dump(out, step=1, rank=0)) > 0
    assert reader.footer(0, 1) is not None  # the step it finished is closed
    assert reader.footer(1, 1) is None  # the step it died in honestly is not
    stopped = json.loads((out / "step1" / "rank0" / "footer.json").read_text())
    assert "RuntimeError" in stopped["interrupted"] and stopped["complete"] is False
    info = _cli("info", str(out))
    assert info.returncode == 0 and "Traceback" not in info.stderr
    assert "rank 1" in info.stdout and "no footer" in info.stdout


# ---- 5. file permissions follow the umask --------------------------------------------------------

@posix_only
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_tensor_files_get_the_same_mode_as_the_rest_of_the_dump(tmp_path: Path, umask: int) -> None:
    """Before: tensor files were 0600 (safetensors' default) while records.jsonl was 0644."""
    old = os.umask(umask)
    try:
        with torchparity.dump(str(tmp_path / "d"), level="aten", mode="tensor"):
            torch.ones(4).exp()
    finally:
        os.umask(old)
    rank = tmp_path / "d" / "step0" / "rank0"
    tensor_files = list((rank / "tensors").glob("*.safetensors"))
    assert tensor_files
    want = 0o666 & ~umask
    assert {f.stat().st_mode & 0o777 for f in tensor_files} == {want}
    assert (rank / "records.jsonl").stat().st_mode & 0o777 == want


# ---- 6. untrusted module and argument names never reach a file name ------------------------------

WEIRD = ["<script>alert(1)</script>", "-rf", "a/b", "x\x00y", "=HYPERLINK(\"http://x\")", "L" * 300, "..", "@sum"]


class Weird(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for i, name in enumerate(WEIRD):
            if name == "..":
                continue  # nn.Module refuses dotted names itself
            self.add_module(name, torch.nn.Linear(4, 4))

    def forward(self, x: dict) -> torch.Tensor:
        y = x["../../escape"] + x["/abs"]
        for m in self.children():
            y = m(y)
        return y


def test_untrusted_names_stay_inside_the_dump_and_tensors_are_found(tmp_path: Path) -> None:
    from torchparity.dump.reader import load_dump

    out = tmp_path / "d"
    model = Weird()
    with torchparity.dump(str(out), level="module", mode="tensor", model=model):
        model({"../../escape": torch.ones(2, 4), "/abs": torch.ones(2, 4)}).sum().backward()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # nothing written beside the dump
    root = out.resolve()
    safe = re.compile(r"^[A-Za-z0-9._-]+$")
    for p in out.rglob("*"):
        assert p.resolve().is_relative_to(root), p
        hive = re.fullmatch(r"(step|rank)=\d+", p.name)  # the Parquet summaries' partitions (docs/query.md)
        assert (safe.match(p.name) or hive) and not p.name.startswith("-"), p.name
    frame = load_dump(out)
    modules = set(frame["module"].dropna())
    for name in WEIRD:
        if name != "..":
            assert name in modules, name
    saved = frame[frame["tensor"].notna()]
    assert len(saved) > 0
    for ref in saved["tensor"]:
        assert ref.path.resolve().is_relative_to(root)
        assert isinstance(ref.load(), torch.Tensor)


# ---- 7. torchparity run: a missing script, a failing script -------------------------------------

def test_run_with_a_missing_script_says_so_and_claims_no_dump(tmp_path: Path) -> None:
    """Before: python's own "can't open file" (exit 2), then "torchparity: dump written to ..."."""
    proc = _cli("run", "-o", str(tmp_path / "d"), "--", "python", str(tmp_path / "nosuch.py"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"torchparity: error: script {tmp_path / 'nosuch.py'} does not exist; nothing was run and no dump was written"
    assert "dump written" not in proc.stderr


def test_run_with_a_failing_script_keeps_its_exit_code_and_a_readable_dump(tmp_path: Path) -> None:
    from torchparity.dump.reader import load_dump

    script = tmp_path / "boom.py"
    script.write_text("import torch\ntorch.ones(2).exp()\nraise SystemExit(3)\n")
    proc = _cli("run", "-o", str(tmp_path / "d"), "--", "python", str(script))
    assert proc.returncode == 3
    assert "dump written" not in proc.stderr
    assert f"the command failed (exit code 3); what it ran before is in {tmp_path / 'd'}" in proc.stderr
    assert "aten.exp.default" in set(load_dump(tmp_path / "d")["op"])
    # a command that never starts Python (so no dump) is not reported as a written dump either
    proc = _cli("run", "-o", str(tmp_path / "e"), "--", "sh", "-c", "exit 4")
    assert proc.returncode == 4 and "no dump was written" in proc.stderr and "dump written to" not in proc.stderr


@posix_only
def test_run_under_torchrun_dumps_every_rank(tmp_path: Path) -> None:
    """Before: the launcher process (torchrun itself, no RANK in its environment) started a dump and
    took rank 0's lock; the rank-0 worker was refused and only rank1/ was written, yet "dump written"."""
    script = tmp_path / "tiny.py"
    script.write_text("import torch\ntorch.ones(2).exp()\n")
    proc = _cli("run", "-o", str(tmp_path / "d"), "--", "python", "-m", "torch.distributed.run", "--nproc-per-node",
                "2", str(script), timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "could not start" not in proc.stderr and "dump written to" in proc.stderr
    for r in (0, 1):
        assert [x["op"] for x in _lines(tmp_path / "d" / "step0" / f"rank{r}" / "records.jsonl")] == \
            ["aten.ones.default", "aten.exp.default"]


def test_the_torchrun_launcher_is_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from torchparity.dump import _autostart

    spec = importlib.util.spec_from_file_location("tp_autostart_sc", Path(_autostart.__path__[0]) / "sitecustomize.py")
    monkeypatch.delenv("TORCHPARITY_RUN_OPTIONS", raising=False)  # loading it starts nothing
    sc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sc)
    for argv, orig, want in [(["/venv/bin/torchrun", "--nproc-per-node", "2", "t.py"], None, True),
                             (["t.py"], ["python", "-m", "torch.distributed.run", "t.py"], True),
                             (["t.py"], ["python", "-m", "torch.distributed.launch", "t.py"], True),
                             (["t.py"], ["python", "-u", "t.py"], False), (["-c"], ["python", "-c", "pass"], False)]:
        monkeypatch.setattr(sys, "argv", argv)
        monkeypatch.setattr(sys, "orig_argv", orig or ["python", *argv], raising=False)
        assert sc._is_launcher() is want, argv


def test_which_python_script_a_command_runs() -> None:
    from torchparity.cli.run_cmd import python_script

    assert python_script(["python", "-u", "-W", "ignore", "-X", "dev", "train.py", "--lr", "1"]) == "train.py"
    assert python_script([sys.executable, "train.py"]) == "train.py"
    assert python_script(["python3.11", "-Wignore", "t.py"]) == "t.py"
    for cmd in (["python", "-m", "pkg"], ["python", "-c", "pass"], ["python", "-"], ["python", "-mpkg"],
                ["torchrun", "--nproc-per-node", "2", "train.py"], ["sh", "x.sh"], ["python"]):
        assert python_script(cmd) is None, cmd


@pytest.mark.parametrize("bad", [5, "", ["d"], "a\x00b"])
def test_a_path_that_is_not_a_directory_name_is_a_usage_error(bad: object) -> None:
    """Before: ``path: 5`` in a dump YAML ended in a TypeError traceback at start()."""
    from torchparity.dump.options import DumpOptions

    with pytest.raises(UsageError, match="path must be a directory name"):
        DumpOptions(path=bad)  # type: ignore[arg-type]
