"""oneDNN on any x86-64 CPU, the CPU report, and an honest --amp (common/cpu.py, common/runtime.py)."""

import platform
import types

import pytest

from common import cpu
from tests import helpers

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni"}
SAPPHIRE_RAPIDS = AVX512 | {"avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}


@pytest.mark.parametrize("flags, isa, bf16", [
    (AVX2, "AVX2", False),
    (AVX512, "AVX-512", False),
    (AVX512 | {"avx512_bf16"}, "AVX-512", True),
    (SAPPHIRE_RAPIDS, "AMX", True),
])
def test_isa_and_native_bf16_from_cpu_flags(flags, isa, bf16):
    assert cpu.isa(flags) == isa
    assert cpu.has_native_bf16(flags) is bf16


def test_onednn_is_preferred_on_x86_64_only_and_a_user_choice_is_kept():
    env = {}
    assert cpu.prefer_onednn(env, machine="x86_64") and env == {cpu.ONEDNN_ENV: "1"}
    env = {cpu.ONEDNN_ENV: "0"}
    assert not cpu.prefer_onednn(env, machine="x86_64") and env == {cpu.ONEDNN_ENV: "0"}
    env = {}
    assert not cpu.prefer_onednn(env, machine="aarch64") and env == {}


PROBE = "import common, tensorflow; from common import cpu; print('onednn', cpu.onednn_enabled())"


@pytest.mark.skipif(platform.machine() != "x86_64", reason="oneDNN is turned on for x86-64 CPUs only")
@pytest.mark.parametrize("user_value, expected", [(None, "True"), ("0", "False")])
def test_tensorflow_runs_onednn_unless_the_user_turned_it_off(user_value, expected):
    env = helpers.env()
    env.pop(cpu.ONEDNN_ENV, None)
    if user_value is not None:
        env[cpu.ONEDNN_ENV] = user_value
    proc = helpers.run([helpers.PYTHON, "-c", PROBE], timeout=120, environ=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["onednn", expected]


def rt(amp=True, amp_dtype="auto"):
    return types.SimpleNamespace(amp=amp, amp_dtype=amp_dtype)


@pytest.mark.parametrize("runtime, device, native, precision, says_why", [
    (rt(amp=False), "cpu", False, "float32", False),
    (rt(), "cpu", True, "mixed_bfloat16", False),
    (rt(), "cpu", False, "float32", True),                      # emulated bf16: stays fp32, says so
    (rt(amp_dtype="bfloat16"), "cpu", False, "mixed_bfloat16", False),   # forced
    (rt(), "gpu", False, "mixed_float16", False),
    (rt(amp_dtype="bfloat16"), "gpu", False, "mixed_bfloat16", False),
])
def test_amp_precision_follows_the_hardware(runtime, device, native, precision, says_why):
    from common.runtime import choose_precision
    chosen, why = choose_precision(runtime, device, native_bf16=native)
    assert chosen == precision
    assert bool(why) is says_why
    if says_why:
        assert "no native bf16" in why and "runtime.amp_dtype=bfloat16" in why and "\n" not in why
