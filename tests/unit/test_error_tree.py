"""The error tree drawn in ``errors``' docstring is the class hierarchy.

Goal: a reader learns every error shmlog raises, and who is at fault, from one drawing;
a class added without its line (or moved under another parent) fails here.

Method: read the drawing's lines (``├── Name`` or ``└── Name``, four columns a level),
rebuild each name's parent from the indentation, and compare that with every
``ShmlogError`` subclass the module defines and its first base.
"""

from __future__ import annotations

import inspect
import re

from shmlog.common import errors

BRANCH = re.compile(r"^(?P<indent>[ │]*)[├└]── (?P<name>\w+)")


def drawn_parents(docstring: str) -> dict[str, str]:
    """{class name: its parent's name} as the drawing shows them."""
    lines = docstring.splitlines()
    root_line = next(line for line in lines if line.strip() == "ShmlogError")
    margin = len(root_line) - len(root_line.lstrip())
    path = ["ShmlogError"]
    parents = {}
    for line in lines:
        found = BRANCH.match(line[margin:])
        if found is None:
            continue
        depth = len(found["indent"]) // 4 + 1
        del path[depth:]
        parents[found["name"]] = path[depth - 1]
        path.append(found["name"])
    return parents


def test_the_drawing_is_read_as_drawn():
    drawing = """
        ShmlogError
        ├── A
        │   ├── B
        │   │   └── C   a comment
        │   └── D
        └── E
    """
    assert drawn_parents(drawing) == {"A": "ShmlogError", "B": "A", "C": "B", "D": "A",
                                      "E": "ShmlogError"}


def test_every_error_is_drawn_under_its_parent():
    classes = {name: value for name, value in vars(errors).items()
               if inspect.isclass(value) and issubclass(value, errors.ShmlogError)
               and value is not errors.ShmlogError}
    assert len(classes) > 50
    actual = {name: value.__bases__[0].__name__ for name, value in classes.items()}
    assert drawn_parents(errors.__doc__) == actual
