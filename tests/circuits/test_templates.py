"""circuits.templates: every operation has its templates in three styles; malformed templates are refused."""

import pytest

from circuits.templates import Template, get_templates


def test_at_least_twelve_templates_per_operation_in_three_styles():
    for op in "+-*/":
        templates = get_templates(op)
        assert len(templates) >= 12
        assert {t.style for t in templates} == {"equation", "statement", "question"}


def test_template_without_operand_marker_is_rejected():
    with pytest.raises(ValueError, match=r"\{B\} exactly once"):
        Template("bad", "+", "equation", "{A} [+] = ")
    with pytest.raises(ValueError, match="mark its operator"):
        Template("bad", "+", "equation", "{A} + {B} = ")
