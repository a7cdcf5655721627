"""Tests of verispec/drafters/templates.py: shipped templates and path validation."""

from __future__ import annotations

import pytest

from verispec.drafters.templates import (
    TEMPLATE_2_2_2,
    TEMPLATES,
    TreeTemplate,
    resolve_template,
)
from verispec.errors import ConfigError, TreeStructureError


def test_2_2_2_is_the_published_tree() -> None:
    """Template 2.2.2 has 80 nodes on 6 levels with 8/21/25/15/8/3 nodes per level."""
    t = resolve_template("2.2.2", 8)
    assert t.num_nodes == 80
    assert t.level_sizes == (8, 21, 25, 15, 8, 3)
    assert t.depth == 6
    assert len(set(TEMPLATE_2_2_2)) == 80
    assert max(max(p) for p in TEMPLATE_2_2_2) == 7


def test_2_2_2_is_stored_in_canonical_breadth_first_order() -> None:
    """The published list is already sorted by depth then lexicographically, so node i is path i."""
    t = resolve_template("2.2.2", 8)
    assert t.paths == TEMPLATE_2_2_2


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_shipped_template_is_prefix_closed(name: str) -> None:
    """Every proper prefix of every path of a shipped template is itself a path of it."""
    paths = set(TEMPLATES[name])
    for path in paths:
        for d in range(1, len(path)):
            assert path[:d] in paths, (name, path)


@pytest.mark.parametrize(
    ("name", "size", "levels"), [("8", 8, (8,)), ("16", 16, (8, 8)), ("32", 32, (8, 21, 3))]
)
def test_small_templates_are_breadth_first_prefixes_of_2_2_2(
    name: str, size: int, levels: tuple[int, ...]
) -> None:
    """The CPU templates are the first 8, 16, 32 nodes of 2.2.2 in breadth-first order."""
    t = resolve_template(name, 8)
    assert t.num_nodes == size
    assert t.paths == TEMPLATE_2_2_2[:size]
    assert t.level_sizes == levels
    assert resolve_template(size, 8).paths == t.paths


def test_parent_and_slot_arrays_describe_the_paths() -> None:
    """parents[i] is the index of paths[i] minus its last slot, slots[i] its last slot."""
    t = resolve_template("2.2.2", 8)
    for i, path in enumerate(t.paths):
        parent = int(t.parents[i])
        assert int(t.slots[i]) == path[-1]
        if len(path) == 1:
            assert parent == -1
        else:
            assert t.paths[parent] == path[:-1]
            assert parent < i


def test_user_paths_are_canonicalised() -> None:
    """A user's paths in any order are sorted by depth, then slot order within a parent."""
    t = TreeTemplate.from_paths([[1, 0], [0], [0, 1], [1], [0, 0]], k=2)
    assert t.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert t.parents.tolist() == [-1, -1, 0, 0, 1]
    assert t.laws[0] is not None and t.laws[3] is None


def test_first_n_nodes_is_a_valid_template() -> None:
    """Truncating a template in breadth-first order keeps it prefix-closed."""
    t = resolve_template("2.2.2", 8)
    for n in (1, 5, 29, 54, 79):
        assert t.first(n).paths == t.paths[:n]


@pytest.mark.parametrize(
    ("paths", "match"),
    [
        ([[0], [0, 1, 2]], r"\[0, 1, 2\] has no parent \[0, 1\]"),
        ([[0], [0]], r"\[0\] appears twice"),
        ([[0], []], "must not be empty"),
        ([[0], [8]], r"\[8\] has slot 8; slots must be in \[0, 8\)"),
        ([[0], [-1]], r"\[-1\] has slot -1"),
        ([], "at least one path"),
        ([[0], ["a"]], "integer slot indices"),
        ([[0], 3], "list of slot indices"),
    ],
)
def test_bad_templates_are_rejected_naming_the_path(paths: list, match: str) -> None:
    """An invalid template raises TreeStructureError whose message names the bad path."""
    with pytest.raises(TreeStructureError, match=match):
        resolve_template(paths, 8)


def test_unknown_template_name_is_a_config_error() -> None:
    """An unknown template name raises ConfigError listing the shipped names."""
    with pytest.raises(ConfigError, match=r"'2\.2\.2'"):
        resolve_template("2.2.3", 8)


def test_template_slot_must_fit_k() -> None:
    """A template slot at or above k; a smaller k is refused with a hint."""
    with pytest.raises(TreeStructureError, match=r"\[4\] has slot 4; slots must be in \[0, 4\)"):
        resolve_template("2.2.2", 4)
    resolve_template("8", 8)
    with pytest.raises(TreeStructureError, match="raise `k`"):
        resolve_template(resolve_template("8", 8), 4)
