"""The README's tables of fixes and of reports looked at, generated from the known-bug data.

Each table sits between ``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated: NAME -->``
lines; ``readme`` rewrites what is between them, ``readme --check`` exits 1 when the README
differs from what the data gives (a test runs it, so the two cannot drift apart).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ..known.catalogue import Catalogue, KnownBug, link_name, load_catalogue
from ..known.explain import broken_on

__all__ = ["fixes_table", "looked_at_table", "render", "run_readme"]

_BLOCK = re.compile(r"(<!-- BEGIN generated: (\S+) -->\n)(.*?)(<!-- END generated: \2 -->)", re.S)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _links(bug: KnownBug) -> str:
    return ", ".join(f"[{link_name(u)}]({u})" for u in bug.links) or "found here"


def _gpu_ids(gpu_doc: Path) -> set[str]:
    """The fixes whose tests ran on a GPU, as docs/gpu.md records them (``ran-on-gpu: id, id``)."""
    if not gpu_doc.is_file():
        return set()
    found: set[str] = set()
    for m in re.finditer(r"^ran-on-gpu:\s*(.+)$", gpu_doc.read_text(encoding="utf-8"), re.M):
        found.update(i.strip().strip("`") for i in m.group(1).split(","))
    return found


def fixes_table(catalogue: Catalogue, gpu: set[str]) -> str:
    rows = ["| id | bug | what you see without it | broken on torch | GPU |", "| --- | --- | --- | --- | --- |"]
    for bug in catalogue.fixes():
        assert bug.patch is not None and bug.patch.main is not None  # a fix is made from its patch's main file
        fields = bug.patch.main.fields
        seen = fields.get("Symptom", bug.title)
        quoted = [_signature_text(s) for s in bug.patch.main.errors if not s.startswith("re:")]
        if quoted:
            seen += " (*" + "*; *".join(quoted) + "*)"
        rows.append(
            f"| `{bug.id}` | {_links(bug)} | {_cell(seen)} | {_cell(broken_on(bug))} | {'yes' if bug.id in gpu else ''} |"
        )
    return "\n".join(rows) + "\n"


def _signature_text(line: str) -> str:
    return line.split(" | ")[0].strip()


def looked_at_table(catalogue: Catalogue) -> str:
    rows = ["| report | what you may see | measured | verdict |", "| --- | --- | --- | --- |"]
    for bug in catalogue.looked_at():
        entry = bug.entry
        verdict = entry["verdict"]
        if entry.get("workaround"):
            verdict += f". Workaround: {entry['workaround']}"
        rows.append(
            f"| {_links(bug)}: {_cell(bug.title)} (`{bug.id}`) | {_cell(entry['seen'])} | {_cell(entry['measured'])} | {_cell(verdict)} |"
        )
    return "\n".join(rows) + "\n"


def render(readme: str, catalogue: Catalogue, gpu: set[str]) -> str:
    tables = {"fixes": fixes_table(catalogue, gpu), "looked-at": looked_at_table(catalogue)}

    def fill(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in tables:
            raise ValueError(f"README: unknown generated block {name!r}")
        return m.group(1) + tables[name] + m.group(4)

    return _BLOCK.sub(fill, readme)


def run_readme(readme: Path, patches: Path, *, check: bool) -> int:
    text = readme.read_text(encoding="utf-8")
    new = render(text, load_catalogue(patches), _gpu_ids(readme.parent / "docs" / "gpu.md"))
    if check:
        if new != text:
            print(f"{readme}: its tables differ from the data (patches/*.patch, {patches.name}/looked-at.toml); run "
                  "`python -m torch_overlay.tools readme`", file=sys.stderr)
            return 1
        return 0
    if new != text:
        readme.write_text(new, encoding="utf-8")
        print(f"{readme}: tables regenerated")
    return 0
