"""Launch plans (``gpt2enc_edu.plans``) on any machine: what a recording keeps, which addresses and which seed a
replay writes into each launch's arguments, what makes a call unplannable, and what a failed replay undoes. The
driver is a stand-in that reads each launch's argument values back as the real one would copy them; on the GPU,
``test_torch.py`` checks that replayed calls give the package calls' bits."""

from __future__ import annotations

import ctypes
import struct
import threading
import time

import numpy as np
import pytest

from gpt2enc_edu import caches, driver, plans


class _DeviceArray:
    """Stands in for a CuPy array: a plan reads ``.data.ptr`` and ``.nbytes``."""

    def __init__(self, ptr: int, nbytes: int):
        self.data = type("Memory", (), {"ptr": ptr})()
        self.nbytes = nbytes


class _Handle:
    def __init__(self, ptr: int):
        self.ptr = ptr


class _Kernel:
    """Stands in for a ``cupy.RawKernel``: its name and its loaded function's address."""

    def __init__(self, name: str, ptr: int):
        self.name, self.kernel = name, _Handle(ptr)


class _Driver:
    """libcuda as a replay calls it: records each call, with the argument values a launch would copy."""

    def __init__(self, fail_at: int | None = None):
        self.calls: list = []
        self.fail_at = fail_at

    @staticmethod
    def _value(argument) -> int:
        return argument.value if isinstance(argument, ctypes.c_void_p) else argument

    def _status(self) -> int:
        return 700 if len(self.calls) == self.fail_at else 0

    def cuLaunchKernelEx(self, config_ref, function_ptr, params, extra):  # noqa: N802 (the driver's name)
        config = ctypes.cast(config_ref, ctypes.POINTER(driver.LaunchConfig)).contents
        function_ptr, params = self._value(function_ptr), self._value(params)
        count = self.arg_counts[function_ptr]
        pointers = struct.unpack(f"<{count}Q", ctypes.string_at(params, 8 * count))
        values = [ctypes.string_at(p, 8) for p in pointers]
        status = self._status()
        self.calls.append(("launch", function_ptr, tuple(config.grid), config.stream, values))
        return status

    def cuEventRecord(self, event, stream):  # noqa: N802
        status = self._status()
        self.calls.append(("record", self._value(event), self._value(stream)))
        return status

    def cuStreamWaitEvent(self, stream, event, flags):  # noqa: N802
        status = self._status()
        self.calls.append(("wait", self._value(stream), self._value(event)))
        return status

    def cuGetErrorString(self, status, text):  # noqa: N802
        return 0


@pytest.fixture
def fake_driver(monkeypatch):
    def install(fake):
        monkeypatch.setattr(driver, "libcuda", lambda: fake)
        return fake

    return install


def _q(value: int) -> bytes:
    return struct.pack("<Q", value)


def _u32(value: int) -> bytes:
    return struct.pack("<I4x", value)


def _i32(value: int) -> bytes:
    return struct.pack("<i4x", value)


