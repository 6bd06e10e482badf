"""The engine's last words on a fatal signal (docs/recorder.md, "How it died"): with the flight
recorder on, Python's faulthandler writes the signal's name and every thread's traceback into the
file the agent's hello named (ClientReply.fault_path, engine-fault-local<r>.txt in the run dir);
the agent reads it after the death. A faulthandler the user enabled is left alone."""
import faulthandler
import os
import re

_NAME = re.compile(r"engine-fault-local[0-9]+\.txt")

# [file object, path] while ours is enabled (faulthandler keeps only the descriptor: the object must live).
_ours = []


def pid_namespace() -> str:
    """This process's pid namespace as the agent compares it ("pid:[4026531836]"; '' without /proc)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def enable_fault_file(path: str, run_dir: str) -> str:
    """Point faulthandler at ``path`` (0600, no link followed, emptied). Returns what was done:
    "enabled", "already" (ours, same file), "user" (the user's faulthandler is on: left alone),
    or "refused: <why>" (nothing enabled; the crash record then says no word came)."""
    if _ours and _ours[1] == path:
        return "already"
    if faulthandler.is_enabled() and not _ours:
        return "user"
    # The path came from the agent's socket: only its own file name, in this client's run dir.
    if not _NAME.fullmatch(os.path.basename(path)) or os.path.realpath(os.path.dirname(path)) != os.path.realpath(run_dir):
        return f"refused: {path!r} is not engine-fault-local<r>.txt in the run dir {run_dir!r}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        return f"refused: {path}: {e.strerror}"
    try:
        st = os.fstat(fd)
        import stat

        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(0, "not a regular file of this user")
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)  # a previous engine's words are not this one's
        f = os.fdopen(fd, "w")
    except OSError as e:
        os.close(fd)
        return f"refused: {path}: {e.strerror}"
    disable_fault_file()
    faulthandler.enable(file=f, all_threads=True)
    _ours[:] = [f, path]
    return "enabled"


def disable_fault_file() -> None:
    """The engine closed its client cleanly: ours off (a user's is never touched)."""
    if _ours:
        faulthandler.disable()
        try:
            _ours[0].close()
        except OSError:
            pass
        _ours.clear()
