"""Config and its knobs: the shared fields, the knobs each family declares, validation, the
stored JSON (old rows with every knob, new ones with those set), and a ground floor that
names no kind's knob, variant or op."""

from __future__ import annotations

import ast
import dataclasses
import json
import pickle
from pathlib import Path

import pytest

import epilab
from epilab.ir import config as config_mod
from epilab.ir.config import SHARED, Config, Knob, choices, config_text, declare, extend
from epilab.templates.registry import KINDS

# a row as every epilab before the kinds declared their knobs stored it: all 16 fields
OLD_ROW = {
    "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 4,
    "num_stages": 3, "variant": "tma", "EPILOGUE_SUBTILE": 2, "PROGRAMS_PER_SM": 1, "FLATTEN": 0,
    "WARP_SPECIALIZE": 0, "TMA_STORE": 1, "TILE_H": 1, "PROMOTE": 1, "SWAP_AB": 0,
}  # fmt: skip


def test_config_round_trip_and_every_choice_is_valid():
    c = Config(128, 64, 32, GROUP_M=4, num_warps=8, num_stages=4)
    assert Config.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    for name, values in choices().items():
        for v in values:
            Config.from_dict({**Config(16, 16, 16).to_dict(), name: v})


@pytest.mark.parametrize(
    "field,value",
    [
        ("BLOCK_M", 0),
        ("BLOCK_N", 100),
        ("BLOCK_K", "64"),
        ("GROUP_M", True),
        ("num_stages", 0),
        ("variant", "__import__('os')"),
        ("TILE_H", 3),
        ("SWAP_AB", True),
        ("PROMOTE", 1.0),
    ],
)
def test_config_rejects_values_outside_the_space(field, value):
    with pytest.raises(ValueError, match=f"{field}="):
        Config.from_dict({**Config(16, 16, 16).to_dict(), field: value})


def test_config_from_dict_needs_blocks_and_known_fields():
    with pytest.raises(ValueError, match="incomplete config"):
        Config.from_dict({"BLOCK_M": 16})
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['TILE_W'\]"):
        Config.from_dict({**Config(16, 16, 16).to_dict(), "TILE_W": 2})
    with pytest.raises(ValueError, match="unknown config field"):
        Config.from_dict({**Config(16, 16, 16).to_dict(), "knobs": [["TILE_H", 2]]})
    with pytest.raises(ValueError, match="unknown config field 'TILE_W'"):
        Config(16, 16, 16, TILE_W=2)
    assert not Config.is_valid([16, 16, 16])


def test_a_stored_row_reads_alike_with_every_knob_or_only_those_set():
    old = Config.from_dict(OLD_ROW)
    assert old.knobs == (("EPILOGUE_SUBTILE", 2), ("TMA_STORE", 1))
    assert old.to_dict() == {**{k: OLD_ROW[k] for k in SHARED}, "EPILOGUE_SUBTILE": 2, "TMA_STORE": 1}
    assert Config.from_dict(old.to_dict()) == old
    assert (old.TMA_STORE, old.EPILOGUE_SUBTILE, old.TILE_H, old.SWAP_AB) == (1, 2, 1, 0)
    assert config_text(old) == config_text(OLD_ROW) == "128x64x32 g8 w4 st3 tma sub2 tma-store"


def test_a_knob_at_its_default_is_no_knob_at_all():
    assert Config(64, 64, 16, TILE_H=1, SWAP_AB=0) == Config(64, 64, 16)
    assert hash(Config(64, 64, 16, TILE_H=1)) == hash(Config(64, 64, 16))
    assert Config(64, 64, 16, TILE_H=4) != Config(64, 64, 16, TILE_H=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config(64, 64, 16).TILE_H = 2  # type: ignore[misc]
    with pytest.raises(AttributeError, match="no field or declared knob 'TILE_W'"):
        _ = Config(64, 64, 16).TILE_W


def test_replace_repr_and_pickle_keep_the_knobs():
    c = Config(256, 16, 16, 1, num_warps=8, num_stages=1, TILE_H=16, variant="w_vector")
    assert dataclasses.replace(c, TILE_H=8).TILE_H == 8
    assert dataclasses.replace(c, TILE_H=1).knobs == ()
    assert dataclasses.replace(c, BLOCK_M=512) == Config(512, 16, 16, 1, 1, 8, 1, "w_vector", TILE_H=16)
    assert eval(repr(c), {"Config": Config}) == c
    assert pickle.loads(pickle.dumps(c)) == c
    assert config_text(c) == "256x16x16 g1 w8 st1 w_vector rows16"


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="default 3 is not one of"):
        Knob("DEPTH", (1, 2), 3, "depth{}")
    with pytest.raises(ValueError, match="ints or strings, all of one type"):
        Knob("DEPTH", (1, "2"), 1, "depth{}")
    with pytest.raises(ValueError, match="public identifier"):
        Knob("knobs", (0, 1), 0, "k")
    with pytest.raises(ValueError, match=r"would hide Config\.short"):
        declare(Knob("short", (0, 1), 0, "s"))
    with pytest.raises(ValueError, match="a field every config has"):
        declare(Knob("BLOCK_M", (16,), 16, "m{}"))
    with pytest.raises(ValueError, match="declared twice, differently"):
        declare(Knob("TILE_H", (1, 2), 1, "rows{}"))
    with pytest.raises(ValueError, match="takes str values"):
        extend("variant", (3,))
    with pytest.raises(ValueError, match="not a shared config field"):
        extend("TILE_H", (128,))
    assert declare(config_mod._KNOBS["TILE_H"])  # the same declaration again: a no-op


def test_each_kind_searches_and_seeds_declared_values_only():
    declared = choices()
    for kind in KINDS.values():
        for name, values in kind.space.items():
            assert set(values) <= set(declared[name]), (kind.name, name)
        for seed in (*kind.seeds, *(c for _, cs in kind.dtype_seeds for c in cs)):
            assert Config.from_dict(seed.to_dict()) == seed


def _code_words(path: Path) -> set[str]:
    """The names, attributes and strings of a module's code (its docstrings and comments left out)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node)
    }
    words = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            words.add(node.value)
    return words


def test_the_ground_floor_names_no_kinds_knob_variant_or_op():
    """ir/ holds what every kind shares; a kind's knobs, variants and ops are its own."""
    torch_ops = {"mm", "addmm", "bmm", "baddbmm", "matmul"}
    own = {name for name in choices() if name not in SHARED}
    own |= {v for v in choices()["variant"] if v != "default"}
    own |= {op for kind in KINDS.values() for op in (*kind.ops, *kind.takes)} - torch_ops
    assert own >= {"TILE_H", "SWAP_AB", "w_vector", "two_pass", "dual_mm", "grouped_mm", "conv2d"}
    ir = Path(epilab.__file__).parent / "ir"
    named = {path.name: sorted(own & _code_words(path)) for path in ir.glob("*.py")}
    assert {name: words for name, words in named.items() if words} == {}