def _record_call(recorder, out, ids, scratch, seed: int):
    """A call of two kernels and a side stream: what ``cuda``'s deterministic backward launches, in miniature."""
    main, side, ready, done = _Handle(0x51), _Handle(0x52), _Handle(0xE1), _Handle(0xE2)
    recorder.record_event(ready, main)
    recorder.wait_event(side, ready)
    recorder.kernel(_Kernel("first", 0xF1), (4,), 256, 0, (out, ids, np.int32(7), np.uint32(seed)), side.ptr, None)
    recorder.record_event(done, side)
    # an argument at an offset into the call's output, and scratch the plan keeps
    recorder.kernel(_Kernel("second", 0xF2), (3, 2), 128, 0, (_view_at(out, 64), scratch, np.uint32(seed)), main.ptr,
                    driver.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    recorder.wait_event(main, done)


def _view_at(array: _DeviceArray, offset: int) -> _DeviceArray:
    return _DeviceArray(array.data.ptr + offset, array.nbytes - offset)


def test_a_replay_writes_the_new_addresses_and_seed_into_every_launch(fake_driver):
    out, ids, scratch = _DeviceArray(0x10000, 4096), _DeviceArray(0x20000, 512), _DeviceArray(0x90000, 256)
    with plans.recording() as recorder:
        assert plans.active() is recorder
        _record_call(recorder, out, ids, scratch, seed=1234)
    assert plans.active() is None
    plan = recorder.plan({"out": out, "ids": ids}, seed=1234)
    assert plan is not None and plan.names == ("out", "ids") and plan.launches == 2
    fake = fake_driver(_Driver())
    fake.arg_counts = {0xF1: 4, 0xF2: 3}
    plan.replay((0x7000_0000, 0x7100_0000), 99)
    plan.replay((0x8000_0000, 0x8100_0000), 2**32 - 1)
    first, second = fake.calls[:6], fake.calls[6:]
    assert [c[0] for c in first] == ["record", "wait", "launch", "record", "launch", "wait"]
    assert first[0] == ("record", 0xE1, 0x51) and first[1] == ("wait", 0x52, 0xE1)
    assert first[2] == ("launch", 0xF1, (4, 1, 1), 0x52, [_q(0x7000_0000), _q(0x7100_0000), _i32(7), _u32(99)])
    assert first[4] == ("launch", 0xF2, (3, 2, 1), 0x51, [_q(0x7000_0000 + 64), _q(0x90000), _u32(99)])
    assert second[2][4] == [_q(0x8000_0000), _q(0x8100_0000), _i32(7), _u32(2**32 - 1)]
    assert second[4][4] == [_q(0x8000_0000 + 64), _q(0x90000), _u32(2**32 - 1)]


@pytest.mark.parametrize("case", ["refused", "seed", "overlap", "no seed", "python int"])
def test_what_cannot_be_replayed_makes_no_plan(case):
    out, ids, scratch = _DeviceArray(0x10000, 4096), _DeviceArray(0x20000, 512), _DeviceArray(0x90000, 256)
    with plans.recording() as recorder:
        _record_call(recorder, out, ids, scratch, seed=5)
        if case == "refused":
            recorder.refuse("a per-call counter")
        if case == "python int":  # CuPy launches it; the driver's argument buffer has no size for it
            recorder.kernel(_Kernel("third", 0xF3), (1,), 32, 0, (out, 3), 0x51, None)
    arrays = {"out": out, "ids": ids}
    if case == "overlap":  # two names over one address range: a recorded address could belong to either
        arrays["inside"] = _view_at(out, 1024)
    seed = {"seed": 6, "no seed": None}.get(case, 5)  # a uint32 argument is the seed, or no plan is made
    assert recorder.plan(arrays, seed) is None


def test_a_failed_replay_undoes_and_is_spent(fake_driver):
    out, ids, scratch = _DeviceArray(0x10000, 4096), _DeviceArray(0x20000, 512), _DeviceArray(0x90000, 256)
    undone = []
    with plans.recording() as recorder:
        _record_call(recorder, out, ids, scratch, seed=5)
        recorder.on_failure(lambda: undone.append("counts dirty"))
    plan = recorder.plan({"out": out, "ids": ids}, 5)
    fake = fake_driver(_Driver(fail_at=4))  # the second launch fails
    fake.arg_counts = {0xF1: 4, 0xF2: 3}
    with pytest.raises(RuntimeError, match="cuLaunchKernelEx of second returned 700"):
        plan.replay((0x7000_0000, 0x7100_0000), 1)
    assert plan.spent and undone == ["counts dirty"] and len(fake.calls) == 5


def test_recordings_belong_to_their_thread_and_do_not_nest():
    seen = []
    with plans.recording():
        thread = threading.Thread(target=lambda: seen.append(plans.active()))
        thread.start()
        thread.join()
        with pytest.raises(RuntimeError, match="already in progress"), plans.recording():
            pass
    assert seen == [None] and plans.active() is None


def test_found_entries_are_pinned_while_capturing_and_put_replaces():
    cache = caches.BoundedCache("test plans", 2)
    assert cache.find("a") is None
    cache.put("a", "plan a")
    cache.put("b", "plan b")
    assert cache.find("a", capturing=True) == "plan a" and cache.pinned == 1
    cache.put("c", "plan c")
    cache.put("d", "plan d")  # "b" and "c" go; "a", pinned, stays
    assert cache.find("b") is None and cache.find("a") == "plan a" and cache.find("d") == "plan d"
    cache.put("a", "plan a again")  # recorded again (a spent plan): replaced, the old one held for the graph
    assert cache.find("a") == "plan a again" and cache.pinned == 1 and len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and cache.pinned == 0


def test_a_host_table_copied_over_refuses_the_recording():
    """llm.c's route builds the table on the host from this call's ids and copies it over, with a grid its contents
    set: a recording that meets it makes no plan (refused before anything touches a GPU)."""
    from gpt2enc_edu.buckets import build_bucket_table, to_device
    from gpt2enc_edu.loader import CudaUnavailableError
    from gpt2enc_edu.rounding import bfloat16

    table = build_bucket_table(np.arange(16, dtype=np.int32).reshape(2, 8) % 5, 64, bfloat16)
    with plans.recording() as recorder:
        try:
            to_device(table)
        except CudaUnavailableError:  # no GPU here: the refusal came first
            pass
    assert recorder.refusals and recorder.plan({}, None) is None


def test_threads_replaying_one_plan_never_mix_their_arguments(fake_driver):
    """A replay rewrites the plan's argument buffers and then launches: threads replaying one plan take turns,
    so every launch carries the addresses and seed of the thread that launched it."""
    out, ids, scratch = _DeviceArray(0x10000, 4096), _DeviceArray(0x20000, 512), _DeviceArray(0x90000, 256)
    with plans.recording() as recorder:
        _record_call(recorder, out, ids, scratch, seed=5)
    plan = recorder.plan({"out": out, "ids": ids}, 5)
    fake = fake_driver(_Driver())
    fake.arg_counts = {0xF1: 4, 0xF2: 3}
    launch = fake.cuLaunchKernelEx

    launched_by = []

    def slow_launch(*args):
        time.sleep(0.0005)  # room for another thread to rewrite the buffers, were it let in
        launched_by.append(threading.current_thread().name)
        return launch(*args)

    fake.cuLaunchKernelEx = slow_launch
    calls = {str(t): ((0x1000_0000 * (t + 1), 0x1100_0000 * (t + 1)), t + 100) for t in range(4)}

    def replay():
        for _ in range(20):
            plan.replay(*calls[threading.current_thread().name])

    threads = [threading.Thread(target=replay, name=name) for name in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    launches = [c for c in fake.calls if c[0] == "launch"]
    assert len(launches) == 2 * 80
    for name, (function_ptr, *_, values) in zip(launched_by, (c[1:] for c in launches)):
        (out_address, ids_address), seed = calls[name]
        expected = ([_q(out_address), _q(ids_address), _i32(7), _u32(seed)] if function_ptr == 0xF1
                    else [_q(out_address + 64), _q(0x90000), _u32(seed)])
        assert values == expected, name
