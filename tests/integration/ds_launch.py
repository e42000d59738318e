"""Launching the tests' DeepSpeed worker processes from a fork server.

Every DeepSpeed run of the tests (a reference, a resume from the mount, a restore) starts `nproc` CPU ranks that
each run a worker script, as `torch.distributed.run` would: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set, the script run as __main__. A fresh interpreter per rank spends about 3.5 s of
CPU importing torch and DeepSpeed before it does anything (and torchrun's launcher 3 s more), which on 2 cores is
a large part of a tiny run. So one server process per test session imports them once (python -m ds_launch
--serve) and forks the ranks of each launch from that state: the ranks begin with the modules loaded and nothing
else shared (the server computes nothing and starts no threads before it forks).

The protocol is one JSON line per launch on the server's stdin, answered by one line with the ranks' pids and
one with their exit codes. Each rank's stdout and stderr go to <log>.<rank>. launch() restarts the server when
it died, and kills a launch's ranks when it overruns its time limit.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from tempfile import TemporaryDirectory

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))
from make_tiny_checkpoint import cpu_env, free_port  # noqa: E402

LAUNCH_TIMEOUT_S = 300
# What every worker imports (transformers: the Llama-family workers). torch._dynamo is imported by torch's optimizer
# constructor and DeepSpeed's optimizer check (2.4 s of CPU per rank, measured).
PRELOADED = ("torch", "torch._dynamo", "deepspeed", "deepspeed.runtime.engine", "transformers")


# ---- server side ----------------------------------------------------------------------------------


def _run_rank(request: dict, rank: int) -> None:
    """In a forked child: become rank `rank` of the request and run its script; never returns."""
    code = 1
    try:
        log = os.open(f"{request['log']}.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the server's requests are not the rank's to read
        os.close(null)
        nproc = request["nproc"]
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                           "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(request["port"])})  # fmt: skip
        script = request["script"]
        sys.argv = [script, *request["argv"]]
        sys.path.insert(0, str(Path(script).parent))
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - the rank's traceback is its report
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _preload() -> None:
    for name in PRELOADED:
        __import__(name)
    # deepspeed.comm's backend loads its shared-memory op (a cached JIT build) in every rank: 2.5 s of CPU each.
    # Loaded here, OpBuilder's cache of loaded ops hands the ranks the same module.
    from deepspeed.accelerator import get_accelerator
    from deepspeed.comm.torch import build_shm_op
    if get_accelerator().create_op_builder("ShareMemCommBuilder") is not None:
        build_shm_op()


def serve() -> None:
    # The replies get stdout's pipe to themselves; whatever else prints (DeepSpeed does) goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _preload()
    for line in sys.stdin:
        request = json.loads(line)
        pids = []
        for rank in range(request["nproc"]):
            pid = os.fork()
            if pid == 0:
                replies.close()
                _run_rank(request, rank)
            pids.append(pid)
        print(json.dumps({"pids": pids}), file=replies, flush=True)
        codes: dict[int, int] = {}
        while len(codes) < len(pids):
            pid, status = os.wait()
            codes[pid] = os.waitstatus_to_exitcode(status)
            if codes[pid] != 0:  # as torchrun does: the other ranks would wait for it in a collective forever
                for other in set(pids) - set(codes):
                    os.kill(other, signal.SIGKILL)
        print(json.dumps({"codes": [codes[pid] for pid in pids]}), file=replies, flush=True)


# ---- client side ----------------------------------------------------------------------------------


class _Server:
    """The session's fork server, started on first use and stopped at exit."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.logs = TemporaryDirectory(prefix="reshardfs-ranks-")
        self.count = 0
        atexit.register(self.stop)

    def ensure(self) -> subprocess.Popen:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                            env=cpu_env())  # fmt: skip
        return self.process

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.logs.cleanup()

    def read(self, deadline: float) -> dict | None:
        """The server's next reply line, or None when the deadline passed or the server died."""
        out = self.process.stdout
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([out], [], [], remaining)[0]:
            return None
        line = out.readline()
        return json.loads(line) if line else None

    def run(self, nproc: int, script: str, argv: list[str], timeout: float) -> tuple[list[int | None], str]:
        """Runs the ranks; returns their exit codes (None: killed at the deadline) and their output, rank by rank."""
        process = self.ensure()
        self.count += 1
        log = f"{self.logs.name}/launch{self.count}"
        deadline = time.monotonic() + timeout
        process.stdin.write(json.dumps({"nproc": nproc, "script": script, "argv": argv, "log": log,
                                        "port": free_port()}) + "\n")  # fmt: skip
        process.stdin.flush()
        started = self.read(deadline)
        if started is None:
            raise RuntimeError(f"the fork server (pid {process.pid}) did not start the ranks")
        done = self.read(deadline)
        if done is None:  # overran: kill the ranks, then the server answers with their codes
            for pid in started["pids"]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.read(time.monotonic() + 30)
            codes = [None] * nproc
        else:
            codes = done["codes"]
        output = "".join(f"--- rank {r}\n{Path(f'{log}.{r}').read_text(errors='replace')}" for r in range(nproc)
                         if Path(f"{log}.{r}").is_file())  # fmt: skip
        return codes, output


# Made on the first launch, not at import: the server process and the ranks (whose worker scripts import this module)
# would each make a log folder that nothing removes, since ranks leave with os._exit.
_SERVER: _Server | None = None


def launch(nproc: int, script: Path, argv: list[str], what: str, expected: list[Path],
           timeout: float = LAUNCH_TIMEOUT_S) -> None:
    """Runs `script` on `nproc` CPU ranks (gloo) and prints the wall time; raises RuntimeError with the first failing
    rank's traceback when a rank fails or overruns `timeout`, or when a file of `expected` is missing."""
    global _SERVER
    if _SERVER is None:
        _SERVER = _Server()
    start = time.monotonic()
    codes, output = _SERVER.run(nproc, str(Path(script).resolve()), [str(a) for a in argv], timeout)
    print(f"{what}: DeepSpeed launch {time.monotonic() - start:.1f} s")
    if any(code != 0 for code in codes) or not all(f.is_file() for f in expected):
        first = output.find("Traceback")
        missing = [str(f) for f in expected if not f.is_file()]
        raise RuntimeError(f"{what} failed (exit codes {codes}, None = killed after {timeout} s; missing "
                           f"{missing[:4]}): {script} {' '.join(argv)}\n{output[max(first, 0):][-8000:]}")


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()
