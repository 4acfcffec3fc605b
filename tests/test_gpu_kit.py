"""The GPU kit's checks, run on the CPU with tiny random models (the real run needs CUDA)."""

import json
from dataclasses import replace

import pandas as pd
import pytest
import torch

from lpes_nb.operations import gpu_kit
from lpes_nb.operations.gpu_kit import DRY, ParityFailure, kit_model, parity_case, run_kit, run_parity

ONE = replace(DRY, parity_models=("tiny-llama",), dtypes=("float16",), attentions=("sdpa",))


def _pair(name="tiny-llama", dtype="float16"):
    model = kit_model(name, dtype, "sdpa", dry=True)
    reference = kit_model(name, "float32", "eager", dry=True)
    reference.load_state_dict(model.state_dict())
    return model, reference


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_parity_passes_the_right_scales_and_detects_a_layer_left_unpatched(name):
    model, reference = _pair(name)
    right = parity_case(model, reference, 64)
    assert right["matches"] and right["error"] <= right["allowed"]
    assert right["tables_match"] and right["table_error"] <= right["table_allowed"]
    assert right["wrong_scale_detected"] and right["wrong_scale_table_error"] > 0.1  # cos(p) against cos(p/2): far apart
    wrong = parity_case(model, reference, 64, wrong_scales=True)
    assert not wrong["tables_match"] and wrong["worst_layer"] == model.config.num_hidden_layers // 2
    assert not wrong["matches"] and wrong["error"] > gpu_kit.DETECT * wrong["allowed"]


def test_parity_allowance_tracks_the_dtype_floor():
    """bf16 rounds ~8x coarser than fp16: its floor, and so its allowance, is larger."""
    (m16, r16), (mb, rb) = _pair(dtype="float16"), _pair(dtype="bfloat16")
    fp16, bf16 = parity_case(m16, r16, 64), parity_case(mb, rb, 64)
    assert bf16["unpatched_error"] > 3 * fp16["unpatched_error"]
    assert fp16["matches"] and bf16["matches"]


def test_an_injected_wrong_scale_stops_the_kit_with_the_numbers(tmp_path):
    with pytest.raises(ParityFailure, match="MISMATCH") as err:
        run_parity(tmp_path, ONE, dry=True, inject_wrong_scale=True)
    assert "table_error" in str(err.value) and "tiny-llama" in str(err.value)
    assert run_parity(tmp_path, ONE, dry=True)["ok"] == 1


def test_flash_attention_without_the_package_is_reported_unavailable_not_passed(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("on a GPU flash-attention may be installed")
    result = run_parity(tmp_path, replace(ONE, attentions=("sdpa", "flash_attention_2")), dry=True)
    assert result["ok"] == 1 and len(result["unavailable"]) == 1
    assert result["unavailable"][0]["attention"] == "flash_attention_2"


def test_kit_steps_write_the_schema_and_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_kit, "DRY", replace(DRY, latency_prompts=3, ga_candidates=2))
    status = run_kit(tmp_path, dry=True, steps=("carry", "latency", "ga"))
    assert status == {"carry": "done", "latency": "done", "ga": "done"}
    carry = json.loads((tmp_path / "carry.json").read_text())["result"]
    assert carry["round_trip_identical"] and carry["parts"] >= 1
    latency = json.loads((tmp_path / "latency.json").read_text())
    assert latency["machine"]["device"] == "cpu"
    methods = {row["method"]: row for row in latency["result"]["methods"]}
    assert set(methods) == {"baseline", "PI", "LPES", "Ms-PoE", "Attention Buckets", "MoICE (untrained)"}
    assert methods["baseline"]["median_ratio"] == 1.0
    assert all(r["q25_s"] <= r["median_s"] <= r["q75_s"] and r["ratio_ci_low"] <= r["median_ratio"] <= r["ratio_ci_high"]
               for r in methods.values())
    ga = json.loads((tmp_path / "ga.json").read_text())["result"]
    assert ga["seconds_per_candidate"] > 0 and ga["predicted_seconds_per_candidate"] > 0
    assert ga["measured_over_predicted"] == pytest.approx(ga["seconds_per_candidate"] / ga["predicted_seconds_per_candidate"])
    assert run_kit(tmp_path, dry=True, steps=("carry", "latency", "ga")) == dict.fromkeys(("carry", "latency", "ga"), "done before")


def test_kit_refuses_unknown_steps_and_a_real_run_without_cuda(tmp_path):
    with pytest.raises(ValueError, match=r"unknown kit step\(s\) \['warp'\]"):
        run_kit(tmp_path, dry=True, steps=("warp",))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            run_kit(tmp_path, dry=False)


