"""Adam's state and step bytes per parameter (emulator/workload/optimizer.py): Megatron-Core's default and
precision-aware optimizer, Apex's, and what they change in memory and the step."""
import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario_text
from emulator.scenario.spec import TrainingSpec
from emulator.workload.memory import memory_report
from emulator.workload.optimizer import adam_step_bytes, main_weight_bytes, optimizer_state_bytes


def test_the_default_states_and_step():
    tr = TrainingSpec()
    assert optimizer_state_bytes(tr) == 12.0  # fp32 main weight, momentum, variance
    assert adam_step_bytes(tr) == 34.0  # gradient 4 + moments read and written 16 + main 4 + 4 + bf16 2 + norm 4


@pytest.mark.parametrize("kw, main, state, step", [
    # bf16 training: TE keeps the main weight as a 16-bit remainder; moments in bf16: 2 + 2 + 2
    (dict(precision="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"), 2, 6.0, 4 + 8 + 8 + 4),
    # the same without store_param_remainders: an fp32 main weight, 4 + 2 + 2; the step updates it as fp32 (10)
    (dict(precision="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16", store_param_remainders=False), 4, 8.0,
     4 + 8 + 10 + 4),
    # MXFP8: Megatron-Core keeps its fp32 copy (not delayed scaling); fp8 moments: 4 + 1 + 1
    (dict(precision="mxfp8", exp_avg_dtype="fp8", exp_avg_sq_dtype="fp8"), 4, 6.0, 4 + 4 + 10 + 4),
    # delayed-scaling fp8 over bf16 weights: TE keeps it, a remainder; fp32 moments: 2 + 4 + 4
    (dict(precision="fp8", fp8_recipe="delayed"), 2, 10.0, 4 + 16 + 8 + 4),
    # fp16 main weights: 2 + 4 + 4; the update reads and writes them and writes the 16-bit weight (6)
    (dict(precision="mxfp8", main_params_dtype="fp16"), 2, 10.0, 4 + 16 + 6 + 4),
])
def test_the_precision_aware_optimizer(kw, main, state, step):
    tr = TrainingSpec(use_precision_aware_optimizer=True, **kw)
    assert (main_weight_bytes(tr), optimizer_state_bytes(tr), adam_step_bytes(tr)) == (main, state, step)


def test_apex_keeps_a_remainder_of_bf16_weights():
    assert optimizer_state_bytes(TrainingSpec(optimizer="apex")) == 10.0  # 2 + 4 + 4
    assert adam_step_bytes(TrainingSpec(optimizer="apex")) == 4 + 16 + 8 + 4


BASE = """name: o
cluster: {nodes: 1, node: dgx-h100}
model: {preset: gpt3-1.3b}
training: {global_batch: 8, micro_batch: 1%s}
parallel: {tp: 1, pp: 1, dp: 8, zero: 1}
"""


def test_bf16_moments_shrink_the_sharded_states():
    plain = memory_report(load_scenario_text(BASE % "", "o.yaml"))
    aware = memory_report(load_scenario_text(BASE % ", use_precision_aware_optimizer: true, exp_avg_dtype: bf16, "
                                             "exp_avg_sq_dtype: bf16", "o.yaml"))
    # bf16 training: 12 → 2 + 2 + 2 = 6 B a parameter, sharded over dp 8: the optimizer's share halves
    assert aware.breakdown["optimizer"] == pytest.approx(plain.breakdown["optimizer"] * 6 / 12)
    assert aware.breakdown["params"] == plain.breakdown["params"]


@pytest.mark.parametrize("extra, key", [
    (", exp_avg_dtype: bf16", "training.exp_avg_dtype"),
    (", use_precision_aware_optimizer: true, optimizer: apex", "training.use_precision_aware_optimizer"),
])
def test_megatron_cores_rules(extra, key):
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(BASE % extra, "o.yaml")
    assert err.value.key == key
