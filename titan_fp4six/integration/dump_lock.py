"""One run per `job.dump_folder`: two trainings started into one folder both ran to the end, the folder then held
only the last writer's checkpoints, and a resume continued the other run. The launchers (python -m
titan_fp4six.train, titan_fp4six.rl) call `lock_dump_folder` before torchtitan builds anything."""

import fcntl
import os
import socket
from pathlib import Path

LOCK = ".titan_fp4six.lock"
_HELD = []  # the open lock files: the lock lasts as long as the process


def lock_dump_folder(folder: str | Path) -> None:
    """Rank 0 takes an exclusive lock (flock, released when the process ends, killed included) on FOLDER/LOCK, which
    holds its pid and host; a run already holding it is an error naming that pid. Other ranks share rank 0's."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / LOCK, "a+")
    except OSError as e:
        raise ValueError(f"job.dump_folder={str(folder)!r}: cannot write there ({type(e).__name__}: {e.strerror})") \
            from e
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        other = handle.read().strip() or "unknown"
        handle.close()
        raise ValueError(f"job.dump_folder={str(folder)!r} is in use by another run (pid, host: {other}): two runs "
                         "in one folder overwrite each other's checkpoints and a resume would continue the other "
                         "run; wait for it to end or pass another --job.dump_folder") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()} {socket.gethostname()}\n")
    handle.flush()
    _HELD.append(handle)
