"""The problem ops of the gemm family's own kinds, beside torch's (mm, addmm, bmm, baddbmm,
matmul): each kind runs its own (``TemplateKind.ops``), the compiler's matcher makes them."""

from __future__ import annotations

DUAL_OP = "dual_mm"  # ep(A @ B, A @ B2): two GEMMs of one A (dual_matmul.py)
# ep(sum over 128-K groups of scale_a * scale_b * the group's A @ B): fp8 with block scales, A's
# per row and 128 of K, B's per 128x128 block (DeepSeek-V3's; block_scaled.py)
BLOCK_SCALED_OP = "block_scaled_mm"
# ep(A @ B) of a float16 / bfloat16 A and an fp8 B (a weight stored in fp8, its scales in the
# epilogue), B converted to A's dtype in the K loop (weight_only.py)
WEIGHT_ONLY_OP = "weight_only_mm"
DUAL_WEIGHT_ONLY_OP = "dual_weight_only_mm"  # ep(A @ B, A @ B2) of two fp8 weights (a gated MLP's)
WEIGHT_ONLY_OPS = (WEIGHT_ONLY_OP, DUAL_WEIGHT_ONLY_OP)
MATRIX_OPS = ("mm", "addmm", DUAL_OP, BLOCK_SCALED_OP, *WEIGHT_ONLY_OPS)  # 2-D: no batch at all
