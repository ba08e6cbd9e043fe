"""The documentation's promises that can be checked without TensorFlow: every relative link of
README.md and docs/*.md resolves to a file (and to a heading of it, where the link names one),
every `make TARGET` they name is a Makefile target, every module they name (`common.x.y`,
`common/x/y.py`) exists, and README.md stays a first page: at most 110 lines, none over 200
characters."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))

# [text](target) and ![alt](target); the target ends at whitespace or ')' (an optional "title" follows).
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# `make [VAR=value ...] target`: the target is the first word after make that is not an assignment.
MAKE = re.compile(
    r"(?:^|[\s;&|(])make((?:\s+[A-Za-z_][A-Za-z0-9_]*=\S*)*)\s+([a-z][A-Za-z0-9_.-]*)"
)
# A module of common/ named in prose: common.run.trainer, common/run/trainer.py (not a file such as
# mlperf_logging's common.yaml, nor a path inside another repository: a/common/x.py).
MODULE_NAME = re.compile(r"(?<![\w/.-])(common(?:\.[a-z_][a-z0-9_]*)+)\b(?!\.\w)")
MODULE_PATH = re.compile(r"(?<![\w/.-])(common(?:/[a-z_][a-z0-9_]*)+)(\.py\b|\.[A-Za-z_])")
FILE_SUFFIXES = {"yaml", "yml", "json", "md", "log", "txt", "sbatch", "def", "h5", "png"}
RULE = re.compile(r"^([A-Za-z0-9_.%-][A-Za-z0-9_.%\- ]*?)\s*:(?![=:])")


def relative_links(text):
    """(line number, target) of every link that is neither a URL nor a bare #anchor."""
    prose = FENCE.sub(
        lambda m: "\n" * m.group(0).count("\n"), text
    )  # links in code blocks are code
    for m in LINK.finditer(prose):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http(s), mailto, ... and anchors within the page
        yield prose.count("\n", 0, m.start()) + 1, target.split("#", 1)[0]


def links_with_anchors(text):
    """(line number, target file or "", anchor) of every relative link naming an anchor: [x](#a)
    within the page, [x](page.md#a) into another."""
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in LINK.finditer(prose):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        yield prose.count("\n", 0, m.start()) + 1, path, anchor


def heading_anchors(text):
    """The anchors GitHub gives a page's headings: lower case, punctuation but '-' and '_' dropped,
    spaces to '-', a repeated one suffixed -1, -2, ..."""
    seen, anchors = {}, set()
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def make_targets_named(text):
    """Every target of a `make ...` command in code: fenced blocks and inline code spans."""
    code = [m.group(0) for m in FENCE.finditer(text)]
    code += [m.group(1) for m in CODE_SPAN.finditer(FENCE.sub("", text))]
    found = set()
    for chunk in code:
        for line in chunk.splitlines():
            line = line.split(" #", 1)[0]  # a shell comment after the command
            found.update(m.group(2) for m in MAKE.finditer(line))
    return found


def missing_modules(text):
    """The module names and .py paths of the repository's packages in `text` that name no module.
    A dotted name may go on past the module into what it holds (common.run.steps.TrainStep): it is
    good when some prefix of it longer than the package alone is a module or a package."""
    missing = []
    for m in MODULE_NAME.finditer(text):
        parts = m.group(1).split(".")
        if parts[-1] in FILE_SUFFIXES:
            continue
        found = any(
            (ROOT.joinpath(*parts[:n]).with_suffix(".py")).is_file()
            or (ROOT.joinpath(*parts[:n]) / "__init__.py").is_file()
            for n in range(2, len(parts) + 1)
        )
        if not found:
            missing.append(m.group(1))
    for m in MODULE_PATH.finditer(text):  # common/run/trainer.py, or common/run/trainer.Trainer
        if not (ROOT / m.group(1)).with_suffix(".py").is_file():
            missing.append(m.group(1) + (".py" if m.group(2) == ".py" else ""))
    return missing


def rule_targets(lines):
    targets = set()
    for line in lines:
        if line.startswith(("\t", "#", " ")) or "=" in line.split(":", 1)[0]:
            continue
        m = RULE.match(line)
        if m:
            targets.update(t for t in m.group(1).split() if not t.startswith("."))
    return targets


def makefile_targets():
    """The targets of the Makefile's rules."""
    return rule_targets((ROOT / "Makefile").read_text().splitlines())


def test_readme_is_a_first_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 110, f"README.md has {len(lines)} lines; the manual belongs in docs/"
    long = [
        f"README.md:{i}: {len(line)} characters"
        for i, line in enumerate(lines, 1)
        if len(line) > 200
    ]
    assert not long, "lines over 200 characters:\n" + "\n".join(long)


def test_pages_exist():
    assert len(PAGES) > 1 and all(p.is_file() for p in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = [
        f"{page.relative_to(ROOT)}:{line}: {target}"
        for line, target in relative_links(page.read_text())
        if target and not (page.parent / target).exists()
    ]
    assert not broken, "links to nothing:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_anchors_resolve(page):
    broken = []
    for line, path, anchor in links_with_anchors(page.read_text()):
        target = (page.parent / path) if path else page
        if target.suffix != ".md" or not target.is_file():
            continue  # a missing file is test_relative_links_resolve's; anchors of other files unchecked
        if anchor not in heading_anchors(target.read_text()):
            broken.append(f"{page.relative_to(ROOT)}:{line}: {path}#{anchor}")
    assert not broken, "links to no heading:\n" + "\n".join(broken)


def test_makefile_targets_parsed():
    targets = makefile_targets()
    # shared ones and each benchmark's
    assert {
        "install",
        "test",
        "test-all",
        "bench",
        "run",
        "data",
        "run-deepcam",
        "bench-deepcam",
    } <= targets


def test_make_targets_named_exist():
    targets = makefile_targets()
    missing = sorted(
        f"{page.relative_to(ROOT)}: make {name}"
        for page in PAGES
        for name in make_targets_named(page.read_text())
        if name not in targets
    )
    assert not missing, "make targets the docs name but the Makefile lacks:\n" + "\n".join(missing)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_names_exist(page):
    missing = missing_modules(page.read_text())
    assert not missing, (
        f"{page.relative_to(ROOT)} names modules that do not exist: {sorted(set(missing))}"
    )


def test_checks_can_fail():
    """The checkers see a broken link and an unknown target."""
    text = "see [x](no/such/file.md) and ![img](gone.png), [ok](https://x.org) [a](#b)\n```\nmake frobnicate\n```\n"
    assert [t for _, t in relative_links(text)] == ["no/such/file.md", "gone.png"]
    assert make_targets_named(text) == {"frobnicate"}
    assert list(links_with_anchors(text)) == [(1, "", "b")]
    page = "# Title\n## What a run writes (`--output-dir`)\n## Tiers\n## Tiers\n```\n# not a heading\n```\n"
    assert heading_anchors(page) == {"title", "what-a-run-writes---output-dir", "tiers", "tiers-1"}
    assert "b" not in heading_anchors(page)
    assert make_targets_named("`VARIANT=gpu make install` and `make run NP=2`") == {
        "install",
        "run",
    }
    assert "frobnicate" not in makefile_targets()
    assert missing_modules(
        "common.launch, common/trainer.py and common/run_context.RunContext, not "
        "common.run.steps.TrainStep nor common/run/trainer.Trainer"
    ) == ["common.launch", "common/trainer.py", "common/run_context"]
