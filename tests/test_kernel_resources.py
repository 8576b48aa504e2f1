"""The static cost model of tools/kernel_resources.py on hand-written SASS loops, against rates worked out from
the H100/H200 datasheet by hand: 989 TFLOP/s dense bf16 = 132 SMs x 1.83 GHz x 4,096 FLOPs, i.e. 2,048
multiply-adds per clock per SM; 16 MUFU results per clock per SM; 4 warp instructions issued per clock; 128
bytes per clock through shared memory. (The model before counted 4,096 multiply-adds and no mma.sync.)"""
import importlib.util
import os
import sys

import pytest

pytest.importorskip("triton")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("kernel_resources", os.path.join(ROOT, "tools", "kernel_resources.py"))
kernel_resources = importlib.util.module_from_spec(spec)
sys.modules["kernel_resources"] = kernel_resources
spec.loader.exec_module(kernel_resources)


def test_tensor_cores_at_the_datasheet_rate_wgmma_and_mma_sync():
    # One warpgroup (4 warps) issues one HGMMA.64x64x16 per warp: 64·64·16 = 65,536 multiply-adds, 32 clocks at
    # 2,048 per clock. Per score element of a 64 x 64 tile: 16 multiply-adds, 1/128 clock of tensor cores.
    loop = ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24"]
    cost = kernel_resources.loop_cost(loop, warps=4, elements=64 * 64)
    assert cost["tensor MACs"] == pytest.approx(16)
    assert cost["unit cycles"]["tensor"] == pytest.approx(16 / 2048)
    # mma.sync: one warp's m16n8k16 (2,048 multiply-adds), at half of wgmma's rate: 2 clocks of the SM's tensor
    # cores per instruction; one warp, a 16 x 8 tile: 16 multiply-adds and 2/128 clock per element
    cost = kernel_resources.loop_cost(["HMMA.16816.F32.BF16 R4, R8, R12, R4"], warps=1, elements=16 * 8)
    assert cost["tensor MACs"] == pytest.approx(16)
    assert cost["unit cycles"]["tensor"] == pytest.approx(2 / 128)
    # tf32 runs at half the bf16 rate
    tf32 = kernel_resources.loop_cost(["HGMMA.64x64x8.F32.TF32 R24, gdesc[UR8], R24"], warps=4, elements=64 * 64)
    assert tf32["unit cycles"]["tensor"] == pytest.approx(2 * 8 / 2048)


def test_mufu_operations_at_16_per_clock_and_issue_at_4_instructions():
    # 32 MUFU.EX2 per warp over a warp's 32 x 32 elements: one MUFU operation per element, 1/16 clock each;
    # 33 instructions issued by one warp, 4 per clock
    loop = ["MUFU.EX2 R1, R2"] * 32 + ["BRA 0x10"]
    cost = kernel_resources.loop_cost(loop, warps=1, elements=32 * 32)
    assert cost["MUFU ops"] == pytest.approx(1.0)
    assert cost["unit cycles"]["xu"] == pytest.approx(1 / 16)
    assert cost["unit cycles"]["issue"] == pytest.approx(33 / 1024 / 4)
    assert cost["bound"] == "xu" and cost["cycles"] == pytest.approx(1 / 16)


def test_opcodes_per_score_element_and_thread():
    # 4 warps over a 64 x 64 tile: each thread holds 32 elements, so 64 FADD per warp are 2 per element and thread;
    # a predicate guard does not change the opcode, a warpgroup instruction counts once per warp
    loop = ["FADD R1, R2, R3"] * 64 + ["@!P0 MUFU.EX2 R1, R2"] * 32 + ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24"]
    opcodes = kernel_resources.loop_cost(loop, warps=4, elements=64 * 64)["opcodes"]
    assert opcodes == pytest.approx({"FADD": 2.0, "MUFU.EX2": 1.0, "HGMMA.64x64x16.F32.BF16": 1 / 32})
    assert list(opcodes)[0] == "FADD"  # most frequent first


