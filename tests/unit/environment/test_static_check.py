"""The (advisory) static check against bypass variants: each line below reaches a builtin, a
module or the object graph in a way the old check missed or could miss, and must be refused with
a reason naming it; ordinary environment code must still pass. The check cannot be complete --
that is why the report says it is advisory and the kernel layers contain the code
(test_hostile_envs.py) -- but every variant here is closed."""

from __future__ import annotations

import pytest

from services.environment.validation import static_check

DOC = '"""' + "A module docstring long enough for the check. " * 6 + '"""\n'
HEADER = DOC + "import dataclasses\nimport enum\nimport functools\nimport operator\nimport random\nimport typing\n" \
               "import pydantic\n"


def source(line: str) -> str:
    body = "\n    ".join(line.splitlines())
    return HEADER + f"\n\ndef solve(seed):\n    {body}\n    return []\n"


BYPASSES = [
    # the report's 12 __builtins__ variants and their relatives
    ('__builtins__["__import__"]("os")', "use of __builtins__"),
    ('__builtins__.__import__("os")', "use of __builtins__"),
    ('__builtins__.get("__import__")("os")', "use of __builtins__"),
    ('getattr(__builtins__, "__import__")("os")', "use of __builtins__"),
    ('b = __builtins__\nb["eval"]("1")', "use of __builtins__"),
    ('__builtins__["ev" + "al"]("1")', "use of __builtins__"),
    ('import builtins\nbuiltins.__import__("os")', "import of builtins"),
    ("from builtins import __import__", "import from builtins"),
    ('globals()["__builtins__"]', "call of globals()"),
    ('vars(random)["_os"]', "call of vars()"),
    ('locals()', "call of locals()"),
    ('f = eval\nf("1")', "use of eval"),
    ('__import__("os")', "call of __import__()"),
    # object-graph walks
    ("().__class__.__mro__[1].__subclasses__()", "access to __class__"),
    ("().__class__.__base__.__subclasses__()", "access to __class__"),
    ("type(()).__mro__", "access to __mro__"),
    ("object.__subclasses__()", "access to __subclasses__"),
    ('(lambda: 0).__globals__["__builtins__"]', "access to __globals__"),
    ("solve.__globals__", "access to __globals__"),
    ('random.__dict__["_os"]', "access to __dict__"),
    ("solve.__code__", "access to __code__"),
    ('type.__getattribute__(random, "_os")', "access to __getattribute__"),
    ("try:\n    1 / 0\nexcept Exception as e:\n    e.__traceback__.tb_frame.f_globals", "access to __traceback__"),
    ("(x for x in ()).gi_frame.f_globals", "access to the attribute gi_frame"),
    ("match ():\n    case object(__class__=c):\n        pass", "class pattern on __class__"),
    # modules held by allowed modules
    ('random._os.system("id")', "access to the attribute _os"),
    ('dataclasses.sys.modules["os"]', "access to the attribute sys"),
    ('enum.bltns.__import__("os")', "access to the attribute bltns"),
    ("typing.sys", "access to the attribute sys"),
    ("from trace_common.env import registry\nregistry.importlib", "access to the attribute importlib"),
    # names built from strings
    ('getattr(random, "_o" + "s")', "getattr(): the attribute name is built at run time"),
    ('getattr(random, "_os")', "attribute '_os' is not allowed"),
    ('getattr(solve, "__globals__")', "attribute '__globals__' is not allowed"),
    ('name = "_os"\ngetattr(random, name)', "built at run time"),
    ('getattr(self, f"__{x}")', "built at run time"),
    ('x = "__cl" + "ass__"', "half a dunder name"),
    ('"{0.__class__}".format(1)', "names __class__"),
    ('operator.attrgetter("_os")(random)', "access to the attribute attrgetter"),
    ('functools.partial(getattr, random)("_os")', "getattr used as a value"),
    ('typing.get_type_hints(solve)', "access to the attribute get_type_hints"),
    # strings that pydantic / typing evaluate
    ('pydantic.TypeAdapter(pydantic.ImportString).validate_python("os.system")', "attribute ImportString"),
    ("from pydantic import ImportString", "importing the name ImportString"),
    ('x: "__import__(\'os\').system(\'id\')" = 1', "in a string annotation: call of __import__()"),
    ('class M(pydantic.BaseModel):\n    x: "int.__class__"', "in a string annotation: access to __class__"),
    ('def f(a: "list[__builtins__]"):\n    pass', "in a string annotation: use of __builtins__"),
    # imports (as before)
    ("import os", "import of os"),
    ("from subprocess import run", "import from subprocess"),
    ("from . import x", "relative imports"),
]


@pytest.mark.parametrize(("line", "fragment"), BYPASSES, ids=[b[0][:40] for b in BYPASSES])
def test_bypass_variant_is_refused_with_its_reason(line, fragment):
    check = static_check(source(line))
    assert not check.passed and fragment in check.reason, check.reason
    assert "advisory" in check.details["advisory"]


FINE = [
    "x = random.Random(seed).randrange(10)",
    "class A:\n    def __init__(self):\n        super().__init__()\n        self._x = getattr(self, 'name', None)",
    "class A:\n    def call(self, role):\n        return getattr(self, f'_{role}')",
    'if __name__ == "__main__":\n    pass',
    'def f():\n    """Calls __init__ of the base, see __name__."""\n    return type(1).__name__',
    "x: typing.Optional[int] = None",
    "x: 'int' = 1",
    "d = dataclasses.field(default=1)",
]


@pytest.mark.parametrize("line", FINE, ids=[f[:40] for f in FINE])
def test_ordinary_code_passes(line):
    check = static_check(source(line))
    assert check.passed, check.reason
