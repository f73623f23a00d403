"""One zoo model through the backend, checked against eager in float64 and against
Inductor's own error.

    outcome = run(Case("vgg", torch.bfloat16, channels_last=True, policy="mixed"), "tiny", "cpu")
    assert outcome.ok, outcome.describe()

A case compiles the model with ``backend="epilab"`` and runs it (three calls; the last
replays launches and, under ``reduce-overhead``, CUDA graphs), then compares every output
(and, for a training step, every parameter's gradient) with the same model and input in
float64 eager. Policies: ``always`` (every anchor on a template), ``mixed`` (``auto`` over
a database in which, anchor by anchor in graph order, the template wins, loses to its
baseline, wins, has no record: the mixed decisions of issue 15). The same model under
plain Inductor gives the error the backend may not exceed by more than 2x (above the
dtype's noise floor); the dtype's tolerance holds too, unless Inductor itself misses it.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
from records import record, record_slower_in_context

import epilab
from epilab.db import INTERPRETER_DEVICE, DeviceInfo, TuningDB
from epilab.ir.check import rel_error
from epilab.ir.dtypes import default_output_dtype
from epilab.ir.epilogue_print import readable
from epilab.ir.epilogue_text import parse_text
from epilab.ir.patterns import identity
from epilab.ir.problem import Problem
from epilab.templates.registry import default_config
from zoo import ZOO, Spec
from zoo.convnets import randomize_norms

# bound on ||out - ref|| / ||ref|| of a whole model against float64 eager, by dtype
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}
# below this the error is rounding noise: the "at most 2x Inductor's error" rule starts here
NOISE = {torch.float32: 1e-5, torch.bfloat16: 4e-3, torch.float16: 5e-4}
CALLS = 3
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def spec_of(size: str, model: str) -> Spec:
    """The zoo's model, or one built from a library (``zoo.libraries``), at ``size``."""
    from zoo.libraries import LIBRARY_ZOO

    spec = ZOO[size].get(model) or LIBRARY_ZOO[size].get(model)
    if spec is None:
        raise KeyError(f"no {size} model {model!r} in the zoo (or its library is not installed)")
    return spec


def is_image(model: str) -> bool:
    """Whether ``model`` takes an NCHW image (at any size)."""
    from zoo.libraries import TORCHVISION, TRANSFORMERS

    return any(
        model in z and z[model].image for zoo in (ZOO, TORCHVISION, TRANSFORMERS) for z in zoo.values()
    )


@dataclass(frozen=True)
class Case:
    model: str
    dtype: torch.dtype
    channels_last: bool = False
    policy: str = "always"  # always or mixed
    mode: str = "default"  # or reduce-overhead
    training: bool = False  # one forward and backward; gradients are checked too
    dynamic: bool = False  # the batch is dynamic: three batch sizes, no recompilation

    @property
    def id(self) -> str:
        parts = [self.model, DTYPE_NAMES[self.dtype]]
        parts += ["nhwc" if self.channels_last else "nchw"] if is_image(self.model) else []
        parts += [self.policy, self.mode, "train" if self.training else "eval"]
        return "-".join(parts + (["dynamic"] if self.dynamic else []))


@dataclass
class Outcome:
    case: Case
    device: str
    error: float  # the largest relative error of any output or gradient, over every call
    inductor_error: float
    templates: Counter = field(default_factory=Counter)  # template -> anchors replaced
    anchors: int = 0
    compile_s: float = 0.0
    kernels: int = 0  # templates Inductor launches as its own kernels (the rest: the custom op)
    unreadable: list[str] = field(default_factory=list)  # epilogue texts that do not read back

    @property
    def bound(self) -> float:
        """The dtype's tolerance, tightened to twice Inductor's error (above the noise floor);
        where Inductor itself misses the tolerance (a fp32 training step through cuDNN's
        convolution backward is ~3e-3 off float64 on an H100), twice Inductor's error."""
        tolerance, twice = TOLERANCE[self.case.dtype], max(2 * self.inductor_error, NOISE[self.case.dtype])
        return twice if self.inductor_error > tolerance else min(tolerance, twice)

    @property
    def ok(self) -> bool:
        return self.error <= self.bound

    @property
    def decisions(self) -> str:
        used = ", ".join(f"{t} {n}" for t, n in sorted(self.templates.items()))
        total = sum(self.templates.values())
        runs = f"; {self.kernels}/{total} as kernels" if total else ""
        return f"{total}/{self.anchors}" + (f" ({used}{runs})" if used else "")

    def describe(self) -> str:
        return (
            f"{self.case.id} on {self.device}: error {self.error:.3g} (bound {self.bound:.3g}; "
            f"Inductor {self.inductor_error:.3g}), templates {self.decisions}"
        )


