"""Every Python sample of the docs runs, as a reader would run it: the fenced ```python
blocks of docs/**/*.md and README.md, read from the Markdown at each run (never copied here).

A page's samples run in a new folder, in their order on the page:

- a block titled with a file name (```python title="shop.py"```) is written to that file,
  later blocks of the same title appended to it (a page builds its module step by step);
- when such a module declares `app = ...`, a real `stepwarden worker MODULE:app` runs for the
  page, on the SQLite file the module names (relative: inside the folder);
- a module with an `if __name__ == "__main__":` block is then run as a script, and the
  page's untitled blocks are run one after another as one script (each builds on the ones
  before it), while the worker runs.

A block that cannot run alone says so where the reader sees it: its title starts with
`fragment:` and gives the reason (```python title="fragment: REASON"```). At most one in ten
Python samples may be a fragment."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cli.helpers import STEPWARDEN, process_env

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
FENCE = re.compile(
    r"^(?P<indent> *)```python(?P<info>[^\n]*)\n(?P<code>.*?)^(?P=indent)```", re.M | re.S
)
TITLE = re.compile(r'title="(?P<title>[^"]*)"')
FILE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.py$")
FRAGMENT = "fragment:"


@dataclass
class Sample:
    line: int
    title: str
    code: str


@dataclass
class Page:
    path: Path
    samples: list[Sample] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))


def read_page(path: Path) -> Page:
    text = path.read_text()
    page = Page(path)
    for match in FENCE.finditer(text):
        title = TITLE.search(match["info"])
        indent = len(match["indent"])
        code = "".join(line[indent:] + "\n" for line in match["code"].splitlines())
        line = text.count("\n", 0, match.start()) + 1
        page.samples.append(Sample(line, title["title"] if title else "", code))
    return page


def all_samples() -> list[tuple[Page, Sample]]:
    return [(page, s) for page in map(read_page, PAGES) for s in page.samples]


def test_at_most_one_sample_in_ten_is_a_fragment() -> None:
    samples = all_samples()
    fragments = [f"{p.name}:{s.line}" for p, s in samples if s.title.startswith(FRAGMENT)]
    assert len(samples) >= 30, len(samples)  # the finder finds them
    assert len(fragments) * 10 <= len(samples), fragments
    for page, sample in samples:
        if sample.title.startswith(FRAGMENT):
            assert sample.title[len(FRAGMENT) :].strip(), f"{page.name}:{sample.line}: no reason"
        else:
            assert not sample.title or FILE.match(sample.title), (page.name, sample.title)


@pytest.mark.parametrize(
    "page", [p for p in map(read_page, PAGES) if p.samples], ids=lambda p: p.name
)
def test_the_samples_of_a_page_run(page: Page, tmp_path: Path) -> None:
    modules: dict[str, str] = {}
    script = []
    for sample in page.samples:
        if sample.title.startswith(FRAGMENT):
            continue
        where = f"# {page.name}, line {sample.line}\n"
        if sample.title:
            modules[sample.title] = modules.get(sample.title, "") + where + sample.code
        else:
            script.append(where + sample.code)
    for name, code in modules.items():
        (tmp_path / name).write_text(code)
    apps = [name[:-3] for name, code in modules.items() if re.search(r"^app = ", code, re.M)]
    runs = [name for name, code in modules.items() if '__name__ == "__main__"' in code]
    if script:
        (tmp_path / "samples.py").write_text("".join(script))
        runs.append("samples.py")
    log_path = tmp_path / "worker.log"
    workers = []
    with log_path.open("wb") as log:
        try:
            for module in apps[:1]:
                workers.append(
                    subprocess.Popen(
                        [STEPWARDEN, "worker", f"{module}:app", "--drain-timeout", "5"],
                        cwd=tmp_path,
                        env=process_env(),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            for run in runs:
                done = subprocess.run(
                    [sys.executable, run],
                    cwd=tmp_path,
                    env=process_env(),
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert done.returncode == 0, (
                    f"{page.name}: {run} failed\n{done.stdout}\n{done.stderr}\n"
                    f"worker:\n{log_path.read_text()[-4000:]}"
                )
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(timeout=60)
    for worker in workers:
        assert worker.returncode == 0, log_path.read_text()[-4000:]