def test_timings_name_the_attention_kernel_they_measured(monkeypatch):
    """Without flash-attn the timing steps take sdpa and say so; they never fail or pass it off as flash."""
    assert gpu_kit.timing_attention(dry=True) == ("sdpa", None)
    real_find_spec = gpu_kit.importlib.util.find_spec
    monkeypatch.setattr(gpu_kit.importlib.util, "find_spec", lambda name: None if name == "flash_attn" else real_find_spec(name))
    attn, note = gpu_kit.timing_attention(dry=False)
    assert attn == "sdpa" and "flash-attn is not installed" in note
    monkeypatch.setattr(gpu_kit.importlib.util, "find_spec", lambda name: object())
    assert gpu_kit.timing_attention(dry=False) == ("flash_attention_2", None)


def test_the_carry_step_packs_only_the_weights_asked_for(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setitem(gpu_kit.RUNNERS, "carry", lambda out, plan, dry: seen.append(plan.carry_models) or {})
    gpu_kit.main(["--out", str(tmp_path / "a"), "--dry", "--steps", "carry", "--carry-models"])
    gpu_kit.main(["--out", str(tmp_path / "b"), "--dry", "--steps", "carry", "--carry-models", "smollm2-135m"])
    gpu_kit.main(["--out", str(tmp_path / "c"), "--dry", "--steps", "carry"])
    assert seen == [(), ("smollm2-135m",), DRY.carry_models]



def test_the_ga_step_runs_at_the_batch_asked_for(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setitem(gpu_kit.RUNNERS, "ga", lambda out, plan, dry: seen.append(plan.ga_batch_size) or {})
    gpu_kit.main(["--out", str(tmp_path / "a"), "--dry", "--steps", "ga", "--ga-batch-size", "3"])
    gpu_kit.main(["--out", str(tmp_path / "b"), "--dry", "--steps", "ga"])
    assert seen == [3, DRY.ga_batch_size]
    assert json.loads((tmp_path / "a" / "ga.json").read_text())["plan"]["ga_batch_size"] == 3
    with pytest.raises(ValueError, match="ga_batch_size must be an integer >= 1, got 0"):
        gpu_kit.run_kit(tmp_path / "c", dry=True, steps=("ga",), ga_batch_size=0)

def test_a_missed_layer_is_caught_where_the_logits_cannot_see_it():
    """At the usual 0.02 init a random model attends almost uniformly, as the 7B shapes did on an H200:
    the logits pass a patch that missed a layer, the tables that layer's attention received do not."""
    model = kit_model("tiny-llama", "bfloat16", "sdpa")
    reference = kit_model("tiny-llama", "float32", "eager")
    reference.load_state_dict(model.state_dict())
    wrong = parity_case(model, reference, 64, wrong_scales=True)
    assert wrong["matches"]
    assert not wrong["tables_match"] and wrong["worst_layer"] == model.config.num_hidden_layers // 2


def test_a_cut_off_latency_step_keeps_its_prompts_and_times_only_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_kit, "DRY", replace(DRY, latency_prompts=3))
    # a budget any prompt outlasts (0.5 s let a fast CPU time two): the step stops after its first prompt
    assert run_kit(tmp_path, dry=True, steps=("latency",), budget_s=1e-3) == {
        "latency": "incomplete: budget spent (call again; it resumes from its store)"}
    first = pd.read_csv(tmp_path / "latency_times.csv")
    assert set(first.prompt) == {0} and len(first) == 6 and not (tmp_path / "latency.json").exists()
    assert run_kit(tmp_path, dry=True, steps=("latency",)) == {"latency": "done"}
    times = pd.read_csv(tmp_path / "latency_times.csv")
    assert sorted(set(times.prompt)) == [0, 1, 2] and len(times) == 18
    pd.testing.assert_frame_equal(times[times.prompt == 0].reset_index(drop=True), first)  # kept, not timed again
    assert json.loads((tmp_path / "latency.json").read_text())["result"]["prompts"] == 3


def test_a_real_run_refuses_the_folder_of_a_dry_run(tmp_path):
    """Issue #99: a real run in an earlier --dry run's folder reported the tiny-model results as done."""
    dry, old = tmp_path / "dry", tmp_path / "old"
    gpu_kit.check_mode(dry, True)
    gpu_kit.check_mode(dry, True)  # the same mode resumes
    with pytest.raises(ValueError, match=r"holds a --dry run \(tiny random models on the CPU\); this is a real run"):
        gpu_kit.run_kit(dry, dry=False, steps=["carry"])
    old.mkdir()  # a folder from before the mode was recorded: its finished steps name it
    (old / "latency.json").write_text(json.dumps({"step": "latency", "dry": True}))
    with pytest.raises(ValueError, match=r"holds a --dry run"):
        gpu_kit.check_mode(old, False)