def make(spec: Spec, case: Case, device: str, batch: int | None = None) -> tuple[nn.Module, torch.Tensor]:
    """The model (random weights, seeded) and one input, in the case's dtype and layout."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = randomize_norms(spec.build(), gen).to(device, case.dtype)
    model.train(case.training)
    return model, _input(spec, case, device, batch or spec.batch, gen)


def _input(spec: Spec, case: Case, device: str, batch: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn((batch, *spec.input_shape[1:]), generator=gen).to(device, case.dtype)
    return x.contiguous(memory_format=torch.channels_last) if case.channels_last else x


def _laid_out(model: nn.Module, case: Case) -> nn.Module:
    return model.to(memory_format=torch.channels_last) if case.channels_last else model


def _results(
    model: Callable, x: torch.Tensor, training: bool, params: list[nn.Parameter]
) -> list[torch.Tensor]:
    """The output, and for a training step the gradient of a fixed random projection of
    the output with respect to each parameter (cloned: CUDA graphs reuse their outputs)."""
    for p in params:
        p.grad = None
    with torch.set_grad_enabled(training):  # evaluation runs as inference does, without autograd
        out = model(x)
    results = [out.detach().clone()]
    if training:
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out.device)
        (out.float() * probe).sum().backward()
        results += [p.grad.detach().clone() for p in params if p.grad is not None]
    return results


def _error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    if len(got) != len(want):
        return float("inf")
    return max(rel_error(g, w) for g, w in zip(got, want, strict=True))


def _batches(case: Case, spec: Spec) -> list[int]:
    return [spec.batch, spec.batch + 1, 2 * spec.batch + 1] if case.dynamic else [spec.batch] * CALLS


def _compiled_error(
    spec: Spec, case: Case, device: str, compile_fn: Callable[[nn.Module], Callable]
) -> tuple[float, float]:
    """(max error over the calls, seconds of the first call) of the compiled model."""
    model, _ = make(spec, case, device)
    model = _laid_out(model, case)
    reference = copy.deepcopy(model).double()
    params = [p for p in model.parameters() if p.requires_grad]
    params64 = [p for p in reference.parameters() if p.requires_grad]
    fn = compile_fn(model)
    gen = torch.Generator().manual_seed(3)
    error, first_s = 0.0, 0.0
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # fp32 convolutions (and their backward) in fp32, as matmuls are
    try:
        for i, batch in enumerate(_batches(case, spec)):
            x = _input(spec, case, device, batch, gen)
            if case.dynamic and i == 0:
                torch._dynamo.mark_dynamic(x, 0)
            ref = _results(reference, x.double(), case.training, params64)
            start = time.perf_counter()
            if i == 0 or not case.dynamic:
                got = _results(fn, x, case.training, params)
            else:
                with torch.compiler.set_stance("fail_on_recompile"):  # a new batch must not recompile
                    got = _results(fn, x, case.training, params)
            if device == "cuda":
                torch.cuda.synchronize()
            if i == 0:
                first_s = time.perf_counter() - start
            error = max(error, _error(got, ref))
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    return error, first_s


def _options(policy: str, db: str, mode: str) -> dict:
    return {"policy": policy, "db": db, **({"mode": mode} if mode != "default" else {})}


def run(case: Case, size: str, device: str) -> Outcome:
    """Compile and check ``case`` at ``size`` on ``device``, against a fresh tuning database
    (``always``) or the mixed one of its model and layout (``mixed``, made once per process)."""
    spec = spec_of(size, case.model)
    db = mixed_db(spec, case, device) if case.policy == "mixed" else str(Path(_scratch()) / "empty.db")
    if case.policy != "mixed":
        Path(db).unlink(missing_ok=True)
    policy = "auto" if case.policy == "mixed" else case.policy
    torch._dynamo.reset()
    epilab.explain(clear=True)
    error, seconds = _compiled_error(
        spec,
        case,
        device,
        lambda m: torch.compile(m, backend="epilab", options=_options(policy, db, case.mode)),
    )
    decisions = epilab.explain(clear=True)
    torch._dynamo.reset()
    return Outcome(
        case,
        _device_name(device),
        error,
        inductor_error(spec, case, device),
        Counter(d.template for d in decisions if d.template),
        len(decisions),
        seconds,
        sum(1 for d in decisions if d.template and d.runs_as == "kernel"),
        _unreadable(decisions, db),
    )


def _unreadable(decisions: list, db: str) -> list[str]:
    """The decisions' epilogue texts (``Problem.epilogue_text``) that do not parse back to
    their problem's epilogue, as far as performance goes: every zoo model's epilogues round-trip."""
    bad = []
    with TuningDB.open(db) as store:
        for d in decisions:
            found = store.problem_json(d.problem_key) if d.problem_key else None
            if found is None:
                continue
            problem = Problem.from_json(found[1])
            dtype = default_output_dtype(problem.dtype)
            text = problem.epilogue_text()
            try:
                back = parse_text(text, dtype)
            except ValueError as e:
                bad.append(f"{text}: {e}")
                continue
            if identity(back) != identity(problem.epilogue) or readable(back, dtype) != text:
                bad.append(f"{text} reads back as {readable(back, dtype)}")
    return bad


_inductor_errors: dict[tuple, float] = {}


def inductor_error(spec: Spec, case: Case, device: str) -> float:
    """Plain Inductor's error on the case's model and inputs (default mode: CUDA graphs do
    not change its numbers); once per process for each model, dtype, layout and step."""
    key = (spec, device, dataclasses.replace(case, policy="", mode=""))
    if key not in _inductor_errors:
        torch._dynamo.reset()
        _inductor_errors[key], _ = _compiled_error(spec, case, device, torch.compile)
        torch._dynamo.reset()
    return _inductor_errors[key]


_mixed: dict[tuple, str] = {}


def mixed_db(spec: Spec, case: Case, device: str) -> str:
    """The database of ``mixed`` cases for the case's model, dtype, layout and step
    (``mix_records``), made once per process."""
    key = (spec, device, dataclasses.replace(case, mode=""))
    if key not in _mixed:
        path = Path(_scratch()) / f"mixed-{len(_mixed)}.db"
        mix_records(spec, case, device, str(path))
        _mixed[key] = str(path)
    return _mixed[key]


_scratch_dir: list[str] = []


def _scratch() -> str:
    """A folder for this process's databases (removed at exit)."""
    if not _scratch_dir:
        folder = tempfile.TemporaryDirectory(prefix="epilab-zoo-")
        atexit.register(folder.cleanup)
        _scratch_dir.append(folder.name)
    return _scratch_dir[0]


