"""The HLO-text helpers of benchmarks/decode_memory.py."""

import re

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from benchmarks.decode_memory import branch_launches, computation, copies, launches, while_bodies


def test_copies_parses_shape_operand_and_op():
    line = ('  %copy.7 = s32[1]{0} copy(%get-tuple-element.5095), '
            'metadata={op_name="jit(decode)/while/body/add" stack_frame_id=3}')
    assert copies(line + "\n  %add.1 = s32[] add(%a, %b)") == [
        dict(name="%copy.7", shape="s32[1]{0}", operand="%get-tuple-element.5095", op="jit(decode)/while/body/add")]


def test_while_bodies_and_computation_on_a_compiled_loop():
    def f(x):
        return lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1]

    hlo = jax.jit(f).lower(jnp.ones(4)).compile().as_text()
    bodies = while_bodies(hlo)
    assert bodies
    for name in bodies:
        text = computation(hlo, name)
        assert text.split()[0] == name and "multiply" in text
    with pytest.raises(ValueError, match="no computation"):
        computation(hlo, "%not_there")


def test_launches_lists_fusions_custom_calls_and_copies():
    text = "\n".join([
        '  %loop_pad_fusion.35 = bf16[1,8,16,128]{3,2,1,0} fusion(%p.1), kind=kLoop, calls=%fused_pad, '
        'metadata={op_name="jit(decode)/while/body/pad"}',
        '  %custom-call.7 = (f32[1,8,3,16,128]{4,3,2,1,0}) custom-call(%a, %b), '
        'custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(decode)/while/body/pallas_call"}',
        '  %copy.2 = s32[1]{0} copy(%x)',
        '  %add.1 = s32[] add(%a, %b)',
        '  ROOT %tuple.9 = (s32[]) tuple(%add.1)'])
    assert launches(text) == [
        dict(name="%loop_pad_fusion.35", opcode="fusion", kind="kLoop", op="jit(decode)/while/body/pad"),
        dict(name="%custom-call.7", opcode="custom-call", kind="__gpu$xla.gpu.triton",
             op="jit(decode)/while/body/pallas_call"),
        dict(name="%copy.2", opcode="copy", kind="", op=""),
    ]


def test_branch_launches_counts_each_branch_of_a_compiled_cond():
    def f(x, p):
        return lax.cond(p, lambda y: jnp.sin(y) * 2.0 + jnp.cos(y), lambda y: y, x)

    hlo = jax.jit(f).lower(jnp.ones(4), True).compile().as_text()
    entry = computation(hlo, re.search(r"^ENTRY (%[\w.\-]+)", hlo, re.M).group(1))
    found = branch_launches(hlo, entry)
    assert len(found) == 1
    (branches,) = found.values()
    assert sorted(branches.values()) == [0, 1]  # the identity branch launches nothing, the other one fusion
    text = '  %cond.3 = (f32[4]) conditional(%p, %a, %b), true_computation=%t.1, false_computation=%f.2'
    with pytest.raises(ValueError, match="no computation"):
        branch_launches(hlo, text)
