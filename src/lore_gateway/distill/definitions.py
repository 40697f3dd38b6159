"""Where a symbol is defined, read from a numbered listing of source lines.

Agents find definitions with ``grep -n`` / ``rg -n`` (``path:line:text``, or
``line:text`` when one file is searched) and read files with ``cat -n`` / ``nl``
(``    12<TAB>text``). A line number is only worth keeping with its file, so the
file comes from the listing line when it names one, else from the command when
the command names exactly one source file, else it is ``?``.

The patterns are keyword-led (``def``, ``class``, ``function``, ``func``, ``fn``,
``interface``, ``type`` ...), so one table serves every language; the two that
are not (a TypeScript method, a Java method) need the file's extension or a
modifier to tell them from a call. Pure functions only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNKNOWN_PATH = "?"

# A source file named in a command: the extensions of the languages agents work in.
_SOURCE_EXT = (r"pyi?|[cm]?[jt]sx?|go|rs|java|kts?|scala|rb|php|cs|c|h|cc|cpp|hpp|swift|"
               r"lua|ex|exs|dart|vue|svelte")
_COMMAND_FILE_RE = re.compile(
    rf"(?<![\w/.@+-])((?:\.{{0,2}}/)?(?:[\w.@+-]+/)*[\w.@+-]+\.(?:{_SOURCE_EXT}))(?![\w/-])")
# ``sed -n 'A,Bp' file | grep -n`` numbers lines from A, not from 1.
_SED_RANGE_RE = re.compile(r"\bsed\s+-n\s+['\"]?(\d+),\d+p['\"]?\s+\S+\s*\|")
# ``tail`` or a ``sed`` expression other than a plain range: the numbers are not the file's.
_RENUMBERED_RE = re.compile(r"\btail\b[^|]*\||\bsed\b(?![^|]*-n\s+['\"]?\d+,\d+p)[^|]*\|")

# One line of a listing: grep/rg with the file (``path:line:text``, rg --column
# adds ``col:``), grep on one file (``line:text``), cat -n / nl (``  12<TAB>text``,
# a Read tool's ``  12→text``).
_GREP_RE = re.compile(r"^(?P<path>[^\s:]+\.\w+):(?P<line>\d+):(?:\d+:)?(?P<text>.*)$")
_BARE_RE = re.compile(r"^(?P<line>\d+)[:\t→](?P<text>.*)$")
_NUMBERED_RE = re.compile(r"^\s+(?P<line>\d+)[\t→](?P<text>.*)$")

_MODIFIERS = (r"(?:(?:public|private|protected|internal|abstract|final|sealed|static|open|data|"
              r"export|default|declare|pub(?:\([\w:]+\))?)\s+)*")
# Keyword-led definitions, any language: (pattern, prefix the name is shown with).
_DEFINITIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Python, Ruby: def name(
    (re.compile(r"^\s*(?:async\s+)?def\s+(?:self\.)?(?P<name>\w+)"), ""),
    # Python, TS/JS, Java, Kotlin, C#, Rust, Swift: class / interface / enum / struct / trait ...
    (re.compile(rf"^\s*(?:@\w+(?:\([^)]*\))?\s+)*{_MODIFIERS}"
                r"(?:class|interface|enum|record|struct|trait|union|object|@interface)\s+"
                r"(?P<name>[A-Za-z_]\w*)"), ""),
    # TS/JS: function name( / export default async function* name(
    (re.compile(r"^\s*(?:export\s+(?:default\s+)?)?(?:declare\s+)?(?:async\s+)?function\s*\*?\s*"
                r"(?P<name>[A-Za-z_$][\w$]*)"), ""),
    # TS/JS: const name = (…) => / = async x => / = function; any exported const or let.
    (re.compile(r"^\s*(?:export\s+)?(?:const|let|var)\s+(?P<name>[A-Za-z_$][\w$]*)\s*"
                r"(?::[^=]+)?=\s*(?:async\s+)?(?:function\b|\([^)]*\)\s*(?::[^=]+)?=>|"
                r"[A-Za-z_$][\w$]*\s*=>)"), ""),
    (re.compile(r"^\s*export\s+(?:const|let|var)\s+(?P<name>[A-Za-z_$][\w$]*)"), ""),
    # TS: type Name = …   (also Python 3.12's type alias)
    (re.compile(r"^\s*(?:export\s+)?(?:declare\s+)?type\s+(?P<name>[A-Za-z_]\w*)\s*(?:<[^>]*>)?\s*="),
     ""),
    # Go: func Name( / func (r *Recv) Name( ; type Name struct|interface|…
    (re.compile(r"^func\s+(?:\([^)]*\)\s*)?(?P<name>[A-Za-z_]\w*)"), ""),
    (re.compile(r"^type\s+(?P<name>[A-Za-z_]\w*)(?:\[[^\]]*\])?\s+(?!=)\S"), ""),
    # Rust: fn name / pub(crate) async unsafe fn name ; Kotlin: fun name
    (re.compile(r"^\s*(?:pub(?:\([\w:]+\))?\s+)?(?:(?:const|async|unsafe|extern\s+\"\w+\")\s+)*"
                r"fn\s+(?P<name>\w+)"), ""),
    (re.compile(r"^\s*(?:(?:public|private|internal|protected|override|suspend|inline|open)\s+)*"
                r"fun\s+(?:<[^>]+>\s*)?(?:\w+\.)?(?P<name>\w+)"), ""),
    # Rust: impl Trait for Type / impl<T> Type — named as written.
    (re.compile(r"^\s*impl(?:<[^>]*>)?\s+(?P<name>[\w:<>, ]+?(?:\s+for\s+[\w:<>]+)?)\s*"
                r"(?:where\b.*)?\{?\s*$"), "impl "),
    # Java/C#: modifiers, a return type, then name( — the modifiers tell it from a call.
    (re.compile(r"^\s*(?:@\w+\s+)*(?:(?:public|private|protected|static|final|abstract|"
                r"synchronized|native|default|override|virtual|async)\s+)+(?:<[^>]+>\s+)?"
                r"[\w<>\[\],.?]+\s+(?P<name>[A-Za-z_]\w*)\s*\("), ""),
)
# A TS/JS class method (``  name(args): T {``): only in a .ts/.js file, where a
# line shaped like that is a definition, not a call.
_METHOD_RE = re.compile(
    r"^\s+(?:(?:public|private|protected|static|async|readonly|override|abstract|get|set)\s+)*"
    r"(?!(?:if|for|while|switch|catch|function|return|constructor|else|do|try|with)\b)"
    r"(?P<name>[A-Za-z_$][\w$]*)\s*(?:<[^>]*>)?\([^)]*\)\s*(?::\s*[^{;=]+)?\{\s*$")
_SCRIPT_EXT_RE = re.compile(r"\.[cm]?[jt]sx?$")


# A signature longer than this is cut (a definition's name and parameters come first).
MAX_SIGNATURE_CHARS = 120


@dataclass(frozen=True, slots=True)
class Definition:
    name: str
    path: str  # UNKNOWN_PATH when neither the listing nor the command names the file
    line: int
    signature: str = ""  # the defining line as written (cut), without its indent

    def __str__(self) -> str:
        # As grep -n shows it: a later question quotes the signature, or the line.
        if self.signature:
            where = "" if self.path == UNKNOWN_PATH else f"{self.path}:"
            return f"{where}{self.line}:{self.signature}"
        return f"`{self.name}` at {self.path}:{self.line}"


@dataclass(frozen=True, slots=True)
class Listing:
    """What the command says about the listing's lines: their file and numbering."""

    path: str | None = None
    offset: int = 0  # added to each line number (``sed -n 'A,Bp' file | grep -n``)
    renumbered: bool = False  # numbers that are not the file's (tail, sed scripts)


