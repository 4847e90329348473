# meshrun's site hook for the ranks of a Python program run by the launcher.
#
# The launcher puts this file's folder first on PYTHONPATH, so Python imports
# it at startup, before the program. With MESHRUN_RANK_DIR set (and
# MESHRUN_PYTHON_HOOK not "0") it:
#
#   - dumps every thread's stack to MESHRUN_RANK_DIR/stacks-python.txt on
#     SIGUSR1 (faulthandler: written from C, even while the main thread is
#     blocked in C code; the process goes on);
#   - says so on stdout with one "@meshrun:hello {...}" line;
#   - writes MESHRUN_RANK_DIR/exception.json for the first uncaught exception
#     (the usual traceback still prints);
#
# and in every case runs the sitecustomize this one hides (the user's, or the
# distribution's), as Python would have. Nothing here may break or slow the
# program: every step fails silently.
#
# Only the first Python process of a rank takes the hook: processes it starts
# (multiprocessing's spawn, a DataLoader's workers) inherit
# MESHRUN_PYTHON_HOOK_PID and stay quiet.

import os
import sys

_ENV_DIR = "MESHRUN_RANK_DIR"
_ENV_OFF = "MESHRUN_PYTHON_HOOK"
_ENV_PID = "MESHRUN_PYTHON_HOOK_PID"
_STACKS = "stacks-python.txt"
_EXCEPTION = "exception.json"

_dir = None
_pid = None
_stacks_file = None  # kept open: faulthandler writes to its descriptor
_recorded = None  # "main" or "thread": which kind of exception exception.json holds
_prev_excepthook = None
_prev_threading_excepthook = None


def _file_mode():
    # 0600, or 0640 in a folder its group may read (as runlog's files).
    try:
        return 0o600 | (os.stat(_dir).st_mode & 0o040)
    except Exception:
        return 0o600


def _open_private(path, flags):
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), _file_mode())
    try:
        os.fchmod(fd, _file_mode())
    except Exception:
        pass
    return fd


def _stdlib_dirs():
    dirs = []
    try:
        import sysconfig

        paths = sysconfig.get_paths()
        for key in ("stdlib", "platstdlib"):
            p = paths.get(key)
            if p:
                dirs.append(os.path.join(os.path.abspath(p), ""))
                dirs.append(os.path.join(os.path.realpath(p), ""))
    except Exception:
        pass
    return dirs


def _is_library(filename, stdlib):
    if not filename:
        return True
    if filename.startswith("<frozen"):
        return True
    f = filename.replace("\\", "/")
    if "/site-packages/" in f or "/dist-packages/" in f:
        return True
    try:
        a = os.path.abspath(filename)
    except Exception:
        a = filename
    for d in stdlib:
        if a.startswith(d):
            return True
    return False


def _type_name(tp):
    try:
        mod = getattr(tp, "__module__", None)
        name = getattr(tp, "__qualname__", None) or tp.__name__
        if mod and mod != "builtins":
            return mod + "." + name
        return name
    except Exception:
        return "?"


def _record(tp, value, tb, thread_name, main):
    global _recorded
    if os.getpid() != _pid:
        return  # a forked child: its exceptions are not the rank's
    if _recorded == "main" or (_recorded == "thread" and not main):
        return
    import json
    import time
    import traceback

    try:
        message = str(value)
    except Exception:
        message = "<unprintable %s>" % _type_name(tp)
    frames = []
    for fs in traceback.extract_tb(tb):
        frames.append({"file": fs.filename, "line": fs.lineno or 0, "func": fs.name})
    stdlib = _stdlib_dirs()
    user = None
    for f in reversed(frames):
        if not _is_library(f["file"], stdlib):
            user = f
            break
    rec = {
        "type": _type_name(tp),
        "message": message,
        "frames": frames,
        "user_frame": user,
        "thread": thread_name,
        "time_ms": int(time.time() * 1000),
    }
    data = (json.dumps(rec, indent=2) + "\n").encode("utf-8", "replace")
    final = os.path.join(_dir, _EXCEPTION)
    tmp = os.path.join(_dir, ".%s.%d.tmp" % (_EXCEPTION, os.getpid()))
    fd = _open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while data:
            n = os.write(fd, data)
            data = data[n:]
    finally:
        os.close(fd)
    os.replace(tmp, final)
    # A thread's exception does not end the program: the main thread's,
    # should one follow, replaces it.
    _recorded = "main" if main else "thread"


