"""``precision: auto``: bf16 only where the hardware computes it, the choice and its reason recorded with the run,
an explicit bf16 on an emulating CPU warned of once, fp16 on a CPU refused, and a checkpoint resumed in another
precision where that is safe."""
import json
import logging
import os
import sys

import pytest
from safetensors.torch import load_file

from common import processes
from common.configlib import ConfigError
from pretrain import config, precision, resume, train
from tests.pretrain.launching import REPO, TINY, settings

NATIVE = precision.Hardware("cpu", "a CPU with AMX", True, "the CPU has amx_bf16")
EMULATED = precision.Hardware("cpu", "an AVX2 CPU", False, "the CPU has neither AVX-512 BF16 nor AMX")
AMPERE = precision.Hardware("cuda", "A100", True, "A100 computes bf16")
VOLTA = precision.Hardware("cuda", "V100", False, "V100 does not compute bf16")
SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
CASCADE_LAKE = {"avx2", "avx512f", "avx512_vnni"}
EMULATION = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


@pytest.mark.parametrize("flags, env, machine, native", [
    (SAPPHIRE_RAPIDS, {}, "x86_64", True),
    ({"avx512f", "avx512_bf16"}, {"ONEDNN_MAX_CPU_ISA": "avx512_core_amx"}, "x86_64", True),
    (SAPPHIRE_RAPIDS, EMULATION, "x86_64", False),
    (SAPPHIRE_RAPIDS, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, "x86_64", False),
    (SAPPHIRE_RAPIDS, {"ATEN_CPU_CAPABILITY": "avx2"}, "x86_64", False),
    (CASCADE_LAKE, {}, "x86_64", False),
    ({"fp", "asimd", "bf16", "sve"}, {}, "aarch64", True),
    ({"fp", "asimd"}, {}, "aarch64", False),
])
def test_native_bf16_is_read_from_the_cpu_flags_under_the_emulation_caps(flags, env, machine, native):
    found, evidence = precision.cpu_bf16(flags, env, machine)
    assert found is native and evidence


def test_the_emulated_avx2_cpu_resolves_to_fp32_on_this_machine():
    """Whatever this machine is, the two variables make it a CPU without native bf16 (a fresh process: torch reads
    them at start-up, and the detection reads them from the environment)."""
    code = ("from pretrain import precision; h = precision.cpu_hardware(); "
            "print(h.bf16, precision.choose('auto', h).precision)")
    out = processes.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, **EMULATION}, text=True,
                        capture_output=True, timeout=120, check=True).stdout.split()
    assert out == ["False", "fp32"]


@pytest.mark.parametrize("hardware, master_weights, chosen", [
    (NATIVE, True, "bf16"), (NATIVE, False, "fp32"), (EMULATED, True, "fp32"), (EMULATED, False, "fp32"),
    (AMPERE, True, "bf16"), (AMPERE, False, "fp16"), (VOLTA, True, "fp16"), (VOLTA, False, "fp16"),
])
def test_auto_chooses_from_the_hardware_and_says_why(hardware, master_weights, chosen):
    choice = precision.choose("auto", hardware, master_weights=master_weights, what="train.precision")
    assert (choice.precision, choice.warning) == (chosen, None)
    assert choice.line().startswith(f"train.precision: {chosen} (auto; ") and hardware.evidence in choice.line()


def test_an_explicit_choice_is_kept_and_bf16_on_an_emulating_cpu_is_warned_of_once(caplog):
    assert precision.choose("fp32", NATIVE).precision == "fp32"
    assert precision.choose("bf16", NATIVE).warning is None
    emulated = precision.choose("bf16", EMULATED, what="train.precision")
    assert emulated.precision == "bf16"
    assert "without native bf16" in emulated.warning and "x slower than in fp32 here" in emulated.warning
    logger = logging.getLogger("test_precision")
    with caplog.at_level(logging.WARNING, logger="test_precision"):
        precision.warn_once(emulated, logger)
        precision.warn_once(emulated, logger)
    assert [r.getMessage() for r in caplog.records] == [emulated.warning]


def test_fp16_on_a_cpu_is_refused_in_one_line():
    for hardware in (NATIVE, EMULATED):
        with pytest.raises(ConfigError, match="train.precision fp16 needs a CUDA GPU") as error:
            precision.choose("fp16", hardware, what="train.precision")
        assert "\n" not in str(error.value)
    assert precision.choose("fp16", VOLTA).precision == "fp16"
    with pytest.raises(ConfigError, match="choose one of auto, bf16, fp16, fp32"):
        precision.choose("fp8", AMPERE)


