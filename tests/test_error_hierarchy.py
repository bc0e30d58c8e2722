"""Every exception class the package defines derives from fx100io.errors.Fx100ioError,
so ``except Fx100ioError`` catches whatever fx100io raises on purpose."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import fx100io
from fx100io.errors import Fx100ioError, Fx100ioValueError


def _exception_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    modules = [fx100io.__name__] + [
        m.name for m in pkgutil.walk_packages(fx100io.__path__, "fx100io.")
        if not m.name.endswith("__main__")]
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:  # an adapter whose engine is not installed here
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__.startswith("fx100io"):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_exception_class_of_the_package_is_an_fx100io_error():
    found = _exception_classes()
    assert "fx100io.contrib._settings.BackendConfigError" in found
    wrong = sorted(n for n, c in found.items() if not issubclass(c, Fx100ioError))
    assert wrong == [], wrong


def test_message_only_errors_keep_their_message_builtin_and_pickle():
    from fx100io.contrib._lmcache_codec import RecordError
    from fx100io.contrib._settings import BackendConfigError

    for cls in (BackendConfigError, RecordError, Fx100ioValueError):
        e = cls("size: must be positive")
        assert isinstance(e, ValueError) and isinstance(e, Fx100ioError)
        assert str(e) == "size: must be positive" and e.errno == 22
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and str(back) == str(e) and back.errno == 22


def test_converted_errors_keep_their_builtin_message_errno_and_pickle():
    """The classes that began as RuntimeError / Exception: still caught as that builtin,
    str() is the message alone, errno says what kind of failure it is, and a pickled
    one (a worker process's error) comes back the same."""
    import errno

    from fx100io import _core
    from fx100io.bench.errors import BenchError
    from fx100io.contrib._lmcache_mp_core import ServiceClosed
    from fx100io.contrib._runtime import LoopGone, TimedOut
    from fx100io.contrib._settings import BackendStartError

    for cls, builtin, err in ((BackendStartError, RuntimeError, errno.EIO),
                              (ServiceClosed, RuntimeError, errno.EBADF),
                              (LoopGone, RuntimeError, errno.ESHUTDOWN),
                              (TimedOut, Exception, errno.ETIMEDOUT),
                              (BenchError, Exception, errno.EIO),
                              (_core.BenchLoopThreadError, RuntimeError, errno.EPERM)):
        e = cls("it went wrong")
        assert isinstance(e, builtin) and isinstance(e, Fx100ioError), cls
        assert str(e) == "it went wrong" and e.errno == err, cls
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and str(back) == str(e) and back.errno == err
    assert str(TimedOut()) == "" and TimedOut().errno == errno.ETIMEDOUT  # as Exception()
    # TimedOut must not pass for asyncio's TimeoutError (an `except TimeoutError` around
    # asyncio.wait_for would take it for its own)
    assert not isinstance(TimedOut("x"), TimeoutError)


def test_message_errors_never_take_an_argument_for_an_errno():
    """Two or more arguments mean what they mean to a builtin: kept in args, the message
    is their tuple's str(), and errno stays the class's, pickled or not."""
    import errno

    from fx100io.bench.errors import BenchError
    from fx100io.contrib._runtime import TimedOut
    from fx100io.contrib._settings import BackendConfigError

    for e, err in ((BenchError("a %s", 1), errno.EIO), (TimedOut("x", 3), errno.ETIMEDOUT),
                   (BenchError(28, "no space"), errno.EIO),
                   (BackendConfigError(5, "y", "z"), errno.EINVAL)):
        for one in (e, pickle.loads(pickle.dumps(e))):
            assert one.errno == err and one.args == e.args, one
            assert str(one) == str(RuntimeError(*e.args)), one


def test_the_breaker_takes_only_device_failures_not_our_own_refusals():
    """A message error carries an errno (LoopGone ESHUTDOWN, BackendStartError and
    BenchError EIO) that would read as a device failure: only TimedOut is one."""
    import errno

    from fx100io.bench.errors import BenchError
    from fx100io.contrib._runtime import LoopGone, TimedOut, is_device_error
    from fx100io.contrib._settings import BackendStartError
    from fx100io.errors import DeviceIOError

    assert is_device_error(TimedOut("slow"))
    assert is_device_error(DeviceIOError(errno.EIO, "io"))
    assert is_device_error(OSError(errno.ECONNRESET, "reset"))
    for e in (LoopGone("closed"), BackendStartError("no device"), BenchError("--size")):
        assert e.errno in (errno.ESHUTDOWN, errno.EIO)
        assert not is_device_error(e), e