def mix_records(spec: Spec, case: Case, device: str, db: str) -> list[str]:
    """Compile once with policy auto (the backend records every problem it sees), then
    record, problem by problem in the graph order of their first anchors: a winning
    template, a template slower than its baseline and in the model (verdicts: a
    dequantize-then-mm's aten path has no baseline, ``Group.aten_dequantizes``), a winning
    template, nothing. An anchor
    whose problem came before gets that problem's fate (records are per problem: a Llama
    block's q and o projections are one problem, so fates given anchor by anchor would be
    overruled by the other's record). Returns what each anchor got."""
    torch._dynamo.reset()
    epilab.explain(clear=True)
    model, x = make(spec, case, device)
    fn = torch.compile(_laid_out(model, case), backend="epilab", options=_options("auto", db, "default"))
    _results(fn, x, case.training, [p for p in model.parameters() if p.requires_grad])
    decisions = epilab.explain(clear=True)
    info = DeviceInfo.of_cuda(torch.device(device)) if device == "cuda" else INTERPRETER_DEVICE
    target = "cuda" if device == "cuda" else "interpreter"
    fates = []
    with TuningDB.open(db) as store:
        texts = [store.problem_json(d.problem_key) if d.problem_key else None for d in decisions]
    given: dict[str, str] = {}  # a problem's fate, by its key
    for text in texts:
        if text is None:
            fates.append("unmatched")
            continue
        if text[0] in given:
            fates.append(given[text[0]])
            continue
        fate = given[text[0]] = ("wins", "loses", "wins", "missing")[len(given) % 4]
        fates.append(fate)
        if fate in ("wins", "loses"):
            problem = Problem.from_json(text[1])
            config = default_config(problem, target, sm_count=info.sm_count).to_dict()
            record(db, problem, config, *((1.0, 2.0) if fate == "wins" else (2.0, 1.0)), device=info)
            if fate == "loses":  # and slower in the model: a dequantize-then-mm has no baseline
                record_slower_in_context(db, problem, info, case.training)
    torch._dynamo.reset()
    return fates


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter)"
