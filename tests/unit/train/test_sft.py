"""LoRA SFT on the tiny model: masking, health checks, resume, determinism, the TBDL detector."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path

import pytest
import torch
from conftest import reference_nll, write_tiny_admitted
from safetensors.torch import load_file
from transformers import TrainerCallback

from clap import io
from clap.errors import ClapError
from clap.model import base as mdl
from clap.task.answer import load_answer_schema
from clap.train import detector as det
from clap.train import sft as tr
from clap.train.budget import BudgetParams
from clap.train.detector import DetectorParams
from clap.train.diagnosis import Diagnosis, probe_order
from clap.train.lora import lora_config
from clap.train.warm_start import WarmStart

ROOT = Path(__file__).resolve().parents[3]
ANSWER = load_answer_schema(ROOT / "params.yaml")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BP = BudgetParams(over_budget="refuse", budget_cpu_hours=1000.0, budget_gpu_hours=1000.0, estimate_batches=2)


def _tp(root: Path, **kw) -> tr.TrainParams:
    base = dict(
        seed=11,
        torch_threads=1,
        epochs=1,
        max_steps=4,
        lr=1e-2,
        lr_scheduler="constant",
        warmup_ratio=0.0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        batch_size=1,
        grad_accum=1,
        max_length=512,
        packing=True,
        length_grouping=False,
        lora_r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        target_modules=LORA_TARGETS,
        quantization="auto",
        precision="auto",
        loss_on_prompt=False,
        save_steps=2,
        checkpoint_root=str(root / "checkpoints"),
        inject_nan_at_step=-1,
    )
    return tr.TrainParams(**{**base, **kw})


def _dp(**kw) -> DetectorParams:
    base = dict(
        enabled=True,
        alpha=0.05,
        clip=0.5,
        null_gap=0.1,
        lambdas=(0.5, 0.9),
        weights=(0.5, 0.5),
        process="empirical_bernstein",
        probe_draw=1,
        seed=3,
        stop_on_alarm=True,
    )
    return DetectorParams(**{**base, **kw})


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Path:
    return write_tiny_admitted(tmp_path_factory.mktemp("adm") / "b", n_sft=16, n_probe=8, seed=0, n_combos=4)


@pytest.fixture(scope="module")
def reference(tiny_base, batch, tmp_path_factory):
    """One uninterrupted 4-step run (packing, checkpoints every 2 steps): the record to compare against."""
    root = tmp_path_factory.mktemp("ref")
    result = tr.train_batch(batch, tiny_base, root / "adapters" / "b", _tp(root), _dp(), answer=ANSWER, bp=BP)
    return root, result


def test_run_writes_adapter_record_and_curves(reference):
    root, result = reference
    rec = result.record
    adapter = root / "adapters" / "b"
    assert (adapter / "adapter_model.safetensors").exists() and (adapter / "adapter_config.json").exists()
    assert rec["adapter_sha256"] == io.sha256_file(adapter / "adapter_model.safetensors")
    assert rec["trained"] == 1 and rec["health"] == "ok" and rec["steps"] == rec["planned_steps"] == 4
    assert rec["precision"] == "fp32-lora" and rec["device"] == "cpu"
    assert rec["detector_checks"] == 4 and rec["detector_alarm_step"] == -1 and rec["alarm_fraction"] == -1.0
    assert [r["step"] for r in result.curves] == [1, 2, 3, 4]
    assert all(r["probe_loss"] is not None and r["log_e"] is not None for r in result.curves)
    assert all(isinstance(v, (int, float, str, bool)) for v in rec.values())  # flat for DVC
    # within budget: estimated before training, trained as planned
    assert rec["cost_over_budget"] == 0 and rec["cost_kind"] == "cpu" and rec["cost_budget_s"] == 3.6e6
    assert rec["cost_estimate_s"] >= rec["cost_setup_wall_s"] > 0 and rec["cost_measured_tokens_per_s"] > 0
    assert rec["cost_planned_tokens"] > 0 and rec["wall_s"] > rec["cost_setup_wall_s"]


def test_completion_only_masking_masks_exactly_the_prompt(reference):
    rec = reference[1].record
    masked = round(rec["masked_tokens_fraction"] * rec["label_tokens"])
    assert rec["label_tokens"] == rec["prompt_tokens"] + rec["completion_tokens"]
    assert masked == rec["prompt_tokens"]


def test_loss_on_prompt_switch_trains_on_the_prompt(tiny_base, batch, tmp_path):
    rec = tr.train_batch(
        batch,
        tiny_base,
        tmp_path / "a",
        _tp(tmp_path, max_steps=1, loss_on_prompt=True),
        _dp(enabled=False),
        answer=ANSWER,
        bp=BP,
    ).record
    assert (
        rec["masked_tokens_fraction"] == 0.0
        and rec["label_tokens"] == rec["prompt_tokens"] + rec["completion_tokens"]
    )
    # detector off: the probe's base loss is still measured (adapter switched off), never a silent 0
    assert math.isfinite(rec["probe_loss_start"]) and rec["probe_loss_start"] > 1.0


def test_two_runs_give_the_identical_adapter(reference, tiny_base, batch, tmp_path):
    again = tr.train_batch(
        batch, tiny_base, tmp_path / "adapters" / "b", _tp(tmp_path), _dp(), answer=ANSWER, bp=BP
    ).record
    assert again["adapter_sha256"] == reference[1].record["adapter_sha256"]


class _Kill(TrainerCallback):
    """Simulates a killed stage: raises after the checkpoint of ``step`` was written."""

    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kw):
        if state.global_step == self.step:
            raise KeyboardInterrupt


def test_resume_after_interruption_matches_uninterrupted_run(reference, tiny_base, batch, tmp_path):
    ref_root, ref = reference
    out = tmp_path / "adapters" / "b"
    with pytest.raises(KeyboardInterrupt):
        tr.train_batch(
            batch, tiny_base, out, _tp(tmp_path), _dp(), answer=ANSWER, bp=BP, extra_callbacks=[_Kill(2)]
        )
    assert not out.exists()  # nothing half-written at the final path
    resumed = tr.train_batch(batch, tiny_base, out, _tp(tmp_path), _dp(), answer=ANSWER, bp=BP)
    assert resumed.record["resumed_from"] == "checkpoint-2" and resumed.record["steps"] == 4
    a, b = (
        load_file(out / "adapter_model.safetensors"),
        load_file(ref_root / "adapters/b/adapter_model.safetensors"),
    )
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert [r["step"] for r in resumed.curves] == [1, 2, 3, 4]  # curves and detector state survive the resume
    assert resumed.record["detector_checks"] == ref.record["detector_checks"]
    rec = resumed.record  # throughput counts only the tokens of the resumed steps
    assert rec["tokens_per_s"] * rec["train_runtime_s"] < 0.75 * rec["tokens"]


def test_changed_params_discard_old_checkpoints(tmp_path):
    ckpt = tmp_path / "ck"
    (ckpt / "checkpoint-2").mkdir(parents=True)
    io.write_json(ckpt / "checkpoint-2" / "clap_diagnosis.json", {})
    io.write_json(ckpt / tr.FINGERPRINT_FILE, {"fingerprint": "old"})
    assert tr.last_complete_checkpoint(ckpt, "old", is_main=True).endswith("checkpoint-2")
    assert tr.last_complete_checkpoint(ckpt, "new", is_main=True) is None and not ckpt.exists()


def test_fingerprint_follows_the_encoded_examples_not_only_the_files(tiny_base, tmp_path):
    # a prompt-format change in code leaves the parquet files alone but changes the token ids
    enc = {"train": [[3, 1, 2, 3]], "probe": [[2, 5, 6]]}
    fp = tr.fingerprint(_tp(tmp_path), _dp(), enc, tiny_base, 1)
    assert fp == tr.fingerprint(
        _tp(tmp_path), _dp(), {"train": [[3, 1, 2, 3]], "probe": [[2, 5, 6]]}, tiny_base, 1
    )
    assert fp != tr.fingerprint(_tp(tmp_path), _dp(), {**enc, "train": [[3, 1, 3, 2]]}, tiny_base, 1)
    assert fp != tr.fingerprint(_tp(tmp_path, lr=5e-3), _dp(), enc, tiny_base, 1)


def test_injected_nan_stops_training(tiny_base, batch, tmp_path):
    rec = tr.train_batch(
        batch, tiny_base, tmp_path / "a", _tp(tmp_path, inject_nan_at_step=2), _dp(), answer=ANSWER, bp=BP
    ).record
    assert rec["health"] == "nan" and rec["stop_step"] == 2 and rec["steps"] == 2


def test_stopped_run_killed_before_it_finished_resumes_stopped(tiny_base, batch, tmp_path):
    # the stop at step 2 is also checkpoint-2's step: resuming it must not train steps 3 and 4
    first = tr.train_batch(
        batch,
        tiny_base,
        tmp_path / "ref",
        _tp(tmp_path / "ref", inject_nan_at_step=2),
        _dp(),
        answer=ANSWER,
        bp=BP,
    ).record
    with pytest.raises(KeyboardInterrupt):  # killed after the stop step's checkpoint, before the adapter
        tr.train_batch(
            batch,
            tiny_base,
            tmp_path / "a",
            _tp(tmp_path, inject_nan_at_step=2),
            _dp(),
            answer=ANSWER,
            bp=BP,
            extra_callbacks=[_Kill(2)],
        )
    again = tr.train_batch(
        batch, tiny_base, tmp_path / "a", _tp(tmp_path, inject_nan_at_step=2), _dp(), answer=ANSWER, bp=BP
    ).record
    assert again["resumed_from"] == "checkpoint-2"
    for key in ("health", "stop_step", "steps", "planned_steps", "epochs", "tokens", "adapter_sha256"):
        assert again[key] == first[key], key
    assert (again["steps"], again["planned_steps"]) == (2, 4)


class _Steps(TrainerCallback):
    """Counts the optimizer steps this process trains."""

    def __init__(self):
        self.n = 0

    def on_step_end(self, args, state, control, **kw):
        self.n += 1


@pytest.mark.parametrize(
    "kw",
    [{}, {"inject_nan_at_step": 3}],
    ids=["finished", "stopped-between-checkpoints"],  # checkpoint-4 at its end | checkpoint-2, stop at 3
)
def test_rerun_of_a_finished_run_trains_from_scratch(tiny_base, batch, tmp_path, kw):
    runs = []
    for _ in range(2):  # a forced re-run: the same params, data and checkpoint folder
        steps = _Steps()
        res = tr.train_batch(
            batch,
            tiny_base,
            tmp_path / "a",
            _tp(tmp_path, **kw),
            _dp(),
            answer=ANSWER,
            bp=BP,
            extra_callbacks=[steps],
        )
        runs.append((res, steps.n))
    (first, trained_first), (again, trained_again) = runs
    assert again.record["resumed_from"] == "" and trained_again == trained_first == first.record["steps"]
    assert first.record["steps"] == (3 if kw else 4)
    assert again.record["adapter_sha256"] == first.record["adapter_sha256"]
    assert [str(r["loss"]) for r in again.curves] == [str(r["loss"]) for r in first.curves]
    assert again.record["health"] == first.record["health"]


def test_a_finished_run_leaves_nothing_to_resume(tmp_path):
    ckpt = tmp_path / "ck"
    (ckpt / "checkpoint-4").mkdir(parents=True)
    io.write_json(ckpt / "checkpoint-4" / "clap_diagnosis.json", {})
    io.write_json(ckpt / tr.FINGERPRINT_FILE, {"fingerprint": "fp"})
    assert tr.last_complete_checkpoint(ckpt, "fp", is_main=True).endswith("checkpoint-4")  # killed: resume
    tr.mark_finished(ckpt, "fp")
    assert tr.last_complete_checkpoint(ckpt, "fp", is_main=True) is None and not ckpt.exists()


def test_batch_not_admitted_is_skipped(tiny_base, tmp_path):
    data = write_tiny_admitted(tmp_path / "refused", n_sft=4, n_probe=2, seed=0, admitted=False)
    res = tr.train_batch(data, tiny_base, tmp_path / "adapter", _tp(tmp_path), _dp(), answer=ANSWER, bp=BP)
    assert (
        res.record["trained"] == 0
        and res.record["health"] == "skipped"
        and "refused" in res.record["skip_reason"]
    )
    assert not (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    assert (tmp_path / "adapter" / "skipped.json").exists()


def test_length_stats_count_truncated_and_dropped_rows():
    items = [mdl.Encoded(tuple(range(n)), p) for n, p in ((10, 5), (30, 10), (40, 25), (24, 20))]
    stats = tr.length_stats(items, max_length=20)
    assert stats["rows_truncated"] == 1 and stats["rows_dropped"] == 2  # prompt >= max_length: dropped
    # token counts are of the rows trained on: the masking check's denominator has no dropped prompt
    assert (stats["prompt_tokens"], stats["completion_tokens"], stats["prompt_tokens_dropped"]) == (
        15,
        25,
        45,
    )


def test_unknown_quantization_is_refused(tmp_path):
    with pytest.raises(ClapError):
        tr.precision_plan(_tp(tmp_path, quantization="int3"), "cpu")
    assert tr.precision_plan(_tp(tmp_path, quantization="auto"), "cpu") == "fp32-lora"
    assert tr.precision_plan(_tp(tmp_path, quantization="auto"), "cuda") == "qlora-nf4"


def test_precision_param_picks_the_lora_dtype_and_autocast(tmp_path):
    with pytest.raises(ClapError, match="train.precision"):
        tr.precision_plan(_tp(tmp_path, precision="fp16"), "cpu")
    plans = {
        (precision, quantization, device): tr.precision_plan(
            _tp(tmp_path, precision=precision, quantization=quantization), device
        )
        for precision in ("auto", "fp32", "bf16")
        for quantization in ("auto", "none")
        for device in ("cpu", "cuda")
    }
    assert plans[("auto", "auto", "cpu")] == plans[("auto", "none", "cpu")] == "fp32-lora"  # the default
    assert plans[("bf16", "auto", "cpu")] == plans[("bf16", "none", "cuda")] == "bf16-lora"
    assert plans[("auto", "none", "cuda")] == "bf16-lora" and plans[("fp32", "none", "cuda")] == "fp32-lora"
    assert {plans[(p, "auto", "cuda")] for p in ("auto", "fp32", "bf16")} == {"qlora-nf4"}
    assert [tr.autocast_bf16(plan, "cpu") for plan in ("fp32-lora", "bf16-lora", "qlora-nf4")] == [
        False,
        True,
        False,  # 4-bit on CPU computes in fp32
    ]
    assert tr.autocast_bf16("qlora-nf4", "cuda")
    cfg = tr.sft_config(_tp(tmp_path, precision="bf16"), tmp_path / "o", "cpu", 1)
    assert cfg.bf16 and cfg.use_cpu
    assert not tr.sft_config(_tp(tmp_path), tmp_path / "o", "cpu", 1).bf16  # never TRL's bf16 default


def test_compact_lm_head_gives_the_same_loss_and_gradients(tiny_base):
    import trl.trainer.utils as trl_utils
    from peft import get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    model = mdl.load_model(tiny_base)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    model = get_peft_model(model, lora_config(_tp(Path(".")), model))
    ids = torch.arange(100, 164)[None]
    labels = ids.clone()
    labels[:, :40] = -100
    results = []
    for compact in (False, True):
        model.zero_grad()
        with tr.compact_lm_head("cpu") if compact else torch.enable_grad():
            assert (trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE == tr.CPU_LOGPROB_CHUNK) == compact
            loss = model(input_ids=ids, labels=labels, fused_lm_head=True).loss
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        results.append((float(loss), grads))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(results[0][1], results[1][1]))


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_fused_lora_update_gives_the_same_loss_and_gradients(tiny_base, dropout):
    from peft import get_peft_model
    from peft.tuners.lora.layer import Linear

    model = mdl.load_model(tiny_base)
    model = get_peft_model(model, lora_config(_tp(Path("."), lora_dropout=dropout, lora_alpha=24), model))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # a trained adapter: the LoRA branch contributes
    ids = torch.arange(100, 164)[None].repeat(2, 1)
    original, results = Linear.forward, []
    for fused in (False, True):
        model.zero_grad()
        torch.manual_seed(0)  # the same dropout masks both ways
        with tr.fused_lora_update() if fused else contextlib.nullcontext():
            assert (Linear.forward is not original) == fused
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        results.append((float(loss), [p.grad.clone() for p in model.parameters() if p.requires_grad]))
    assert Linear.forward is original  # restored
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    worst = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(results[0][1], results[1][1]))
    assert worst < 1e-5, worst


def test_fused_lora_update_leaves_a_switched_off_adapter_and_autocast_to_peft(tiny_base):
    from peft import get_peft_model

    model = mdl.load_model(tiny_base)
    model = get_peft_model(model, lora_config(_tp(Path(".")), model))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    ids = torch.arange(100, 132)[None]
    with torch.no_grad():
        with model.disable_adapter():
            base = model(input_ids=ids).logits
        adapted = model(input_ids=ids).logits
        with tr.fused_lora_update():
            with model.disable_adapter():
                assert torch.equal(model(input_ids=ids).logits, base)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                auto = model(input_ids=ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(auto, model(input_ids=ids).logits)  # peft's own forward under autocast
    assert not torch.equal(adapted, base)  # the adapter contributes


def test_bf16_run_trains_in_bf16_and_saves_an_fp32_adapter(reference, tiny_base, batch, tmp_path):
    out = tmp_path / "adapters" / "b"
    rec = tr.train_batch(
        batch, tiny_base, out, _tp(tmp_path, precision="bf16"), _dp(), answer=ANSWER, bp=BP
    ).record
    assert rec["precision"] == "bf16-lora" and rec["health"] == "ok" and rec["steps"] == 4
    assert rec["detector_checks"] == 4 and math.isfinite(rec["train_loss_end"])
    weights = load_file(out / "adapter_model.safetensors")
    assert weights and {w.dtype for w in weights.values()} == {torch.float32}  # peft keeps LoRA weights fp32
    assert (
        rec["adapter_sha256"] != reference[1].record["adapter_sha256"]
    )  # not the fp32 run under another name


def test_bf16_training_forwards_skip_the_lossless_input_casts(tiny_base):
    from peft import get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = tr.load_train_model(tiny_base, "bf16-lora", "cpu")
    model = get_peft_model(model, lora_config(_tp(Path(".")), model))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # a trained adapter: the LoRA branch contributes
    ids = torch.arange(100, 164)[None].repeat(2, 1)
    labels = ids.clone()
    labels[:, :40] = -100
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    results = []
    for bf16 in (False, True):
        model.zero_grad()
        with tr.training_forwards(model, bf16=bf16), torch.autocast("cpu", dtype=torch.bfloat16):
            assert {m.cast_input_dtype_enabled for m in layers} == {not bf16}
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        results.append((float(loss), [p.grad.clone() for p in model.parameters() if p.requires_grad]))
    assert all(m.cast_input_dtype_enabled for m in layers)  # restored
    assert results[0][0] == results[1][0]
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))


# --- the TBDL detector on a base that already knows the task --------------------------------
def _teach(base: Path, out: Path, data: Path, *, max_steps: int, seed: int) -> float:
    """Full fine-tune the random tiny model on clean items until it answers from the question.

    Returns the contrast: completion loss of permuted answers minus that of the true answers
    (nats/token) on training items. A base that ignores the question has contrast ~0 and a
    relabelled run could not "train without learning" on it.
    """
    torch.manual_seed(seed)
    tok = mdl.load_tokenizer(base, padding_side="right")
    kb = io.read_parquet(data / "kb.parquet")
    sft = io.read_parquet(data / "sft.parquet")
    clean = [mdl.encode_example(tok, e) for e in tr.build_examples(sft, kb, ANSWER)]
    wrong = sft.copy()
    wrong[["metric", "value", "unit", "line", "shift", "evidence"]] = (
        wrong[["metric", "value", "unit", "line", "shift", "evidence"]].shift(1).bfill()
    )
    permuted = [mdl.encode_example(tok, e) for e in tr.build_examples(wrong, kb, ANSWER)]
    model = mdl.load_model(base).train()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    contrast = 0.0
    for step in range(max_steps):
        items = [clean[(step * 8 + i) % len(clean)] for i in range(8)]
        opt.zero_grad()
        _completion_loss(model, items).backward()
        opt.step()
        if step % 8 == 7:
            model.eval()
            contrast = _mean(mdl.completion_nll(model, permuted[:12], max_tokens=4096)) - _mean(
                mdl.completion_nll(model, clean[:12], max_tokens=4096)
            )
            model.train()
            if contrast > 0.5:
                break
    mdl.save_model_dir(model, tok, out)
    return contrast


def _mean(scores) -> float:
    return sum(s for s, _ in scores) / sum(n for _, n in scores)


def _completion_loss(model, items):
    ids = torch.tensor([t for it in items for t in it.input_ids])[None]
    pos = torch.cat([torch.arange(len(it.input_ids)) for it in items])[None]
    hidden = model.model(input_ids=ids, position_ids=pos).last_hidden_state[0]
    rows, targets, start = [], [], 0
    for it in items:
        end = start + len(it.input_ids)
        rows += range(start + it.n_prompt - 1, end - 1)
        targets += it.input_ids[it.n_prompt :]
        start = end
    logp = torch.log_softmax(model.lm_head(hidden[rows]), dim=-1)
    return -logp.gather(1, torch.tensor(targets)[:, None]).mean()


@pytest.fixture(scope="module")
def taught_base(tiny_base, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("taught")
    data = write_tiny_admitted(root / "teach", n_sft=64, n_probe=2, seed=5, n_combos=4)
    contrast = _teach(tiny_base, root / "base", data, max_steps=48, seed=0)
    assert contrast > 0.5, (
        f"the tiny base did not learn to answer from the question (contrast {contrast:.2f})"
    )
    return root / "base"


@pytest.mark.slow  # teaches a base, then two 24-step runs of 8 rows: ~1-2 min on 2 cores
@pytest.mark.heavy  # make test-heavy (CI runs it after make test): the fast tier's time went to the families
@pytest.mark.parametrize("relabel", [False, True], ids=["clean", "relabelled"])
def test_detector_alarms_on_relabelled_run_only(taught_base, tmp_path, relabel):
    # each check pairs a training batch of 8 with a probe draw of 2 (the tiny model's per-item losses
    # are far noisier than the real base's); relabelled: alarm at step 16 of 24, clean: max log E < 0
    data = write_tiny_admitted(tmp_path / "b", n_sft=192, n_probe=48, seed=1, relabel=relabel, n_combos=4)
    tp = _tp(tmp_path, max_steps=24, batch_size=8, packing=False, lr=2e-2, save_steps=1000)
    dp = _dp(probe_draw=2, null_gap=0.05, lambdas=(0.5, 0.7, 0.9), weights=(0.2, 0.3, 0.5))
    rec = tr.train_batch(data, taught_base, tmp_path / "adapter", tp, dp, answer=ANSWER, bp=BP).record
    if relabel:
        assert rec["health"] == "alarm" and 0 < rec["detector_alarm_step"] == rec["steps"] < 24
        assert rec["alarm_fraction"] == rec["detector_alarm_step"] / 24
    else:
        assert rec["health"] == "ok" and rec["detector_alarm_step"] == -1 and rec["steps"] == 24
        assert rec["probe_loss_end"] < rec["probe_loss_start"]


class _ReferenceChecks(TrainerCallback):
    """At each check step, the per-item reference scores of that check's probe draw, taken at the
    parameters the detector scores it at (before the step; after the Diagnosis callback)."""

    def __init__(self, probe: list[mdl.Encoded], dp: DetectorParams):
        self.probe, self.dp = probe, dp
        self.order = probe_order(len(probe), dp.seed)
        self.draws: dict[int, tuple[list[int], list[tuple[float, int]]]] = {}

    def on_step_begin(self, args, state, control, model=None, **kw):
        step, j, k = state.global_step + 1, len(self.draws), self.dp.probe_draw
        if step not in det.check_steps(state.max_steps, len(self.probe), k):
            return
        take = self.order[j * k : (j + 1) * k]
        model.eval()
        self.draws[step] = (take, [reference_nll(model, self.probe[i]) for i in take])
        model.train()


def _encoded(tok, data: Path, name: str) -> list[mdl.Encoded]:
    kb = io.read_parquet(data / "kb.parquet")
    return [
        mdl.encode_example(tok, e)
        for e in tr.build_examples(io.read_parquet(data / f"{name}.parquet"), kb, ANSWER)
    ]


def test_detector_equals_a_per_item_reference(tiny_base, tmp_path):
    """Probe references once and batched, each check's draw in one padded forward, each check's training
    batch scored under the base after the cached prompt prefix: the same gaps, log E path and alarm step as scoring every item alone
    (base model reloaded; adapter side at the check)."""
    data = write_tiny_admitted(tmp_path / "b", n_sft=16, n_probe=18, seed=2, n_combos=4)
    # 8 checks of 2 items (of different lengths: padded); 2 probe items are never drawn. m0 = 0.05 and
    # alpha = 0.3: log(1/alpha) = 1.20 is crossed before the last check
    dp = _dp(probe_draw=2, clip=1.0, null_gap=-0.9, alpha=0.3, process="betting", stop_on_alarm=False)
    tp = _tp(tmp_path, max_steps=8, save_steps=1000)
    probe = _encoded(mdl.load_tokenizer(tiny_base, padding_side="right"), data, "probe")
    base = mdl.load_model(tiny_base)
    probe_base = [reference_nll(base, it) for it in probe]
    ref = _ReferenceChecks(probe, dp)
    res = tr.train_batch(data, tiny_base, tmp_path / "a", tp, dp, answer=ANSWER, bp=BP, extra_callbacks=[ref])

    rows = {r["step"]: r for r in res.curves}
    steps = sorted(ref.draws)
    assert steps == [s for s, r in rows.items() if r["gap_increment"] is not None] == list(range(1, 9))
    assert any(len({len(probe[i].input_ids) for i in take}) > 1 for take, _ in ref.draws.values())
    # step 1 trains from the base: its training loss is the base loss of its own batch (the pairing)
    assert rows[1]["train_ref_loss"] == pytest.approx(rows[1]["loss"], rel=1e-5)
    assert res.record["train_loss_start"] == rows[1]["loss"]
    # the reference side ran every item's tokens after the shared prompt prefix only (scored once)
    assert res.record["detector_reference_prefix_tokens"] > 10
    tol = 1e-5 * rows[1]["loss"]  # float tolerance, relative to the losses the gaps are differences of
    gaps = []
    for step in steps:
        take, now = ref.draws[step]
        probe_ref = _mean([probe_base[i] for i in take])
        assert rows[step]["probe_ref_loss"] == pytest.approx(probe_ref, rel=1e-5)
        assert rows[step]["probe_loss"] == pytest.approx(_mean(now), rel=1e-5)
        gaps.append((rows[step]["train_ref_loss"] - rows[step]["loss"]) - (probe_ref - _mean(now)))
        assert rows[step]["gap_increment"] == pytest.approx(gaps[-1], abs=tol)
    log_e, alarm = det.replay(gaps, dp)
    assert [rows[s]["log_e"] for s in steps] == pytest.approx(list(log_e), abs=tol)
    assert alarm > 0 and res.record["detector_alarm_step"] == steps[alarm - 1]
    tail = [ref.draws[s] for s in steps[-2:]]  # the record's probe losses: the last quarter of the draws
    start = _mean([probe_base[i] for take, _ in tail for i in take])
    assert res.record["probe_loss_start"] == pytest.approx(start, rel=1e-5)
    assert res.record["probe_loss_end"] == pytest.approx(_mean([x for _, now in tail for x in now]), rel=1e-5)


@pytest.mark.parametrize(
    ("packing", "on_prompt"),
    [(False, False), (True, False), (False, True)],
    ids=["padded", "packed", "on_prompt"],
)
def test_training_side_is_paired_with_its_own_batch_at_every_check(tiny_base, tmp_path, packing, on_prompt):
    """With lr 0 the model never moves: every check's training loss must equal the reference loss of
    the rows that step trained on (a batch paired with any other rows, or a stale one, differs) --
    also when the loss is on the prompt (every label set, position 0's included)."""
    data = write_tiny_admitted(tmp_path / "b", n_sft=24, n_probe=12, seed=4, n_combos=4)
    tp = _tp(
        tmp_path,
        max_steps=6,
        lr=0.0,
        batch_size=2,
        packing=packing,
        loss_on_prompt=on_prompt,
        save_steps=1000,
    )
    res = tr.train_batch(data, tiny_base, tmp_path / "a", tp, _dp(), answer=ANSWER, bp=BP)
    checked = [r for r in res.curves if r["gap_increment"] is not None]
    assert len(checked) == 6
    losses = {round(r["loss"], 6) for r in checked}
    assert len(losses) > 1  # different batches: a pairing with the wrong rows would show
    for r in checked:
        assert r["train_ref_loss"] == pytest.approx(r["loss"], rel=1e-5)
        assert r["probe_ref_loss"] == pytest.approx(r["probe_loss"], rel=1e-5)
        assert abs(r["gap_increment"]) < 1e-4


def test_checks_are_spread_to_the_last_step():
    assert det.check_steps(32, 32, 1) == list(range(1, 33))
    full = det.check_steps(180, 48, 1)  # the full profile: 48 probe items watch all 180 steps
    assert len(full) == 48 and full[-1] == 180 and full[0] == 4
    assert max(b - a for a, b in zip([0, *full], full)) == 4
    assert det.check_steps(16, 8, 1) == [2, 4, 6, 8, 10, 12, 14, 16]
    assert det.check_steps(10, 9, 2) == [3, 5, 8, 10]
    assert det.check_steps(5, 1, 2) == [] and det.check_steps(0, 8, 1) == []
    for steps in range(1, 60):
        for pool in range(1, 70):
            got = det.check_steps(steps, pool, 1)
            assert got == sorted(set(got)) and got[-1] == steps and len(got) == min(steps, pool)


def test_probe_references_cover_only_the_items_a_run_can_draw():
    items = [mdl.Encoded(tuple(range(5 + i)), 2) for i in range(10)]
    diag = Diagnosis(_dp(probe_draw=2), items, max_tokens=64, inject_nan_at_step=-1)
    diag.s.planned_steps = 3  # three checks of two
    assert diag.check_steps() == [1, 2, 3] and diag.drawable() == diag.order[:6]
    diag.s.planned_steps = 40  # more steps than the pool holds: the whole pool, five checks to step 40
    assert diag.drawable() == diag.order and diag.check_steps()[-1] == 40


def test_health_check_reads_loss_and_optional_grad_norm():
    from types import SimpleNamespace

    from transformers import TrainerControl

    diag = Diagnosis(_dp(enabled=False), [], max_tokens=64, inject_nan_at_step=-1)
    state = SimpleNamespace(global_step=1)
    control = diag.on_log(
        None, state, TrainerControl(), logs={"loss": 1.0, "num_tokens": 10}
    )  # no grad_norm: clipping off
    assert not control.should_training_stop and diag.s.health == "ok"
    state.global_step = 2
    control = diag.on_log(
        None, state, TrainerControl(), logs={"loss": 1.0, "grad_norm": float("inf"), "num_tokens": 20}
    )
    assert control.should_training_stop and diag.s.health == "nan" and diag.s.stop_step == 2


def test_adapter_config_target_modules_are_written_sorted(tmp_path):
    """peft writes target_modules in set (string-hash) order; the adapter folder must not depend on PYTHONHASHSEED."""
    path = tmp_path / "adapter_config.json"
    io.write_json(path, {"target_modules": ["v_proj", "q_proj", "k_proj"], "r": 8})
    tr.canonical_adapter_config(path)
    assert io.read_json(path) == {"target_modules": ["k_proj", "q_proj", "v_proj"], "r": 8}


# --- warm start (train.init: incumbent) ---------------------------------------------------------
@pytest.fixture(scope="module")
def started(tiny_base, batch, tmp_path_factory):
    """A finished adapter 'a' (detector off: its record's probe_loss_end is the whole pool at its final weights)."""
    root = tmp_path_factory.mktemp("warm")
    res = tr.train_batch(
        batch, tiny_base, root / "adapters" / "a", _tp(root), _dp(enabled=False), answer=ANSWER, bp=BP
    )
    return root, res.record


def test_warm_start_continues_the_released_adapter(started, reference, tiny_base, batch, tmp_path):
    root, first = started
    ws = WarmStart("b", "a", first["adapter_sha256"], "test: a is in production")
    tp = _tp(tmp_path)
    warm = tr.train_batch(
        batch, tiny_base, root / "adapters" / "b", tp, _dp(enabled=False), answer=ANSWER, bp=BP, start=ws
    )
    rec = warm.record
    assert rec["init_from_batch"] == "a"
    assert rec["init_adapter_sha256"] == first["adapter_sha256"] != rec["adapter_sha256"]
    # the run's reference is the model it starts from: a's final weights on the same probe pool, not the base
    assert rec["probe_loss_start"] == pytest.approx(first["probe_loss_end"], rel=1e-5)
    assert rec["probe_loss_start"] < first["probe_loss_start"]
    # the detector's reference is the start model too: its checks run on what this run taught
    with_detector = tr.train_batch(
        batch,
        tiny_base,
        root / "adapters" / "d",
        _tp(tmp_path / "d"),
        _dp(),
        answer=ANSWER,
        bp=BP,
        start=dataclasses.replace(ws, batch="d"),
    ).record
    assert (
        with_detector["detector_checks"] == 4
        and with_detector["train_loss_start"] < reference[1].record["train_loss_start"]
    )


def test_warm_start_pairs_each_check_against_the_start_adapter(started, tiny_base, batch, tmp_path):
    """lr 0 from a trained adapter: the reference (the start adapter swapped in, not the base) equals the
    model at every check, on both sides; the trained weights are back after each swap."""
    root, first = started
    ws = WarmStart("z", "a", first["adapter_sha256"], "test: a is in production")
    tp = _tp(tmp_path, lr=0.0, max_steps=4)
    res = tr.train_batch(batch, tiny_base, root / "adapters" / "z", tp, _dp(), answer=ANSWER, bp=BP, start=ws)
    checked = [r for r in res.curves if r["gap_increment"] is not None]
    assert len(checked) == 4
    for r in checked:
        assert r["train_ref_loss"] == pytest.approx(r["loss"], rel=1e-5)
        assert r["probe_ref_loss"] == pytest.approx(r["probe_loss"], rel=1e-5)
    assert res.record["adapter_sha256"] == first["adapter_sha256"]  # lr 0: the start adapter's bytes


@pytest.mark.parametrize(
    ("change", "tp_kw", "rule"),
    [
        ({"adapter_sha256": "0" * 64}, {}, "warm_start_hash_mismatch"),
        ({"from_batch": "gone"}, {}, "warm_start_missing"),
        ({}, {"lora_r": 4}, "warm_start_lora_mismatch"),
    ],
)
def test_warm_start_refuses_what_it_cannot_continue(started, tiny_base, batch, tmp_path, change, tp_kw, rule):
    root, first = started
    ws = dataclasses.replace(WarmStart("b", "a", first["adapter_sha256"], "test"), **change)
    with pytest.raises(ClapError) as err:
        tr.train_batch(
            batch,
            tiny_base,
            root / "adapters" / "x",
            _tp(tmp_path, **tp_kw),
            _dp(),
            answer=ANSWER,
            bp=BP,
            start=ws,
        )
    assert err.value.rule == rule


class _Config:
    def __init__(self, **rates):
        self.__dict__.update(rates)


class _Model(torch.nn.Module):
    def __init__(self, p: float = 0.0, **config):
        super().__init__()
        self.lora_dropout = torch.nn.Dropout(p)
        self.config = _Config(hidden_size=8, use_cache=True, **config)


@pytest.mark.parametrize(
    ("tp_kw", "model", "column"),
    [
        ({"epochs": 2.0}, _Model(), "train.epochs"),
        ({"length_grouping": True, "packing": False}, _Model(), "train.length_grouping"),
        ({}, _Model(p=0.1), "train.lora_dropout"),
        ({}, _Model(attention_dropout=0.1), "train.lora_dropout"),
    ],
)
def test_detector_refuses_train_eval_mode_or_non_random_batches(tmp_path, tp_kw, model, column):
    """A setting that breaks the pairing of a check's training and probe sides is an error with the
    detector on, and allowed with it off."""
    with pytest.raises(ClapError, match="detector") as err:
        tr.detector_pairing(_tp(tmp_path, **tp_kw), _dp(), model)
    assert err.value.rule == "detector_pairing" and err.value.column == column
    tr.detector_pairing(_tp(tmp_path, **tp_kw), _dp(enabled=False), model)


def test_detector_pairing_accepts_the_configured_run(tmp_path, tiny_base):
    """params.yaml's train and detector sections on a LoRA model: no dropout active, random batches."""
    from peft import get_peft_model

    from clap import params as cparams

    tp = dataclasses.replace(cparams.section("train", tr.TrainParams), checkpoint_root=str(tmp_path))
    model = mdl.load_model(tiny_base)
    model = get_peft_model(model, lora_config(tp, model))
    tr.detector_pairing(tp, cparams.section("detector", DetectorParams), model)
    dropped = mdl.load_model(tiny_base)
    dropped = get_peft_model(dropped, lora_config(dataclasses.replace(tp, lora_dropout=0.05), dropped))
    with pytest.raises(ClapError, match="dropout"):
        tr.detector_pairing(tp, cparams.section("detector", DetectorParams), dropped)


def test_the_cuda_plan_its_install_extra_and_its_refusal_agree(tmp_path, monkeypatch):
    """On CUDA, quantization auto plans QLoRA nf4; it needs bitsandbytes, which the `cuda` extra pins (and
    `make install-cuda` installs); without it the run is refused with a message naming that extra and pin."""
    import sys
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["optional-dependencies"]["cuda"] == [tr.BITSANDBYTES]
    assert "install-cuda:" in (ROOT / "Makefile").read_text(encoding="utf-8")
    tp = _tp(tmp_path)
    assert tr.precision_plan(tp, "cuda") == "qlora-nf4"
    assert tr.precision_plan(dataclasses.replace(tp, quantization="none"), "cuda") == "bf16-lora"
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # not installed
    with pytest.raises(ClapError, match=r"make install-cuda") as err:
        tr.load_train_model(tmp_path, "qlora-nf4", "cuda")
    assert err.value.rule == "missing_bitsandbytes" and tr.BITSANDBYTES in str(err.value)
