"""The matmul family's grower: mm, addmm, bmm, baddbmm, torch._scaled_mm and
torch._grouped_mm anchors, their fp8 weights and activations read through dequantize ops."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from epilab.compiler.aten_ops import ANCHORS, GROUPED_MM_ARGS, SCALED_MM_ARGS, Unsupported
from epilab.compiler.dequant import (
    BlockDequantized,
    Dequantized,
    block_dequantized,
    block_scales,
    dequantized,
)
from epilab.compiler.grow import (
    ANCHOR_DTYPES,
    FP8_DTYPES,
    GROUPED_OPS,
    UNROUNDED,
    Grower,
    NoGroup,
    Operand,
    dim_of,
    expr_of,
    fake_mode_of,
    is_static,
    same,
    same_shape,
    val,
)
from epilab.ir import dtypes
from epilab.ir.epilogue import Epilogue, Expr, acc, operand
from epilab.ir.problem import BATCHED_OPS, OperandSpec, Problem, Shape, applied_precision
from epilab.templates.gemm.ops import BLOCK_SCALED_OP, DUAL_OP, DUAL_WEIGHT_ONLY_OP, WEIGHT_ONLY_OP
from epilab.templates.gemm.weight_geometry import WEIGHT_ONLY_DTYPES, WEIGHT_SCALE, WeightGeometry
from epilab.templates.grouped.grouped_geometry import GroupedGeometry
from epilab.templates.registry import default_template, template_hash
from epilab.templates.runtime.binding import layout_of, operand_layout


class MatmulGrower(Grower):
    """mm, addmm, bmm, baddbmm: operands of the output's shape or broadcast along its rows or
    columns; views that split or merge rows join. An mm whose B is a dequantized fp8 weight
    (``dequantized``) reads the fp8 weight, its scale an epilogue operand per column: the
    weight-only kind, or with an A dequantized from fp8 too, the fp8 scaled mm of both."""

    takes_groups = True  # its kinds hold whole column groups (the matmul family's Triton loops)
    dequantizes = True  # an mm's B dequantized from fp8 is read as fp8 (weight-only)
    block_dequantizes = True  # ... and an mm of two block-dequantized fp8 inputs, block-scaled
    reads_fp8_activations = True  # ... and with its A dequantized too, the fp8 scaled mm
    weight_only = False

    def start(self) -> tuple[fx.Node, fx.Node]:
        a, b, value = self.take_anchor(self.anchor, acc(), "bias")
        self.values[self.anchor] = value
        self.shape_src[self.anchor] = None
        self.order.append(self.anchor)
        return a, b

    def take_anchor(self, node: fx.Node, leaf: Expr, bias_name: str) -> tuple[fx.Node, fx.Node, Expr]:
        """An anchor's A and B nodes and its value: ``leaf`` (its accumulator) scaled by alpha,
        plus its bias (an operand named ``bias_name``) scaled by beta, rounded to its dtype."""
        op = ANCHORS[node.target]  # type: ignore[index]
        if op == "scaled_mm":
            return self.take_scaled_mm(node, leaf)
        if op == "grouped_mm":
            return self.take_grouped_mm(node, leaf)
        args = list(node.args)
        kwargs = dict(node.kwargs)
        if op in ("addmm", "baddbmm"):
            bias, a, b = args[:3]
            beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
            alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
        else:
            (a, b), bias, beta, alpha = args[:2], None, 0, 1
        av, bv = val(a), val(b)
        if av is None or bv is None:
            raise NoGroup("an input has no shape information")
        if av.dtype not in ANCHOR_DTYPES or av.dtype != bv.dtype:
            raise NoGroup(f"inputs {av.dtype}/{bv.dtype}: the templates take float16, bfloat16, float32")
        out = val(node)
        if out is None or out.dtype != av.dtype:
            raise NoGroup(f"output dtype {getattr(out, 'dtype', None)} differs from the inputs' {av.dtype}")
        for name, x in (("alpha", alpha), ("beta", beta)):
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise NoGroup(f"{name}={x!r} is not a number")
        value: Expr = leaf
        blocks = self.block_dequantizes and op in ("mm", "addmm")
        weight_blocks = block_dequantized(b, "column") if blocks else None
        activation_blocks = block_dequantized(a, "row") if weight_blocks is not None else None
        if activation_blocks is not None and weight_blocks is not None:  # one fp8 dtype, as the kind reads
            xv, wv = val(activation_blocks.source), val(weight_blocks.source)
            if xv is None or wv is None or xv.dtype != wv.dtype:
                activation_blocks = None
        weight = dequantized(b, "column") if self.dequantizes and op in ("mm", "addmm") else None
        if weight_blocks is not None and activation_blocks is not None:
            a, b = self.take_block_dequantized(activation_blocks, weight_blocks)
        elif weight is not None and dtypes.name_of(av.dtype) in WEIGHT_ONLY_DTYPES:
            a, b, value = self.take_dequantized(a, weight, value, bias_name.removeprefix("bias"))
        value = value if alpha == 1 else value * float(alpha)
        if bias is not None and beta != 0:
            bias_expr = self.operand(bias, self.O, bias_name)
            value = value + (bias_expr if beta == 1 else bias_expr * float(beta))
        if av.dtype != torch.float32 and not node.meta.get(UNROUNDED):
            value = Expr("cast", (value,), (("dtype", dtypes.name_of(av.dtype)),))
        return a, b, value  # type: ignore[return-value]

    def take_dequantized(
        self, a: fx.Node, weight: Dequantized, value: Expr, suffix: str = ""
    ) -> tuple[fx.Node, fx.Node, Expr]:
        """An mm of a dequantized fp8 weight: read as fp8, its scale in the epilogue (per column,
        passed flat; ``weight_scale`` + ``suffix``: a dual group's second is ``weight_scale2``).
        Where A is dequantized from the same fp8 dtype too (per row), the group is the fp8
        scaled mm of both (``acc * scale_a * scale_b``, as ``torch._scaled_mm``); else the
        weight-only mm of the 16-bit A."""
        activation = dequantized(a, "row") if self.reads_fp8_activations else None
        xv, wv = (val(activation.source) if activation else None), val(weight.source)
        both = activation is not None and xv is not None and wv is not None and xv.dtype == wv.dtype
        if both:
            assert activation is not None
            self.aten_dequantizes = True
            a, self.a_reshape = activation.source, activation.reshape
            if activation.scale is not None:  # per row, passed as [M, 1] (or one element)
                sv = val(activation.scale)
                assert sv is not None
                broadcast, shape = ("scalar", (-1,)) if sv.numel() == 1 else ("col", (-1, 1))
                key = (activation.scale, shape)
                if key not in self.operands:
                    self.operands[key] = Operand("scale_a", activation.scale, broadcast, shape)
                value = value * operand(self.operands[key].name, broadcast)
        else:
            self.weight_only = True
        self.b_permute = weight.permute
        if weight.scale is not None:
            sv = val(weight.scale)
            assert sv is not None
            broadcast = "scalar" if sv.numel() == 1 else "row"
            key = (weight.scale, (-1,))
            if key not in self.operands:
                name = "scale_b" if both else WEIGHT_SCALE + suffix
                self.operands[key] = Operand(name, weight.scale, broadcast, (-1,))
            value = value * operand(self.operands[key].name, broadcast)
        return a, weight.source, value

    def take_block_dequantized(self, x: BlockDequantized, w: BlockDequantized) -> tuple[fx.Node, fx.Node]:
        """An mm of an activation and a weight both dequantized by block scales (one fp8
        dtype): the block-scaled mm of the fp8 tensors, A's scales [M, K/128] and B's
        [K/128, N/128] (the weight's [N/128, K/128] transposed) its extra inputs."""
        self.block_scaled, self.precision, self.aten_dequantizes = True, "ieee", True
        self.a_reshape, self.b_permute = x.reshape, w.permute
        self.extra = [x.scale, w.scale]
        self.extra_views = {
            0: (("reshape", x.scale_shape),),
            1: (("reshape", w.scale_shape), ("permute", [1, 0])),
        }
        return x.source, w.source

    def take_scaled_mm(self, node: fx.Node, leaf: Expr) -> tuple[fx.Node, fx.Node, Expr]:
        """``torch._scaled_mm``: ``acc * scale_a * scale_b (+ bias)``, rounded
        to its out_dtype; the scales are operands (one element, or per row of A / column of B),
        use_fast_accum the problem's precision."""
        given = dict(zip(SCALED_MM_ARGS, node.args, strict=False)) | dict(node.kwargs)
        a, b = given["self"], given["mat2"]
        av, bv, out = val(a), val(b), val(node)
        if av is None or bv is None or out is None:
            raise NoGroup("an input has no shape information")
        if av.dtype not in FP8_DTYPES or av.dtype != bv.dtype:
            raise NoGroup(
                f"scaled mm of {av.dtype}/{bv.dtype}: the templates take two fp8 inputs of one dtype"
            )
        if dtypes.name_or_none(out.dtype) not in dtypes.OUTPUT_DTYPES or out.dtype == torch.bool:
            raise NoGroup(f"scaled mm output dtype {out.dtype}")
        if given.get("scale_result") is not None:
            # torch 2.11 on an H100 returned the unscaled result (cuBLASLt, tensorwise, e4m3 out):
            # what the graph computes is not certain, so torch keeps it
            raise NoGroup("a scaled mm with scale_result (torch's result ignores it on some builds)")
        value = leaf
        accepted = {
            "scale_a": ("scalar", "col"),
            "scale_b": ("scalar", "row"),
            "bias": ("row",),
        }
        if block_scales(av, bv, val(given["scale_a"]), val(given["scale_b"])):
            # DeepSeek-V3's scales: A's [M, K/128], B's [K/128, N/128], multiplied in the K loop
            if av.dim() != 2 or not is_static(bv.shape):
                raise NoGroup("a block-scaled mm of 2-D A and a static B")
            self.block_scaled, self.extra = True, [given["scale_a"], given["scale_b"]]
            accepted = {"bias": ("row",)}
        for name, broadcasts in accepted.items():
            if given.get(name) is None:
                continue
            try:
                x = self.operand(given[name], self.O, name)
            except Unsupported as e:
                raise NoGroup(str(e)) from e
            broadcast = dict(x.attrs)["broadcast"]
            if broadcast not in broadcasts:
                raise NoGroup(f"{name} read per {broadcast}: a scaled mm takes {' or '.join(broadcasts)}")
            value = value + x if name == "bias" else value * x
        self.precision = "fast" if given.get("use_fast_accum") else "ieee"
        if out.dtype != torch.float32:
            value = Expr("cast", (value,), (("dtype", dtypes.name_of(out.dtype)),))
        return a, b, value  # type: ignore[return-value]

    def take_grouped_mm(self, node: fx.Node, leaf: Expr) -> tuple[fx.Node, fx.Node, Expr]:
        """``torch._grouped_mm`` of A [T, K] and B [E, K, N] with int32 offsets (the form a
        mixture of experts' projections take): ``acc`` rounded to its out_dtype; the offsets
        are the group's first extra input. Other forms (2-D B, 3-D A, a bias) stay with torch."""
        given = dict(zip(GROUPED_MM_ARGS, node.args, strict=False)) | dict(node.kwargs)
        a, b, offs = given["self"], given["mat2"], given.get("offs")
        av, bv, ov, out = val(a), val(b), val(offs), val(node)
        if av is None or bv is None or ov is None or out is None:
            raise NoGroup("a grouped mm without offsets or shape information")
        if av.dim() != 2 or bv.dim() != 3 or ov.dtype != torch.int32:
            raise NoGroup(
                f"a grouped mm of {av.dim()}-D A, {bv.dim()}-D B and {ov.dtype} offsets: the grouped "
                "templates take A [T, K], B [E, K, N] and int32 offsets"
            )
        if av.dtype not in ANCHOR_DTYPES or av.dtype != bv.dtype:
            raise NoGroup(f"inputs {av.dtype}/{bv.dtype}: the templates take float16, bfloat16, float32")
        if given.get("bias") is not None:
            raise NoGroup("a grouped mm with a bias")
        if dtypes.name_or_none(out.dtype) not in dtypes.OUTPUT_DTYPES or out.dtype == torch.bool:
            raise NoGroup(f"grouped mm output dtype {out.dtype}")
        if self.extra and self.extra[0] is not offs:
            raise NoGroup("the two grouped mms read different offsets")
        self.extra = [offs]
        value = (
            leaf
            if out.dtype == torch.float32
            else Expr("cast", (leaf,), (("dtype", dtypes.name_of(out.dtype)),))
        )
        return a, b, value  # type: ignore[return-value]

    def operand_broadcast(
        self, node: fx.Node, pad: list[object], S: Sequence[object]
    ) -> tuple[str, tuple[int, ...] | None]:
        one = [same(p, 1) for p in pad]
        reshape: tuple[int, ...] | None = None
        if same_shape(S, self.O):
            if all(one):
                broadcast = "scalar"
            elif one[-2]:
                broadcast = "row"
            elif one[-1]:
                broadcast = "col"
            else:
                broadcast = "tile"
        else:  # S splits or merges the output's rows: pass the operand in the output's shape
            last = -1 if one[-1] else int(expr_of(self.O[-1])) if is_static(self.O[-1:]) else None
            if last is None:
                raise Unsupported("a symbolic N after a view")
            if all(one[:-1]):
                broadcast, reshape = ("scalar" if one[-1] else "row"), (-1,)
            elif all(not o for o in one[:-1]):
                if len(self.O) == 3 and not is_static(self.O[:1]):
                    raise Unsupported("a symbolic batch after a view")
                lead = [-1] if len(self.O) == 2 else [int(expr_of(self.O[0])), -1]
                broadcast, reshape = ("col" if one[-1] else "tile"), (*lead, 1 if one[-1] else last)
            else:
                raise Unsupported(f"operand {node.name} broadcasts over part of the rows")
        return broadcast, reshape

    def problem(
        self, a: fx.Node, b: fx.Node, operands: list[Operand], epilogue: Epilogue, precision: str
    ) -> Problem:
        op = BLOCK_SCALED_OP if self.block_scaled else "mm" if self.op == "scaled_mm" else self.op
        if self.weight_only:
            op = DUAL_WEIGHT_ONLY_OP if op == DUAL_OP else WEIGHT_ONLY_OP
        av, bv = val(a), val(b)
        assert av is not None and bv is not None
        if self.b_permute is not None:
            with fake_mode_of(bv):
                bv = torch.ops.aten.permute.default(bv, list(self.b_permute))
        if self.a_reshape is not None:
            with fake_mode_of(av):
                av = torch.ops.aten.reshape.default(av, self.a_reshape)
        if op in GROUPED_OPS:
            return self.grouped_problem(av, bv, operands, epilogue)
        if not self.weight_only and av.dtype != bv.dtype:  # else the kind's bind refuses it at run time
            raise NoGroup(f"A of {av.dtype} and B of {bv.dtype}: the {op} kinds read one dtype")
        batched = op in BATCHED_OPS
        if av.dim() != (3 if batched else 2) or bv.dim() != av.dim():
            raise NoGroup(f"{op} inputs of {av.dim()} and {bv.dim()} dims")
        sa = [dim_of(d) for d in av.shape]
        sb = [dim_of(d) for d in bv.shape]
        stride_a = [dim_of(d) for d in av.stride()]
        stride_b = [dim_of(d) for d in bv.stride()]
        shape = Shape(sa[0] if batched else 1, sa[-2], sb[-1], sa[-1])
        problem = Problem(
            op=op,
            template=default_template(op),
            template_hash=template_hash(default_template(op), epilogue),
            dtype=dtypes.name_of(av.dtype),
            layout_a=layout_of(sa[-2:], stride_a[-2:]),
            layout_b=layout_of(sb[-2:], stride_b[-2:]),
            operands=operand_specs(operands),
            epilogue=epilogue,
            shape=shape,
            precision=applied_precision(dtypes.name_of(av.dtype), self.precision or precision),
            geometry=WeightGeometry(dtypes.name_of(bv.dtype)) if self.weight_only else None,
        )
        return storable(problem)

    def grouped_problem(
        self, av: torch.Tensor, bv: torch.Tensor, operands: list[Operand], epilogue: Epilogue
    ) -> Problem:
        """A grouped (or dual grouped) problem: A [T, K], B [E, K, N], the experts static."""
        if not is_static(bv.shape):
            raise NoGroup("a grouped mm's B (its experts, K and N) must be static")
        e, k, n = (int(expr_of(d)) for d in bv.shape)
        try:
            geometry = GroupedGeometry(e, **self.routing)  # type: ignore[arg-type]
        except ValueError as err:
            raise NoGroup(str(err)) from err
        problem = Problem(
            op=self.op,
            template=default_template(self.op),
            template_hash=template_hash(default_template(self.op), epilogue),
            dtype=dtypes.name_of(av.dtype),
            layout_a=layout_of([dim_of(d) for d in av.shape], [dim_of(d) for d in av.stride()]),
            layout_b=layout_of([k, n], [dim_of(d) for d in bv.stride()[1:]]),
            operands=operand_specs(operands),
            epilogue=epilogue,
            shape=Shape(1, dim_of(av.shape[0] if self.rows is None else self.rows), n, k),
            geometry=geometry,
        )
        return storable(problem)


def operand_specs(operands: list[Operand]) -> tuple[OperandSpec, ...]:
    """Each operand's dtype and layout as the kernel reads it (after its reshape, if any)."""
    specs = []
    for o in operands:
        ov = val(o.node)
        assert ov is not None
        sizes, strides = list(ov.shape), list(ov.stride())
        if o.reshape is not None:
            with fake_mode_of(ov):
                moved = torch.ops.aten.reshape.default(ov, list(o.reshape))
            sizes, strides = list(moved.shape), list(moved.stride())
        layout = operand_layout(o.broadcast, [dim_of(d) for d in sizes], [dim_of(d) for d in strides])
        specs.append(OperandSpec(o.name, str(dtypes.name_or_none(ov.dtype)), layout))
    return tuple(specs)


def storable(problem: Problem) -> Problem:
    """``problem``, which the database must read back as it is."""
    try:
        if Problem.from_json(problem.to_json()) != problem:
            raise ValueError("differs after a JSON round trip")
    except ValueError as e:
        raise NoGroup(f"the shape {problem.shape} cannot be stored ({e})") from e
    return problem