def test_a_run_config_resolves_its_precision_and_the_teachers():
    cfg = config.load(TINY)
    assert (cfg.train.precision, cfg.distillation.teacher_precision) == ("auto", "auto")
    resolved, choices = precision.resolve_run(cfg, NATIVE)
    assert resolved.train.precision == "bf16" and [c.what for c in choices] == ["train.precision"]
    at_zero_0 = config.load(TINY, ["zero.stage=0"])
    assert precision.resolve_run(at_zero_0, NATIVE)[0].train.precision == "fp32"
    assert precision.resolve_run(at_zero_0, AMPERE)[0].train.precision == "fp16"
    distilling = config.load(TINY, ["distillation.teacher=somewhere"])
    resolved, choices = precision.resolve_run(distilling, EMULATED)
    assert (resolved.train.precision, resolved.distillation.teacher_precision) == ("fp32", "fp32")
    assert [c.what for c in choices] == ["train.precision", "distillation.teacher_precision"]
    for path in sorted((REPO / "configs" / "pretrain").glob("*.yaml")):  # every shipped config is auto
        shipped = config.load(path)
        assert (shipped.train.precision, shipped.distillation.teacher_precision) == ("auto", "auto"), path.name


def test_a_precision_change_is_applied_at_zero_1_to_3_and_refused_at_zero_0_in_one_line():
    saved = {"zero.stage": 1, "train.precision": "bf16"}
    assert [str(d) for d in resume.check(saved, {**saved, "train.precision": "fp32"}, "c")] == [
        "train.precision: bf16 -> fp32"]
    fp16 = {"zero.stage": 0, "train.precision": "fp16"}
    with pytest.raises(resume.ResumeError) as error:
        resume.check(fp16, {**fp16, "train.precision": "fp32"}, "runs/x/checkpoints/step_00000004")
    message = str(error.value)
    assert "\n" not in message and "train.precision: fp16 -> fp32" in message
    assert "at ZeRO stage 0 the optimizer's checkpoint is specific to its precision" in message
    assert "set train.precision: fp16" in message
    teacher = {"distillation.teacher_precision": "bf16"}
    assert resume.check(teacher, {"distillation.teacher_precision": "fp32"}, "c")  # applied, not refused


def _cfg(dataset, out, steps, **more):
    return config.load(TINY, [a for a in settings(dataset, out, steps=steps, **more) if a != "--set"])


def test_a_run_records_its_choice_and_a_bf16_checkpoint_resumes_in_fp32_exactly(one_rank, sample_dataset, tmp_path,
                                                                                  caplog):
    """bf16 at ZeRO 1, resumed in fp32: through the universal format, the fp32 weights carry over bit for bit (the
    resumed run's export at the checkpoint's step equals the bf16 run's), and training continues."""
    caplog.set_level("INFO", logger="pretrain")
    out = tmp_path / "run"
    bf16 = {"train.precision": "bf16", "zero.stage": 1, "checkpoint.export_hf": "true",
            "train.global_batch_size": 8, "train.micro_batch_size": 8}  # small: quick where bf16 is emulated
    assert train.run(_cfg(sample_dataset, out, 2, **bf16), one_rank, resume=False) == 0
    written = load_file(out / "hf" / "model.safetensors")
    saved = (out / "config.yaml").read_text()
    assert saved.startswith("# train.precision: bf16 (set in the config; ") and "  precision: bf16\n" in saved
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "step_00000002").rename(resumed / "checkpoints" / "step_00000002")
    fp32 = {**bf16, "train.precision": "fp32"}
    assert train.run(_cfg(sample_dataset, resumed, 2, **fp32), one_rank, resume=True) == 0
    assert "converting it to a universal checkpoint" in caplog.text
    assert "resuming with a changed setting, applied from step 2 on: train.precision: bf16 -> fp32" in caplog.text
    exported = load_file(resumed / "hf" / "model.safetensors")
    assert written.keys() == exported.keys()
    assert all(bool((written[k] == exported[k]).all()) for k in written)
    auto = {**bf16, "train.precision": "auto"}
    assert train.run(_cfg(sample_dataset, resumed, 3, **auto), one_rank, resume=True) == 0
    summary = json.loads((resumed / "summary.json").read_text())
    chosen = summary["precision"]["train.precision"]
    assert summary["step"] == 3 and chosen["requested"] == "auto" and chosen["reason"]
    assert f"train.precision: {chosen['chosen']} (auto; {chosen['reason']})" in caplog.text
    assert (resumed / "config.yaml").read_text().startswith(f"# train.precision: {chosen['chosen']} (auto; ")
