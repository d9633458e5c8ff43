"""The result lines of one comparison script: "   " for a match, "!! " for a difference, and a closing verdict."""

from __future__ import annotations

from pathlib import Path


class Verdicts:
    """Collects result lines, prints each, and writes them with the verdict to a result file."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ok = True

    def report(self, line: str, good: bool = True) -> None:
        self.ok &= good
        self.lines.append(("   " if good else "!! ") + line)
        print(self.lines[-1], flush=True)

    def finish(self, title: str, path: Path) -> None:
        """Append the verdict line for `title` and write every line to `path`."""
        self.lines.append(f"{title}: " + ("ALL MATCH" if self.ok else "DIFFERENCES (marked !!)"))
        print(self.lines[-1])
        path.write_text("\n".join(self.lines) + "\n")
