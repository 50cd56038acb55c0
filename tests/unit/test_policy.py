import pytest

from execbox.errors import CodeBlockedError
from execbox.policy import AstPolicy


@pytest.fixture
def policy():
    return AstPolicy()


@pytest.mark.parametrize("code,name,line", [
    ("import subprocess", "subprocess", 1),
    ("x = 1\nimport ctypes.util", "ctypes", 2),
    ("from socket import socket", "socket", 1),
    ("import os\nos.system('id')", "os.system", 2),
    ("import os as o\n\no.system('id')", "os.system", 3),
    ("from os import system as run\nrun('id')", "os.system", 2),
    ("import shutil\nshutil.rmtree('/')", "shutil.rmtree", 2),
    ("eval('1+1')", "eval", 1),
    ("def f():\n    exec('x=1')", "exec", 2),
])
def test_blocks_with_line(policy, code, name, line):
    with pytest.raises(CodeBlockedError) as ei:
        policy.check(code)
    assert ei.value.code == "SB007"
    assert ei.value.details["name"] == name
    assert ei.value.details["line"] == line
    assert f"line {line}" in ei.value.message


@pytest.mark.parametrize("code", [
    "import pandas as pd\ndf = pd.DataFrame({'a': [1]})\ndf = df.rename(columns={'a': 'b'})",
    "lst = [1, 2]\nlst.remove(1)",
    "d = {}\nd.pop('x', None)",
    "import os\nprint(os.path.join('a', 'b'))",
    "class A:\n    def system(self): pass\nA().system()",
    "s = 'abc'\ns.replace('a', 'b')",
    "def eval_model(x): return x\neval_model(1)",
    "this is not python",
])
def test_does_not_flag_ordinary_code(policy, code):
    policy.check(code)


def test_custom_lists():
    p = AstPolicy.from_config(["requests"], ["print"])
    with pytest.raises(CodeBlockedError):
        p.check("import requests")
    with pytest.raises(CodeBlockedError):
        p.check("print(1)")
    p.check("import subprocess")
