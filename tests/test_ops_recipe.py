import dataclasses

import pytest

from titan_fp4six import FourOverSixRecipe


def test_defaults_follow_the_spec():
    r = FourOverSixRecipe()
    assert (r.err_mode, r.scale_bound, r.weight_block, r.activation_scaling, r.backward) == (
        "mse", 256, "16x16", "tensor", "auto")
    assert r.plan(grouped=False).backward == "quantized"
    assert r.plan(grouped=True).backward == "high_precision"
    assert FourOverSixRecipe(activation_scaling="row").plan(grouped=False).backward == "high_precision"


@pytest.mark.parametrize("mode", ["high_precision", "dequantized"])
def test_explicit_modes_resolve_to_themselves(mode):
    r = FourOverSixRecipe(backward=mode, activation_scaling="row")
    assert r.plan(grouped=False).backward == mode == r.plan(grouped=True).backward


def test_frozen_and_keyword_only():
    r = FourOverSixRecipe()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.err_mode = "mae"
    with pytest.raises(TypeError):
        FourOverSixRecipe("mae")


@pytest.mark.parametrize("field, value, valid", [
    ("err_mode", "l2", "'mae', 'mse'"), ("scale_bound", 512, "256, 448"), ("scale_bound", True, "256, 448"),
    ("weight_block", "32x32", "'1x16', '16x16'"), ("activation_scaling", "token", "'tensor', 'row'"),
    ("backward", "fp8", "'auto', 'quantized', 'high_precision', 'dequantized'"),
    # equal to a valid value but of another type: refused with the knob named (the kernels take int / str)
    ("scale_bound", 448.0, r"256, 448 \(type int; got float\)"), ("scale_bound", 256.0, "256, 448"),
    ("err_mode", b"mse", "'mae', 'mse'"),
])
def test_bad_knobs_name_the_field_and_valid_values(field, value, valid):
    with pytest.raises(ValueError, match=f"{field}={value!r}.*{valid}"):
        FourOverSixRecipe(**{field: value})


def test_quantized_backward_holds_for_row_scaling_and_grouped():
    """'auto' keeps its resolution (the RL base point); an explicit 'quantized' holds for row-scaled activations
    and grouped GEMMs, with the roles' specs: dy standard NVFP4 (one amax per token group when grouped), x^T the
    forward's x spec (row-scaled: per row of x^T), W^T the weights'."""
    assert FourOverSixRecipe(activation_scaling="row").plan(grouped=True).backward == "high_precision"
    for row in (False, True):
        r = FourOverSixRecipe(backward="quantized", activation_scaling="row" if row else "tensor")
        for grouped in (False, True):
            p = r.plan(grouped=grouped)
            assert p.backward == "quantized" and r.resolve(grouped) is r
            assert p.dy.candidates == "nvfp4" and p.dy.scaling == ("group" if grouped else "tensor")
            assert p.x_t == p.x and p.w_t == p.w
            assert p.x.scaling == ("row" if row else "group" if grouped else "tensor")


def test_a_key_names_its_plan_in_any_process():
    """The custom ops receive a key string; plan_of_key turns the recipe's key or the resolved plan's key into the
    recipe's plan from the string alone: a process that never built the recipe (a vLLM worker, a compile
    subprocess) gets the same plan; a malformed key or knob value is refused naming the knob."""
    import subprocess
    import sys

    from titan_fp4six.quant.recipe import KNOBS, plan_of_key

    recipe = FourOverSixRecipe(err_mode="mae", scope="weights", scale_bound=448, wgrad_rht=True)  # backward "auto"
    for grouped in (False, True):
        if grouped:  # wgrad_rht needs the quantized backward, which grouped GEMMs resolve away from
            recipe = FourOverSixRecipe(err_mode="mae", scope="weights", activation_scaling="row")
        plan = recipe.plan(grouped)
        assert plan_of_key(plan.key, grouped) == plan and plan_of_key(recipe.key, grouped) == plan
        assert plan.key != recipe.key  # auto resolved: quantized (dense), high_precision (grouped)
        code = ("import sys; from titan_fp4six.quant.recipe import plan_of_key; "
                f"print(repr(plan_of_key({plan.key!r}, {grouped})))")
        fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert fresh.stdout.strip() == repr(plan)
    with pytest.raises(ValueError, match=r"'nonsense' is not a FourOverSixRecipe key: it holds 1 comma-separated"):
        plan_of_key("nonsense", True)
    bad = ",".join("mse2" if f.name == "err_mode" else str(f.default) for f in KNOBS)
    with pytest.raises(ValueError, match=r"FourOverSixRecipe.err_mode"):
        plan_of_key(bad, False)