def _excepthook(tp, value, tb):
    try:
        name = "MainThread"
        th = sys.modules.get("threading")
        if th is not None:
            name = th.current_thread().name
        _record(tp, value, tb, name, th is None or th.current_thread() is th.main_thread())
    except Exception:
        pass
    hook = _prev_excepthook or sys.__excepthook__
    return hook(tp, value, tb)


def _threading_excepthook(args):
    try:
        if args.exc_type is not SystemExit:
            name = args.thread.name if args.thread is not None else "?"
            _record(args.exc_type, args.exc_value, args.exc_traceback, name, False)
    except Exception:
        pass
    return _prev_threading_excepthook(args)


def _install():
    global _dir, _pid, _stacks_file, _prev_excepthook, _prev_threading_excepthook
    d = os.environ.get(_ENV_DIR)
    if not d or os.environ.get(_ENV_OFF) == "0":
        return
    owner = os.environ.get(_ENV_PID)
    if owner and owner != str(os.getpid()):
        return  # started by the rank's own Python process
    _dir = d
    _pid = os.getpid()
    try:
        os.environ[_ENV_PID] = str(_pid)
    except Exception:
        pass

    stacks = False
    try:
        import faulthandler

        try:
            import _signal as signal  # the signal module without its enums: faster to import
        except ImportError:
            import signal

        fd = _open_private(os.path.join(d, _STACKS), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        _stacks_file = os.fdopen(fd, "a")
        faulthandler.register(signal.SIGUSR1, file=_stacks_file, all_threads=True, chain=False)
        stacks = True
    except Exception:
        pass

    try:
        line = '@meshrun:hello {"stacks_on_sigusr1":%s,"runtime":"python","stacks_file":"%s","pid":%d}\n' % (
            "true" if stacks else "false",
            _STACKS,
            os.getpid(),
        )
        os.write(1, line.encode())
    except Exception:
        pass

    try:
        _prev_excepthook = sys.excepthook
        sys.excepthook = _excepthook
    except Exception:
        pass
    try:
        import threading

        _prev_threading_excepthook = threading.excepthook
        threading.excepthook = _threading_excepthook
    except Exception:
        pass


def _chain():
    # The next sitecustomize on sys.path after this one's folder: the one
    # Python would have imported without it.
    here = os.path.dirname(os.path.realpath(__file__))
    entries = list(sys.path)
    start = 0
    for i, e in enumerate(entries):
        try:
            if os.path.realpath(e or os.getcwd()) == here:
                start = i + 1
                break
        except Exception:
            pass
    path = None
    for e in entries[start:]:
        try:
            base = os.path.realpath(e or os.getcwd())
            if base == here:
                continue
            for cand in (os.path.join(base, "sitecustomize.py"), os.path.join(base, "sitecustomize", "__init__.py")):
                if os.path.isfile(cand):
                    path = cand
                    break
        except Exception:
            continue
        if path:
            break
    if path is None:
        return
    import importlib.util

    mod = None
    try:
        locations = None
        if os.path.basename(path) == "__init__.py":
            locations = [os.path.dirname(path)]
        spec = importlib.util.spec_from_file_location("sitecustomize", path, submodule_search_locations=locations)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = mod
        spec.loader.exec_module(mod)
    except Exception as err:
        # As site.execsitecustomize reports a failing sitecustomize.
        sys.modules["sitecustomize"] = _self
        if isinstance(err, ImportError) and err.name == "sitecustomize":
            return
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write(
                "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n" % (err.__class__.__name__, err)
            )


_self = sys.modules.get(__name__)
try:
    # The hook stays importable (and alive) under its own name when the
    # chained sitecustomize takes the name.
    sys.modules["_meshrun_sitecustomize"] = _self
    _install()
except Exception:
    pass
_chain()