def listing_of(command: str) -> Listing:
    """The one source file ``command`` names (if exactly one) and how it numbers lines."""
    paths = set(_COMMAND_FILE_RE.findall(command))
    path = paths.pop() if len(paths) == 1 else None
    sed = _SED_RANGE_RE.search(command)
    if sed:
        return Listing(path, int(sed.group(1)) - 1)
    return Listing(path, 0, bool(_RENUMBERED_RE.search(command)))


def definition(line: str, listing: Listing) -> Definition | None:
    """The definition one listing line shows, if any (test functions are not kept)."""
    grep = _GREP_RE.match(line.strip())
    if grep:
        path, number, text = grep.group("path"), int(grep.group("line")), grep.group("text")
    else:
        numbered = _NUMBERED_RE.match(line) or _BARE_RE.match(line.strip())
        if not numbered:
            return None
        text, number = numbered.group("text"), int(numbered.group("line")) + listing.offset
        path = (listing.path if listing.path and not listing.renumbered else UNKNOWN_PATH)
    name = _name(text, path if path != UNKNOWN_PATH else listing.path or "")
    if name is None or name.lower().startswith("test"):
        return None
    signature = " ".join(text.split())
    if len(signature) > MAX_SIGNATURE_CHARS:
        signature = signature[: MAX_SIGNATURE_CHARS - 1] + "…"
    return Definition(name, path, number, signature)


def _name(text: str, path: str) -> str | None:
    for pattern, prefix in _DEFINITIONS:
        found = pattern.match(text)
        if found:
            return prefix + " ".join(found.group("name").split())
    if _SCRIPT_EXT_RE.search(path):
        method = _METHOD_RE.match(text)
        if method:
            return method.group("name")
    return None
