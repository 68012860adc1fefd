"""Text servelab did not write, printed inert (issue 11 item 8).

Model ids (from --model or from the server), server answers and error bodies, engine log lines, cell and run
names and file paths reach the terminal. A terminal obeys what it is sent: ESC sequences clear the screen, OSC
sets the window title or plants hyperlinks, a carriage return overwrites a line, bidi overrides reorder what is
shown. And rich reads `[bold]` in a string as markup. So every such text goes through one of:

- `inert(text)`: control characters (C0 but for tab and newline where allowed, DEL, C1), and the Unicode line
  separators and bidi controls, shown as visible escapes (`\\x1b`, `\\u202e`); the text is otherwise unchanged;
- `inert_markup(text)`: the same, with rich markup escaped, for a text placed inside a markup string;
- `visible(text)`: `inert(text, multiline=True)` for the files servelab writes for people (issue 27): the HTML
  report, CSV exports and JUnit XML show `\\x1b` where a server sent ESC, so `cat report.html` in a terminal runs
  nothing. The raw records (records.jsonl.gz, the store, JSON exports) keep the text as received;
- `InertConsole`: a rich Console that does the first to every piece of text it writes (rich's own cursor
  controls, for live displays, are kept): what a call site forgets is still shown inert.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rich.console import Console
from rich.markup import escape
from rich.segment import Segment

# C0 controls but tab and newline, DEL, C1 controls; line/paragraph separators; bidi embeddings, overrides and
# isolates, and the LRM/RLM marks.
_UNSAFE_MULTILINE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_UNSAFE_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def inert(text: object, *, multiline: bool = False) -> str:
    """`text` with every character a terminal would act on shown as an escape (`\\x1b[2J` is printed as those
    six characters). One line unless `multiline` (then newlines and tabs are kept)."""
    s = text if isinstance(text, str) else str(text)
    return (_UNSAFE_MULTILINE if multiline else _UNSAFE_ONE_LINE).sub(_visible, s)


def visible(text: object) -> str:
    """Text for a file people read (HTML, CSV, JUnit): every control character but tab and newline shown as an
    escape, as the terminal shows it. One helper for every such writer."""
    return inert(text, multiline=True)


def inert_markup(text: object, *, multiline: bool = False) -> str:
    """`inert(text)` with rich markup escaped: safe inside a string printed with markup (`[bold]` stays text)."""
    return escape(inert(text, multiline=multiline))


class InertConsole(Console):
    """A Console whose written text can never carry a control sequence: every segment of text (not rich's own
    control segments: cursor moves of a live display) is passed through `inert(multiline=True)`."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(inert(segment.text, multiline=True), segment.style, None)
            for segment in buffer)
