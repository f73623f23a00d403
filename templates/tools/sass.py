"""Reading a kernel's SASS (``cuobjdump -sass``, sm_70 and later): its instructions with their
scheduling controls, and its main loops.

Each instruction is printed as two 64-bit words; the high word's top 23 bits are the controls
ptxas set (stall cycles, yield, the scoreboard a variable-latency instruction such as a load
signals when its result is written, the scoreboards the instruction waits for, operand reuse).
``main_loops`` finds the innermost loops that issue wgmma, and in each the instructions up to
its last wgmma that wait for a global load issued earlier in the same iteration: a load whose
latency is not hidden, as it holds up that iteration's MMAs (RESULTS.md, 2026-11-29: the
block-scaled kernel's scales). ``templates/tools/cross.py`` reports them for a compiled kernel.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]{16}) \*/")
_HIGH_WORD = re.compile(r"^\s+/\* (0x[0-9a-f]{16}) \*/")
_OPCODE = re.compile(r"^(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")
_BRANCH = re.compile(r"\bBRA (0x[0-9a-f]+)")
NO_SCOREBOARD = 7
# a wgmma's operands: "D, A, B, ..." with A a register (R24) or a descriptor (gdesc[UR4])
_REGISTER_A = re.compile(r"GMMA\S*\s+R\d+,\s*R\d+,")


@dataclass(frozen=True)
class Instruction:
    address: int
    text: str  # as cuobjdump prints it, without the ``;``
    opcode: str  # LDG, QGMMA, FFMA, ... (the predicate and modifiers left out)
    write_scoreboard: int  # the scoreboard its result signals (NO_SCOREBOARD: none)
    wait_mask: int  # bit i: it waits for scoreboard i

    @property
    def is_mma(self) -> bool:
        return self.opcode.endswith("GMMA")  # HGMMA, QGMMA, IGMMA: warpgroup MMAs


@dataclass(frozen=True)
class Loop:
    """An innermost loop that issues wgmma: its size, opcodes, the instructions up to its
    last wgmma that wait for a global load of the same iteration, and where each global load
    is issued against the iteration's wgmma: "before" the first, "under" them (up to the wait
    for them: the load's latency overlaps tensor-core work) or "after" that wait."""

    start: int
    end: int
    instructions: int
    opcodes: dict[str, int]
    waits_on_loads: tuple[str, ...]
    load_places: tuple[str, ...] = ()
    register_a_mmas: int = 0  # wgmma whose left operand is in registers (not a shared-memory descriptor)
    mma_waits: int = 0  # waits for wgmma (WARPGROUP.DEPBAR): one beside each where ptxas serializes them


def instructions(sass: str) -> list[Instruction]:
    """The instructions of ``cuobjdump -sass`` output, in order."""
    found = []
    lines = sass.splitlines()
    for i, line in enumerate(lines[:-1]):
        m = _INSTRUCTION.match(line)
        high = _HIGH_WORD.match(lines[i + 1]) if m else None
        if m is None or high is None:
            continue
        controls = int(high.group(1), 16) >> 41
        text = m.group(2).strip()
        opcode = _OPCODE.match(text)
        found.append(
            Instruction(
                address=int(m.group(1), 16),
                text=text,
                opcode=opcode.group(1) if opcode else text,
                write_scoreboard=(controls >> 5) & 7,
                wait_mask=(controls >> 11) & 0x3F,
            )
        )
    return found


def main_loops(code: list[Instruction]) -> list[Loop]:
    """The innermost loops (a branch back, its body from the target) that issue wgmma. Loops
    whose body holds an EXIT are left out: the out-of-line retries of barrier waits after a
    kernel's exit branch back into the code before it."""
    index = {ins.address: i for i, ins in enumerate(code)}
    spans = []
    for i, ins in enumerate(code):
        target = _BRANCH.search(ins.text)
        if target is None or int(target.group(1), 16) >= ins.address:
            continue
        first = index.get(int(target.group(1), 16))
        body = code[first : i + 1] if first is not None else []
        if any(x.is_mma for x in body) and not any(x.opcode == "EXIT" for x in body):
            spans.append((first, i))
    innermost = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    return [_loop(code[a : b + 1]) for a, b in innermost]


def _loop(body: list[Instruction]) -> Loop:
    last_mma = max(i for i, ins in enumerate(body) if ins.is_mma)
    waiting = []
    for i, load in enumerate(body[:last_mma]):
        if not load.opcode.startswith("LDG") or load.write_scoreboard == NO_SCOREBOARD:
            continue
        for later in body[i + 1 : last_mma + 1]:
            if later.wait_mask >> load.write_scoreboard & 1:
                waiting.append(f"{later.address:#06x} {later.text} waits for {load.address:#06x} {load.text}")
                break
    first_mma = min(i for i, ins in enumerate(body) if ins.is_mma)
    waits = (i for i, ins in enumerate(body) if i > last_mma and ins.text.startswith("WARPGROUP.DEPBAR"))
    waited = next(waits, len(body))
    return Loop(
        start=body[0].address,
        end=body[-1].address,
        instructions=len(body),
        opcodes=dict(Counter(ins.opcode for ins in body)),
        waits_on_loads=tuple(waiting),
        load_places=tuple(
            "before" if i < first_mma else "under" if i < waited else "after"
            for i, ins in enumerate(body)
            if ins.opcode.startswith("LDG")
        ),
        register_a_mmas=sum(1 for ins in body if ins.is_mma and _REGISTER_A.search(ins.text)),
        mma_waits=sum(1 for ins in body if ins.text.startswith("WARPGROUP.DEPBAR")),
    )