def test_shared_memory_traffic_bounds_ldmatrix_heavy_loops():
    # ldmatrix.x4 moves four 8 x 8 16-bit matrices (512 bytes) per warp instruction: 4 clocks at 128 bytes; a
    # spill store of 64 bits per lane 256 bytes; a wgmma with both operands in shared memory reads A (64 x 16) and
    # B (64 x 16) in bf16, a quarter per warp; with A in registers only B
    assert kernel_resources.shared_bytes("LDSM.16.M88.4") == 512
    assert kernel_resources.shared_bytes("STL.64") == 256
    assert kernel_resources.shared_bytes("HGMMA.64x64x16.F32.BF16", "R24, gdesc[UR8], R24") == (64 * 16 * 2) * 2 / 4
    assert kernel_resources.shared_bytes("HGMMA.64x64x16.F32.BF16", "R24, R56, gdesc[UR8].tnspB, R24") == 64 * 16 * 2 / 4
    cost = kernel_resources.loop_cost(["LDSM.16.M88.4 R0, [R1]"] * 8, warps=1, elements=64)
    assert cost["unit cycles"]["shared"] == pytest.approx(8 * 512 / 128 / 64)
    assert cost["bound"] == "shared"


def test_sass_loops_are_backward_branches():
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   MUFU.EX2 R2, R3 ;
        /*0020*/                   FADD R2, R2, R2 ;
        /*0030*/               @P0 BRA 0x10 ;
        /*0040*/                   EXIT ;
    """
    assert kernel_resources.sass_loops(sass) == [["MUFU.EX2 R2, R3", "FADD R2, R2, R2", "@P0 BRA 0x10"]]


def test_window_tile_counts_by_hand_at_8192():
    # 128 query tiles of 64 rows over 128 key tiles of 64: full causal attention visits the 128·129/2 = 8,256 tiles
    # on and below the diagonal, 128 of them masked (the diagonal). A window of 1,024 keys: query tile m sees key
    # tiles m - 16 ... m (its first row's window starts at 64m - 1023, inside tile m - 16), m + 1 of them for
    # m < 16: 136 + 112·17 = 2,040 tiles, masked the 128 diagonal ones and the 112 cut by the window's start.
    assert kernel_resources.tile_counts(8192, None, 64, 64) == (8256 - 128, 128)
    assert kernel_resources.tile_counts(8192, 1024, 64, 64) == (2040 - 240, 240)
    # GRAPE-AP's key-major kernel also masks the tiles that hold a row's window start (its ψ is in no bias): the last
    # row of query tile m, t = 64m + 63, starts its window at 64(m - 15), the first key of tile m - 15, for the 113
    # query tiles m = 15 ... 127
    assert kernel_resources.tile_counts(8192, 1024, 64, 64, path=True) == (2040 - 240 - 113, 240 + 113)


def test_window_tile_counts_match_the_tile_geometry():
    # Visited: some query of the tile sees some key of it; unmasked: every query sees every key (and, with path,
    # every ψ of the tile is in the row's path sum: keys from t - window + 2). Brute force over small shapes.
    def brute(T, window, block_m, block_n, path):
        unmasked = masked = 0
        for q0 in range(0, T, block_m):
            for k0 in range(0, T, block_n):
                pairs = [(t, j) for t in range(q0, min(q0 + block_m, T)) for j in range(k0, min(k0 + block_n, T))]
                sees = [j <= t and (window is None or j > t - window) for t, j in pairs]
                whole = [j <= t and (window is None or j > t - window + path) for t, j in pairs]
                if any(sees):
                    unmasked, masked = (unmasked + 1, masked) if all(whole) else (unmasked, masked + 1)
        return unmasked, masked
    for T in (37, 64):
        for window in (None, 1, 2, 15, 16, 17, 40, 100):
            for block_m, block_n in ((16, 16), (32, 16), (16, 32)):
                for path in (False, True):
                    assert kernel_resources.tile_counts(T, window, block_m, block_n, path=path) == \
                        brute(T, window, block_m, block_n, path), (T, window, block_m, block_n, path)
