"""benchmarks/mosaic_sass.py's parsers of ptxas and nvdisasm output and its choice of kernels (the offline
compile itself needs the downloaded CUDA tools, `scripts/offline_cuda/setup.sh`, and is not run here)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from benchmarks.mosaic_sass import _lower, ptxas_summary, sass_summary  # noqa: E402

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_3:
        /*0010*/                   LOP3.LUT R2, R3, 0xf000f, R4, 0xea, !PT ;
        /*0020*/                   HFMA2.MMA R5, R2, R6, R7 ;
        /*0030*/              @!P1 BRA `(.L_x_9) ;
.L_x_5:
.L_x_4:
        /*0040*/                   HADD2 R8, R2, -1024, -1024 ;
        /*0050*/               @P2 BRA `(.L_x_4) ;
        /*0060*/               @P0 BRA `(.L_x_3) ;
        /*0070*/                   EXIT ;
.L_x_9:
        /*0080*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8], R6 ;
        /*0090*/                   BRA `(.L_x_3) ;
"""


def test_sass_summary_counts_the_largest_loop_before_exit():
    s = sass_summary(SASS)
    assert s["instructions"] == 10
    assert s["opcodes"]["BRA"] == 4 and s["opcodes"]["HFMA2"] == 1 and s["opcodes"]["SYNCS"] == 1
    # loops: 0x10-0x60 (6 instructions) and 0x40-0x50; the stub's jump back from 0x90 is after EXIT
    assert s["loop"]["start"] == "0x10" and s["loop"]["end"] == "0x60" and s["loop"]["instructions"] == 6
    assert s["loop"]["opcodes"] == {"BRA": 3, "LOP3": 1, "HFMA2": 1, "HADD2": 1}
    # the branch at 0x30 leaves the loop (to the stub after EXIT): not a skip inside it
    assert s["loop"]["skips"] == []
    assert sass_summary("")["loop"] is None


def test_sass_summary_lists_forward_branches_inside_the_loop():
    sass = """
.L_x_1:
        /*0000*/                   ISETP.NE.AND P1, PT, R1, RZ, PT ;
        /*0010*/               @P1 BRA `(.L_x_2) ;
        /*0020*/                   FMNMX R2, R3, R4, !PT ;
        /*0030*/                   SHFL.BFLY PT, R5, R2, 0x4, 0x1f ;
        /*0040*/                   BRA `(.L_x_3) ;
.L_x_2:
        /*0050*/                   FADD R6, R6, R7 ;
.L_x_3:
        /*0060*/                   HGMMA.64x16x16.F32 R24, R36, gdesc[UR4], RZ, !UPT ;
        /*0070*/               @P0 BRA `(.L_x_1) ;
        /*0080*/                   EXIT ;
"""
    loop = sass_summary(sass)["loop"]
    assert loop["instructions"] == 8
    # the taken branch skips the 3-instruction redo block; the redo block's exit skips the 1-instruction keep
    assert loop["skips"] == [dict(at="0x10", instructions=3), dict(at="0x40", instructions=1)]


def test_ptxas_summary():
    report = """ptxas info    : Function properties for anonymous_mosaic_gpu_kernel
    0 bytes stack frame, 16 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 138 registers, used 2 barriers, 1 bytes smem"""
    assert ptxas_summary(report) == dict(registers=138, spill_store_bytes=16, spill_load_bytes=8)
    assert ptxas_summary("")["registers"] is None


@pytest.mark.parametrize("kernel", ["stream", "prefetch", "spin"])
def test_lower_knows_only_the_two_kernels(kernel):
    """Only the library's Mosaic kernels (decode, prefill) are lowered; the probes' kernels are gone."""
    with pytest.raises(ValueError, match="kernel must be 'decode' or 'prefill'"):
        _lower(kernel)
