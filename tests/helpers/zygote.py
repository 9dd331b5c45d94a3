"""Runs `python -m MODULE ARGS` for the tests as a fork of a process that has already imported torch, torchtitan and
the package: the same code in a fresh child process, without the ~6 s of imports each training subprocess paid.

One zygote per test process (a pytest-xdist worker), started on first use. It reads one JSON request per line
({"module", "args", "env", "cwd", "stdout", "stderr"}), forks, and the child runs the module as __main__ with that
argv, environment, directory and output files; the zygote answers {"pid"} at once and {"status"} when the child
exits. The zygote itself runs nothing of torch (no threads to copy into a fork). torchtitan 0.2 binds
`ConfigManager.parse_args`'s default to sys.argv when it is imported: the child's parse_args reads its own argv.

    python -m tests.helpers.zygote   (started by run(); not a user command)
"""

import json
import os
import subprocess
import sys
import threading

_LOCK = threading.Lock()
_SERVER: list[subprocess.Popen] = []


def _server() -> subprocess.Popen:
    if not _SERVER or _SERVER[0].poll() is not None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
                   CUDA_VISIBLE_DEVICES="")
        _SERVER[:] = [subprocess.Popen([sys.executable, "-m", "tests.helpers.zygote"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, cwd=root, env=env)]
    return _SERVER[0]


def run(module: str, args: list[str], env: dict[str, str], cwd: str, timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run([python, -m, module, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=...)
    as a fork of the zygote; TimeoutExpired after killing the child, as subprocess.run does."""
    import tempfile

    with _LOCK, tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        server = _server()
        request = {"module": module, "args": list(args), "env": env, "cwd": str(cwd), "stdout": out, "stderr": err}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        pid = json.loads(server.stdout.readline())["pid"]
        timed_out = threading.Event()
        timer = threading.Timer(timeout, lambda: (timed_out.set(), _kill(pid)))
        timer.start()
        try:
            status = json.loads(server.stdout.readline())["status"]
        finally:
            timer.cancel()
        stdout, stderr = (open(path, errors="replace").read() for path in (out, err))
        command = [sys.executable, "-m", module, *args]
        if timed_out.is_set():
            raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
        return subprocess.CompletedProcess(command, status, stdout, stderr)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def _child(request: dict) -> None:
    """In the forked child: the request's files, directory, environment and argv, then the module as __main__."""
    import runpy
    import traceback

    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["module"], *request["args"]]
        from torchtitan.config.manager import ConfigManager

        bound = ConfigManager.parse_args

        def parse_args(self, args=None):  # the command line as it is when parsed, as in a fresh process
            return bound(self, sys.argv[1:] if args is None else args)

        ConfigManager.parse_args = parse_args
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if not isinstance(exit_.code, (int, type(None))):
                print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the child reports everything as a Python process would
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve() -> None:
    import torch  # noqa: F401
    import torchtitan.train  # noqa: F401

    import titan_fp4six.train  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        print(json.dumps({"status": code}), flush=True)


if __name__ == "__main__":
    _serve()
