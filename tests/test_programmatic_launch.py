"""The programmatic dependent launcher (``loader.launch(..., after_kernel=True)``), on any machine: its structures
match cuda.h's, its argument array points at each argument's value, and it refuses what a kernel cannot take; the
device facts it goes by are read once per device, and the chunk kernel's form is chosen from them
(``cuda.chunk_walk``). (On the GPU, ``test_perf_paths.py`` checks that the bits are the same with it on and off.)"""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from gpt2enc_edu import driver, loader


class _DeviceArray:
    """Stands in for a CuPy array: the launcher reads only ``.data.ptr``."""

    def __init__(self, ptr: int):
        self.data = type("Memory", (), {"ptr": ptr})()


def _read_params(params, formats: str) -> list:
    """The values behind ``void* params[]``, read back through the addresses, one ``struct`` format each."""
    _buffer, addresses = params
    count = len(formats)
    pointers = struct.unpack(f"<{count}Q", ctypes.string_at(addresses, 8 * count))
    return [struct.unpack("<" + f, ctypes.string_at(p, struct.calcsize(f)))[0] for p, f in zip(pointers, formats)]


def test_kernel_params_point_at_each_value(rng):
    ptrs = [int(x) for x in rng.integers(1, 2**47, size=3)]
    scalars = [np.int32(rng.integers(-2**31, 2**31)), np.uint32(rng.integers(0, 2**32)),
               np.float32(rng.standard_normal()), np.int64(rng.integers(-2**63, 2**63)),
               np.uint64(rng.integers(0, 2**63)) + np.uint64(2**63)]
    args = (*[_DeviceArray(p) for p in ptrs], *scalars)
    got = _read_params(driver.kernel_params(args), "QQQiIfqQ")
    assert got[:3] == ptrs
    assert got[3:] == [s.item() for s in scalars]
    assert np.float32(got[5]).tobytes() == scalars[2].tobytes()  # the float's bits, not just its value


@pytest.mark.parametrize("bad", [3, 2.5, True, np.float64(1.0), np.int16(2), "dwte", None])
def test_kernel_params_refuse_what_a_kernel_cannot_take(bad):
    with pytest.raises(TypeError, match="cannot pass"):
        driver.kernel_params((_DeviceArray(4096), bad))


def test_launch_structures_match_cuda_h():
    """CUlaunchAttribute: id, padding, then a 64-byte union at offset 8 (72 bytes); CUlaunchConfig: six dims and the
    shared memory (28 bytes), then the stream at 32, the attribute pointer at 40, their count at 48 (56 bytes)."""
    assert ctypes.sizeof(driver.LaunchAttribute) == 72 and driver.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(driver.LaunchConfig) == 56
    assert (driver.LaunchConfig.shared_mem.offset, driver.LaunchConfig.stream.offset,
            driver.LaunchConfig.attrs.offset, driver.LaunchConfig.num_attrs.offset) == (24, 32, 40, 48)
    attributes = driver.LAUNCH_ATTRIBUTES
    assert sorted(attributes) == [2, 6] and all(a.id == k and a.value[0] == 1 for k, a in attributes.items())


@pytest.mark.parametrize("attribute", [None, driver.CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
                                       driver.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION])
@pytest.mark.parametrize("grid", [(7,), (5, 3)])
def test_a_launch_configuration_holds_its_shape_stream_and_attribute(grid, attribute):
    config = driver.launch_config(grid, 256, 512, 0xABC0, attribute)
    assert list(config.grid) == [*grid, 1, 1][:3] and list(config.block) == [256, 1, 1]
    assert (config.shared_mem, config.stream) == (512, 0xABC0)
    assert config.num_attrs == (attribute is not None)
    if attribute is not None:
        assert config.attrs.contents.id == attribute and config.attrs.contents.value[0] == 1


class _FakeDevice:
    """Stands in for ``cupy.cuda.Device()``: counts how often all attributes are read (each read costs host time)."""

    reads: dict = {}
    current = 0
    specs = {0: (90, 132, 60 * 2**20, 227 * 2**10), 1: (80, 108, 40 * 2**20, 163 * 2**10)}

    def __init__(self):
        self.id = _FakeDevice.current
        self.compute_capability = str(self.specs[self.id][0])

    @property
    def attributes(self):
        _FakeDevice.reads[self.id] = _FakeDevice.reads.get(self.id, 0) + 1
        cc, sms, l2, shared = self.specs[self.id]
        return {"MultiProcessorCount": sms, "L2CacheSize": l2, "MaxSharedMemoryPerBlockOptin": shared,
                "MaxThreadsPerBlock": 1024}


