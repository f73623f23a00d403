"""``templates/tools/sass.py`` on hand-written ``cuobjdump -sass`` text: the controls decoded from the
high words, the innermost wgmma loops found (not the loops around them, not the retry stubs
after EXIT), and an instruction before a loop's last wgmma that waits for a load of the same
iteration reported (one after it, or one before the load, is not)."""

from __future__ import annotations

from epilab.templates.tools.sass import NO_SCOREBOARD, instructions, main_loops


def _controls(write: int = NO_SCOREBOARD, wait: int = 0) -> int:
    return ((NO_SCOREBOARD << 8) | (write << 5) | (wait << 11)) << 41


def _dump(code: list[tuple[str, int]]) -> str:
    """(text, high word) -> the two lines cuobjdump prints for each instruction."""
    lines = ["        Function : kernel"]
    for i, (text, high) in enumerate(code):
        lines.append(f"        /*{16 * i:04x}*/                   {text} ;   /* 0x000000000000{i:04x} */")
        lines.append(f"                                                            /* 0x{high:016x} */")
    return "\n".join(lines)


def _kernel(order: str = "load use mma") -> str:
    """An outer loop around an inner one whose body is a load, its use and a wgmma in ``order``,
    then EXIT and a retry stub branching back into the inner loop."""
    parts = {
        "load": ("LDG.E R4, desc[UR4][R2.64]", _controls(write=3)),
        "use": ("FMUL R5, R4, R4", _controls(wait=1 << 3)),
        "mma": ("QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24, gsb0", _controls()),
    }
    body = [parts[name] for name in order.split()]
    return _dump(
        [
            ("MOV R1, c[0x0][0x28]", _controls()),  # 0x00: the outer loop's head
            ("IADD3 R2, R2, 0x4, RZ", _controls()),  # 0x10: the inner loop's head
            *body,  # 0x20 - 0x40
            ("@P0 BRA 0x10", _controls()),  # 0x50
            ("@P1 BRA 0x0", _controls()),  # 0x60: the outer loop
            ("EXIT", _controls()),  # 0x70
            ("BRA 0x20", _controls()),  # 0x80: a retry stub, back into the inner loop
        ]
    )


def test_controls_are_read_from_the_high_word():
    code = instructions(_kernel())
    assert [i.opcode for i in code[:5]] == ["MOV", "IADD3", "LDG", "FMUL", "QGMMA"]
    assert code[2].write_scoreboard == 3 and code[2].wait_mask == 0
    assert code[3].write_scoreboard == NO_SCOREBOARD and code[3].wait_mask == 1 << 3
    assert code[4].is_mma and not code[3].is_mma


def test_the_innermost_wgmma_loop_and_what_waits_for_its_loads():
    (loop,) = main_loops(instructions(_kernel()))
    assert (loop.start, loop.end, loop.instructions) == (0x10, 0x50, 5)
    assert loop.opcodes == {"IADD3": 1, "LDG": 1, "FMUL": 1, "QGMMA": 1, "BRA": 1}
    (wait,) = loop.waits_on_loads
    assert wait.startswith("0x0030 FMUL R5, R4, R4 waits for 0x0020 LDG.E")


def test_a_use_after_the_last_wgmma_holds_up_nothing():
    (loop,) = main_loops(instructions(_kernel("load mma use")))
    assert loop.waits_on_loads == ()


def test_a_use_before_the_load_waits_for_the_previous_iteration():
    """Consumed at the top of the next step (earlier in the body than the load): hidden."""
    (loop,) = main_loops(instructions(_kernel("use load mma")))
    assert loop.opcodes["LDG"] == 1 and loop.waits_on_loads == ()
