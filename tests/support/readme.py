"""The README's first example, as the tests that run it read it."""

from __future__ import annotations

from . import ROOT

PAYMENTS = """
class payment_api:  # the payment service the example calls, answering at once
    @staticmethod
    async def charge(order: dict, key: str, timeout: float) -> dict:
        return {"charged": order["id"], "key": key}
"""


def first_example() -> str:
    """The code of the README's section "A workflow in plain Python"."""
    section = (ROOT / "README.md").read_text().split("## A workflow in plain Python", 1)[1]
    # The fence names its file (```python title="shop.py"```): the code starts on the next line.
    return section.split("```python", 1)[1].split("\n", 1)[1].split("```", 1)[0]
