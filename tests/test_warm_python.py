"""tests/warm_python.py, the warm python the tests' runs fork from: a run is a python of its own
whose libraries are already imported, it ends with its exit code or signal as the command did, a
launcher's command relays signals to its run and takes it along when killed, and an environment
a library reads at import is never served warm."""

import os
import signal
import subprocess
import sys
import time

from tests.conftest import WARM_PYTHON, run_command, running, start_command

WARM = "import sys; print('torch' in sys.modules, flush=True)"  # before any import of its own


def test_a_run_is_forked_warm_with_its_own_pid_exit_code_and_output(warm_python):
    proc = start_command([*warm_python, "-c", WARM + "; import os; print(os.getpid()); sys.exit(3)"])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3 and out.split() == ["True", str(proc.pid)], err
    assert proc.pid not in [int(p) for p in open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()]
    cold = subprocess.run([sys.executable, "-c", WARM], capture_output=True, text=True, check=True)
    assert cold.stdout == "False\n"  # the control: a python of its own has imported nothing


def test_a_commands_exit_code_signal_and_files_are_its_runs(warm_python, tmp_path):
    """As a launcher's script (the command WARM_PYTHON): the run's exit code, killed by the signal
    that killed the run, and the run in the command's folder with its arguments."""
    assert subprocess.run([*WARM_PYTHON, "-c", "raise SystemExit(5)"]).returncode == 5
    for signum in (signal.SIGTERM, signal.SIGKILL):
        killed = subprocess.run([*WARM_PYTHON, "-c", f"import os; os.kill(os.getpid(), {int(signum)})"])
        assert killed.returncode == -signum
    out = subprocess.run([*WARM_PYTHON, "-c", WARM + "; import os; print(os.getcwd(), sys.argv)", "x"],
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out == f"True\n{tmp_path} ['-c', 'x']\n"


def test_a_signal_to_the_command_reaches_the_run_and_a_kill_takes_it_along(warm_python, tmp_path):
    program = ("import os, signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
               "print(os.getpid(), flush=True)\n"
               "time.sleep(60)\n")
    command = subprocess.Popen([*WARM_PYTHON, "-c", program], stdout=subprocess.PIPE, text=True)
    run = int(command.stdout.readline())
    assert run != command.pid
    command.send_signal(signal.SIGTERM)
    assert command.wait(timeout=30) == 143  # the run's own handler's exit code
    command = subprocess.Popen([*WARM_PYTHON, "-c", program], stdout=subprocess.PIPE, text=True)
    run = int(command.stdout.readline())
    command.kill()
    command.wait()
    deadline = time.monotonic() + 10
    while running(run):
        assert time.monotonic() < deadline, "the run outlived its SIGKILLed command"
        time.sleep(0.01)


def test_an_environment_a_library_reads_at_import_gets_a_python_of_its_own(warm_python, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if os.environ.get("HF_HUB_OFFLINE") != "1" else "0")
    assert run_command([*warm_python, "-c", WARM]).stdout == "False\n"
    monkeypatch.undo()
    monkeypatch.setenv("RANK", "1")  # a launcher's: read when a run starts
    assert run_command([*warm_python, "-c", WARM]).stdout == "True\n"


def test_a_script_or_module_imports_from_its_own_folder_as_python_would(warm_python, tmp_path):
    (tmp_path / "neighbour.py").write_text("WHERE = __file__\n")
    (tmp_path / "script.py").write_text("import sys, neighbour\n"
                                        "print(__name__, __file__, sys.argv, sys.path[0], neighbour.WHERE)\n")
    for command in (["script.py", "a"], ["-m", "script", "a"]):
        warm, cold = (subprocess.run([*python, *command], cwd=tmp_path, capture_output=True, text=True, check=True)
                      for python in (WARM_PYTHON, [sys.executable]))
        assert warm.stdout == cold.stdout, command