def test_device_facts_are_read_once_per_device(monkeypatch):
    fake_cupy = type("cupy", (), {"cuda": type("cuda", (), {"Device": _FakeDevice})})
    monkeypatch.setattr(loader, "cupy_module", lambda: fake_cupy)
    monkeypatch.setattr(loader, "_device_facts", {})
    monkeypatch.setattr(_FakeDevice, "reads", {})
    for device in (0, 1, 0, 1, 0):
        monkeypatch.setattr(_FakeDevice, "current", device)
        facts = loader.device_facts()
        assert (facts.compute_capability, facts.sm_count, facts.l2_cache_bytes,
                facts.shared_per_block_optin) == _FakeDevice.specs[device]
        assert loader.programmatic_launch_supported() == (device == 0)  # sm_90 and newer
    assert _FakeDevice.reads == {0: 1, 1: 1}


def test_chunk_walk_stages_rows_only_where_the_grid_fits_in_one_wave(monkeypatch):
    """The staged chunk kernel holds fewer blocks per SM: the package launches it only while its whole grid is one
    wave (units / 8 warps per block, times the channel groups), and never below sm_80 (no cp.async there)."""
    from gpt2enc_edu import cuda
    from gpt2enc_edu.rounding import bfloat16

    def staged_blocks(file_name, kernel_name, dtype, block):
        assert (file_name, kernel_name, block) == ("encoder_backward_wte_chunked.cu", cuda.CHUNK_WALKS["staged"], 256)
        return 6

    monkeypatch.setattr(cuda, "blocks_per_sm", staged_blocks)
    monkeypatch.setattr(cuda, "device_facts", lambda: loader.DeviceFacts(90, 132, 60 * 2**20, 227 * 2**10))
    one_wave_units = 6 * 132 // 3 * 8  # C = 768 in bf16: 3 channel groups; 8 units (warps) per block
    assert cuda.chunk_walk(1, 768, bfloat16) == "staged"
    assert cuda.chunk_walk(one_wave_units, 768, bfloat16) == "staged"
    assert cuda.chunk_walk(one_wave_units + 1, 768, bfloat16) == "registers"
    assert cuda.chunk_walk(one_wave_units, 264, bfloat16) == "staged"  # 1 channel group: 3 times the units fit
    assert cuda.chunk_walk(3 * one_wave_units + 1, 264, bfloat16) == "registers"
    monkeypatch.setattr(cuda, "device_facts", lambda: loader.DeviceFacts(75, 40, 4 * 2**20, 64 * 2**10))
    assert cuda.chunk_walk(1, 768, bfloat16) == "registers"


@pytest.mark.parametrize("walk, error", [("diagonal", ValueError), ("Staged", ValueError), (1, TypeError)])
def test_chunked_wte_refuses_an_unknown_walk_before_touching_anything(walk, error):
    """The walk is checked first: no table is copied and no kernel compiled or launched (this runs without a GPU)."""
    from gpt2enc_edu import cuda

    with pytest.raises(error, match="walk"):
        cuda.encoder_backward_wte_chunked(None, None, None, 768, 1, walk=walk)


class _FakeKernel:
    """Stands in for a ``cupy.RawKernel``: counts the launches and each raise of its shared-memory limit."""

    def __init__(self, ptr: int):
        self.name, self.kernel, self.enable_cooperative_groups = f"kernel_{ptr}", type("F", (), {"ptr": ptr})(), False
        self.launches, self.limits = [], []

    @property
    def max_dynamic_shared_size_bytes(self):
        return self.limits[-1] if self.limits else 0

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value):
        self.limits.append(value)

    def __call__(self, grid, block, args, shared_mem=0):
        assert shared_mem <= loader.SHARED_WITHOUT_OPT_IN or shared_mem <= self.max_dynamic_shared_size_bytes
        self.launches.append(shared_mem)


def test_a_launch_beyond_48_kb_of_shared_memory_opts_the_kernel_in_once(monkeypatch):
    """Up to 48 KB a launch asks nothing; beyond it the kernel raises its limit first, once per loaded function and
    device and again only for more; beyond the device's most, nothing is launched."""
    fake_cupy = type("cupy", (), {"cuda": type("cuda", (), {"Device": _FakeDevice})})
    monkeypatch.setattr(loader, "cupy_module", lambda: fake_cupy)
    monkeypatch.setattr(loader, "_device_facts", {})
    monkeypatch.setattr(loader, "_shared_opted_in", {})
    monkeypatch.setattr(_FakeDevice, "current", 1)  # 163 KB a block at most
    kernel, other = _FakeKernel(0x1000), _FakeKernel(0x2000)
    for shared in (0, 48 * 1024, 128 * 1024, 128 * 1024, 64 * 1024, 160 * 1024):
        loader.launch(kernel, 4, 256, (), shared_mem=shared)
    assert kernel.limits == [128 * 1024, 160 * 1024]
    loader.launch(other, 4, 256, (), shared_mem=128 * 1024)
    assert other.limits == [128 * 1024]  # its own attribute: another loaded function
    with pytest.raises(RuntimeError, match="needs 200704 bytes of shared memory a block; this GPU gives at most"):
        loader.launch(kernel, 4, 256, (), shared_mem=196 * 1024)
    assert kernel.launches == [0, 48 * 1024, 128 * 1024, 128 * 1024, 64 * 1024, 160 * 1024]  # not the refused one
